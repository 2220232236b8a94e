"""Tasks: where prompts come from and how completions are scored, each registered by name with its
traits (see `lmrl.tasks.registry`); data generators likewise.

Imports are lazy, so a light module (e.g. `math_reward`, which reward worker processes import)
does not pull in torch through this package: each task's module is imported by its builder."""

from __future__ import annotations

from ..common.data import SOURCE_KEY
from ..common.errors import ConfigError
from . import sql as _sql  # noqa: F401  (registers the SQL agent's environment, env.id=sql, and sql-demos)
from .registry import (GENERATORS, TASKS, TEST_FILE_FORMATS, DataGenerator, TaskSpec, TestFileFormat, build_task,
                       ensure_data, ensure_files, generators_for, register_generator, register_task,
                       register_test_file_format, task_spec, test_file_format)


# -- the arithmetic tasks: the built-in GPT, labels for the warm-up ----------------------------------------
def _arithmetic_check(config) -> list[str]:
    from .arithmetic import config_problems

    return config_problems(config)


def _arithmetic_task(config, **_):
    from .arithmetic import ArithmeticTask

    t = config.task
    return ArithmeticTask(name=t.name, ndigit=t.ndigit, use_format=t.use_format, reverse_answer=t.reverse_answer,
                          reward=t.reward, heldout_size=t.heldout_size, scratchpad=t.scratchpad)


for _name, _help in (("addition", "n-digit addition, e.g. 123+456=975 (answer reversed)"),
                     ("multiplication", "n-digit multiplication, optionally with a scratchpad")):
    register_task(_name, help=_help, model="gpt", labeled=True, check=_arithmetic_check, metrics=())(_arithmetic_task)


# -- text tasks: a Hugging Face model on JSONL prompts ------------------------------------------------------
def _need_tokenizer(name: str, tokenizer) -> None:
    if tokenizer is None:
        raise ConfigError(f"task.name={name} needs a Hugging Face policy's tokenizer (model.type=hf)")


@register_task("math", help="JSONL or parquet problems with a ground_truth, checked with math-verify", chat=True,
               reads_files=True, vllm=True, metrics=("format_rate",))
def _math_task(config, *, tokenizer, **_):
    from .math_reward import MathReward
    from .math_task import MathTask

    _need_tokenizer("math", tokenizer)
    ensure_data(config, "task")
    t, r = config.task, config.reward
    scorer = MathReward(format_weight=r.format_weight, correct_weight=r.correct_weight,
                        require_format=r.require_format, timeout_s=r.timeout_s)
    return MathTask(t.train_file, t.test_file, tokenizer, max_new_tokens=t.max_new_tokens, chat=t.chat,
                    system_prompt=t.system_prompt, prompt_template=t.prompt_template, reward=scorer,
                    max_prompt_length=t.max_prompt_length, prompt_key=t.prompt_key, label_key=t.label_key)


def _read_math_rows(path, config) -> None:
    from .math_task import read_rows

    read_rows(str(path), config.task.prompt_key, config.task.label_key)


def _math_row(task, i: int) -> tuple:
    row = task.rows[i]
    kind = row.get("task", row.get("type", row.get(SOURCE_KEY)))  # verl's rows name their data set instead
    return row.get("prompt", row.get("messages")), task.ground_truths[i], kind if isinstance(kind, str) else None


@register_test_file_format("math", keys=(), check=_read_math_rows, row=_math_row)
def _math_file(config, *, tokenizer, test_file, max_new_tokens):
    """Math and reasoning-gym rows {prompt | messages, ground_truth}, checked as `task.name: math` checks them."""
    from .math_reward import MathReward
    from .math_task import MathTask

    t, r = config.task, config.reward
    scorer = MathReward(format_weight=r.format_weight, correct_weight=r.correct_weight,
                        require_format=r.require_format, timeout_s=r.timeout_s)
    return MathTask(None, str(test_file), tokenizer, max_new_tokens=max_new_tokens, chat=t.chat,
                    system_prompt=t.system_prompt, prompt_template=t.prompt_template, reward=scorer,
                    max_prompt_length=t.max_prompt_length, prompt_key=t.prompt_key, label_key=t.label_key)


@register_task("prompts", help="open JSONL or parquet prompts scored by reward.model, reward.cls or reward functions",
               chat=True, reads_files=True, vllm=True, needs_reward=True, tools=True)
def _prompt_task(config, *, tokenizer, device="cpu", **_):
    from .prompt_task import PromptTask

    _need_tokenizer("prompts", tokenizer)
    ensure_data(config, "task")
    t, r = config.task, config.reward
    if r.model:
        from ..models.reward_model import same_vocabulary
        from .rewards import RewardModelScorer

        scorer = RewardModelScorer(r.model, device=device, batch_size=r.model_batch_size, chat=t.chat,
                                   chat_template_kwargs=config.model.chat_template_kwargs)
        if not same_vocabulary(tokenizer, scorer.tokenizer):
            raise ConfigError(f"reward.model={r.model!r} uses a different tokenizer than the policy "
                              f"({len(scorer.tokenizer)} vs {len(tokenizer)} tokens, or other ids): train the reward "
                              f"model from the policy's own base model (model.path)")
    elif r.cls:
        from .rewards import RewardFunctions, load_reward_class

        scorer = RewardFunctions.of(load_reward_class(r.cls), r.funcs_timeout_s)
    else:  # scored by the trainer's reward functions (`PromptTask.score_with`)
        scorer = None
    task = PromptTask(t.train_file, t.test_file, tokenizer, scorer=scorer, max_new_tokens=t.max_new_tokens,
                      chat=t.chat, system_prompt=t.system_prompt, prompt_template=t.prompt_template,
                      max_prompt_length=t.max_prompt_length, prompt_key=t.prompt_key, label_key=t.label_key)
    tools = config.env.tools
    if tools:
        from .tool_task import with_tools

        task = with_tools(task, tools, config)
    return task


# -- environments: multi-turn episodes -------------------------------------------------------------------
def _env_check(config) -> list[str]:
    e, t = config.env, config.task
    return [msg for ok, msg in [
        (e.max_context > t.max_new_tokens, f"env.max_context={e.max_context} leaves no room for one turn of "
                                           f"task.max_new_tokens={t.max_new_tokens}"),
    ] if not ok]


def _env_debug(config) -> list[str]:
    """Two RL steps of at most two turns each, a checkpoint after each step."""
    return ["train.steps=" + str(min(config.train.steps, 2)), f"env.max_turns={min(config.env.max_turns, 2)}",
            "train.ckpt_every=1"]


@register_task("env", help="episodes of an environment: env.id names it (registered, package.module:factory, "
                           "skyrl:<id>, textarena:<id>)", chat=True, multi_turn=True, section="env",
               check=_env_check, debug=_env_debug)
def _env_task(config, *, tokenizer, env_factory=None, **_):
    from ..envs.registry import env_factory as resolve, env_spec, importable_name
    from .env_task import EnvTask

    e, t = config.env, config.task
    if tokenizer is None:
        raise ConfigError("task.name=env needs a Hugging Face policy's tokenizer (model.type=hf)")
    if env_factory is not None and not e.id and not e.kwargs:
        # recorded in the run's config.yaml when it can be imported there, so `lmrl eval RUN_DIR` plays it too
        e.id = importable_name(env_factory) or ""
    if env_factory is None and e.id and ":" not in e.id and env_spec(e.id).task is not None:
        return env_spec(e.id).task(config, tokenizer=tokenizer)  # an environment that builds its own task
    make = env_factory if env_factory is not None else resolve(e.id, config, e.kwargs)
    try:  # one environment made now, so a factory that cannot make one fails here, before any model runs
        probe = make()
        if callable(getattr(probe, "close", None)):
            probe.close()
    except Exception as error:  # noqa: BLE001  (whatever the user's factory raises, said in one line)
        where = f"env.id={e.id}" if env_factory is None else "env_factory"
        raise ConfigError(f"{where}: making an environment failed: {type(error).__name__}: {error} "
                          f"(env.kwargs={e.kwargs})") from None
    return EnvTask(make, tokenizer, train_episodes=e.train_episodes, heldout_episodes=e.heldout_episodes,
                   max_turns=e.max_turns, max_new_tokens=t.max_new_tokens, max_context=e.max_context,
                   step_timeout_s=e.step_timeout_s or None, workers=e.workers, system_prompt=t.system_prompt,
                   name=e.id or getattr(make, "__name__", "env"))


# -- data generators: `lmrl data KIND DIR`, task.generate, data.generate ------------------------------------
@register_generator("word-problems", sizes=(2000, 200), uses=("task",),
                    help="arithmetic word problems {prompt, ground_truth}",
                    options={"kinds": ("add,sub,mul", "comma-separated add, sub, mul, div"),
                             "max_value": (100, "largest operand")})
def _word_problems(out_dir, n_train, n_test, *, seed=0, kinds="add,sub,mul", max_value=100, **_):
    from .word_problems import write_splits

    return write_splits(out_dir, n_train, n_test, seed, kinds=tuple(str(kinds).split(",")), max_value=int(max_value))


@register_generator("addition-chat", sizes=(2000, 200), uses=("task",),
                    help="'What is 23 + 58?' {prompt, ground_truth}", options={"digits": (2, "digits per operand")})
def _addition_chat(out_dir, n_train, n_test, *, seed=0, digits=2, **_):
    from .word_problems import write_addition_chat

    return write_addition_chat(out_dir, n_train, n_test, seed, digits=int(digits))


@register_generator("preferences", sizes=(600, 100), help="synthetic {prompt, chosen, rejected} pairs (right vs "
                                                          "wrong sums, concise vs rambling replies)")
def _preferences(out_dir, n_train, n_test, *, seed=0, **_):
    from .synthetic_preferences import write_preference_splits

    return write_preference_splits(out_dir, n_train, n_test, seed)


@register_generator("preferences-sft", sizes=(600, 100), uses=("data",),
                    help="the preference pairs' chosen side as SFT rows {prompt, response}")
def _preferences_sft(out_dir, n_train, n_test, *, seed=0, **_):
    from .synthetic_preferences import write_sft_splits

    return write_sft_splits(out_dir, n_train, n_test, seed)


@register_generator("gsm8k", sizes=(0, 0), reads_source=True, uses=("task",),
                    help="GSM8K's train and test splits as `lmrl prepare-data` converts them")
def _gsm8k(out_dir, n_train=0, n_test=0, *, source=None, **_):
    from .prepare_data import write_gsm8k_splits

    return write_gsm8k_splits(out_dir, source)


def __getattr__(name):
    if name == "ArithmeticTask":
        from .arithmetic import ArithmeticTask

        return ArithmeticTask
    raise AttributeError(f"module 'lmrl.tasks' has no attribute {name!r}")


__all__ = ["ArithmeticTask", "DataGenerator", "GENERATORS", "TASKS", "TEST_FILE_FORMATS", "TaskSpec", "TestFileFormat",
           "build_task", "ensure_data", "ensure_files", "generators_for", "register_generator", "register_task",
           "register_test_file_format", "task_spec", "test_file_format"]
