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
