"""SQL agent tasks in the style of AgentBench's DBBench: a sandboxed SQLite environment, the
DBBench turn protocol and answer checks, the DBBench loader and a procedural task generator.

    env = SQLEnv(SQLEnvConfig())
    task = ProceduralSQLTasks(seed=0).sample()          # or load_dbbench("dev.jsonl")[0]
    first_message = env.reset(task)                     # system message: env.system_prompt
    observation, reward, done, info = env.step("Action: Operation\\n```sql\\nSELECT 1;\\n```")

Modules: `sandbox` (the database and safe execution), `protocol` (parsing turns, prompt text),
`checking` (answer and table-hash checks), `tasks` (SQLTask, DBBench loader), `procedural`
(generated single-skill tasks), `env` (SQLEnv).
"""

from ...envs.registry import register_env
from ..registry import register_generator, register_test_file_format
from .checking import answers_match, normalise_value, parse_answer_md5, table_md5
from .env import SQLEnv, SQLEnvConfig
from .procedural import SKILLS, ProceduralSQLTasks, build_task, is_heldout
from .protocol import Action, parse_action, render_task, system_prompt
from .sandbox import InProcessSandbox, Sandbox, SandboxLimits, Table, quote_identifier, quote_literal
from .tasks import SQLTask, group_by_skill, load_dbbench

__all__ = ["Action", "InProcessSandbox", "ProceduralSQLTasks", "SKILLS", "SQLEnv", "SQLEnvConfig", "SQLTask", "Sandbox",
           "SandboxLimits", "Table", "answers_match", "build_task", "group_by_skill", "is_heldout",
           "load_dbbench", "normalise_value", "parse_action", "parse_answer_md5", "quote_identifier",
           "quote_literal", "render_task", "system_prompt", "table_md5"]


def _sql_task(config, *, tokenizer, **_):
    """The SQL agent's task: procedural tasks (or DBBench files) played in the `sql` section's environment."""
    from ...common.errors import ConfigError
    from .agent_task import SQLAgentTask

    if tokenizer is None:
        raise ConfigError("env.id=sql needs a Hugging Face policy's tokenizer (model.type=hf)")
    e, t = config.env, config.task
    return SQLAgentTask(tokenizer, config.sql, train_file=t.train_file, test_file=t.test_file,
                        max_new_tokens=t.max_new_tokens, max_context=e.max_context, max_turns=e.max_turns,
                        step_timeout_s=e.step_timeout_s or None, workers=e.workers)


@register_env("sql", help="the DBBench-style SQL agent over a sandboxed SQLite (options: the sql section)",
              section="sql", options=SQLEnvConfig, task=_sql_task)
def _sql_env(config, **_):
    """Plain SQL environments over the `sql` section's procedural tasks (what `_sql_task` plays)."""
    from .agent_task import SQLEpisodes, sql_tasks

    o = config.sql if config is not None else SQLEnvConfig()
    train, heldout = sql_tasks(o)
    return lambda: SQLEpisodes(o, train, heldout)


def _check_dbbench(path, config) -> None:
    load_dbbench(path)


def _dbbench_row(task, i: int) -> tuple:
    sql = task.tasks[i]
    return sql.description, list(sql.label), sql.skill


@register_test_file_format("dbbench", keys=("description", "label", "table"), check=_check_dbbench, row=_dbbench_row)
def _dbbench_file(config, *, tokenizer, test_file, max_new_tokens):
    """DBBench records {description, label, table, type}: multi-turn episodes in the `sql` section's sandbox,
    correct when the answer (or the table) matches."""
    from .agent_task import SQLAgentTask

    e = config.env
    return SQLAgentTask(tokenizer, config.sql, n_train=0, test_file=str(test_file), max_new_tokens=max_new_tokens,
                        max_context=e.max_context, max_turns=e.max_turns)


def _demo_problems(config) -> list[str]:
    rounds = config.sql.max_rounds
    return [] if rounds >= 2 else [f"data.generate=sql-demos plays 2 turns (a query, then the answer): sql.max_rounds "
                                   f"must be >= 2, got {rounds}"]


@register_generator("sql-demos", sizes=(240, 24), uses=("data",), check=_demo_problems, preset="sql-agent-smollm2",
                    help="solved SQL agent episodes as {messages} rows (procedural training tasks only), played in "
                         "the config's sql section (`lmrl data --config PRESET`; data.generate: seeded by run.seed)")
def _sql_demos(out_dir, n_train, n_test, *, seed=0, config=None, **_):
    from .demonstrations import write_demo_splits

    options = config.sql if config is not None else SQLEnvConfig()
    seed = config.run.seed if config is not None else seed
    return write_demo_splits(out_dir, n_train, n_test, options, seed=seed, skills=options.skill_names())
