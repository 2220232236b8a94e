"""Tasks: where prompts come from and how completions are scored.

Imports are lazy, so a light module (e.g. `math_reward`, which reward worker processes import)
does not pull in torch through this package: each task's module is imported by its builder."""

from pathlib import Path

from ..errors import ConfigError
from .synthetic_preferences import write_preference_splits
from .word_problems import write_addition_chat, write_splits


def build_task(cfg, *, tokenizer=None, reward=None, env=None, device="cpu"):
    """The task described by the `task` config section (`cfg.name` is a key of `TASKS`). A math
    task needs the policy's tokenizer (for its chat template) and takes its reward weights from the
    `reward` section; the SQL agent takes its environment from the `env` section; open prompts take
    their reward model from `reward.model` (loaded on `device`) or a custom `reward.cls`."""
    if cfg.name not in TASKS:
        raise ConfigError(f"task.name={cfg.name!r} is not one of {', '.join(TASKS)}")
    return TASKS[cfg.name](cfg, tokenizer=tokenizer, reward=reward, env=env, device=device)


def _arithmetic_task(cfg, **_):
    from .arithmetic import ArithmeticTask

    return ArithmeticTask(name=cfg.name, ndigit=cfg.ndigit, use_format=cfg.use_format,
                          reverse_answer=cfg.reverse_answer, reward=cfg.reward, heldout_size=cfg.heldout_size,
                          scratchpad=cfg.scratchpad)


def _math_task(cfg, *, tokenizer, reward, **_):
    from .math_reward import MathReward
    from .math_task import MathTask

    if tokenizer is None:
        raise ValueError("task.name=math needs a Hugging Face policy's tokenizer (model.type=hf)")
    _ensure_data(cfg)
    scorer = MathReward() if reward is None else MathReward(
        format_weight=reward.format_weight, correct_weight=reward.correct_weight,
        require_format=reward.require_format, timeout_s=reward.timeout_s)
    return MathTask(cfg.train_file, cfg.test_file, tokenizer, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat,
                    system_prompt=cfg.system_prompt, prompt_template=cfg.prompt_template, reward=scorer)


def _sql_task(cfg, *, tokenizer, env, **_):
    from .sql.agent_task import SQLAgentTask
    from .sql.env import SQLEnvConfig
    from .sql.procedural import SKILLS

    if tokenizer is None:
        raise ValueError("task.name=sql needs a Hugging Face policy's tokenizer (model.type=hf)")
    if env is None:
        raise ValueError("task.name=sql needs the `env` config section (build_task(..., env=config.env))")
    env_config = SQLEnvConfig.from_section(env)
    return SQLAgentTask(tokenizer, env_config, n_train=env.train_tasks, heldout_per_skill=env.heldout_per_skill,
                        skills=tuple(env.skills) or SKILLS, train_file=cfg.train_file, test_file=cfg.test_file,
                        max_new_tokens=cfg.max_new_tokens, max_context=env.max_context)


def _prompt_task(cfg, *, tokenizer, reward, device, **_):
    from .prompt_task import PromptTask

    if tokenizer is None:
        raise ValueError("task.name=prompts needs a Hugging Face policy's tokenizer (model.type=hf)")
    _ensure_data(cfg)
    if reward is not None and reward.model:
        from ..models.reward_model import same_vocabulary
        from .rewards import RewardModelScorer

        scorer = RewardModelScorer(reward.model, device=device, batch_size=reward.model_batch_size, chat=cfg.chat)
        if not same_vocabulary(tokenizer, scorer.tokenizer):
            raise ConfigError(f"reward.model={reward.model!r} uses a different tokenizer than the policy "
                              f"({len(scorer.tokenizer)} vs {len(tokenizer)} tokens, or other ids): train the reward "
                              f"model from the policy's own base model (model.path)")
    elif reward is not None and reward.cls:
        from .rewards import load_reward_class

        scorer = load_reward_class(reward.cls)
    else:  # scored by the trainer's reward functions (`PromptTask.score_with`)
        scorer = None
    return PromptTask(cfg.train_file, cfg.test_file, tokenizer, scorer=scorer, max_new_tokens=cfg.max_new_tokens,
                      chat=cfg.chat, system_prompt=cfg.system_prompt, prompt_template=cfg.prompt_template)


# `task.name` -> the function that builds the task; the config check reads this dict.
TASKS = {"addition": _arithmetic_task, "multiplication": _arithmetic_task, "math": _math_task, "sql": _sql_task,
         "prompts": _prompt_task}

def _write_gsm8k(out_dir, *, source=None):
    from .prepare_data import write_gsm8k_splits

    return write_gsm8k_splits(out_dir, source)


# `task.generate` -> the writer of DIR/train.jsonl and DIR/test.jsonl and its (train, test) sizes, as
# `lmrl data <name>` writes them by default; gsm8k converts the real data set's splits whole.
GENERATORS = {"word-problems": (write_splits, (2000, 200)), "addition-chat": (write_addition_chat, (2000, 200)),
              "preferences": (write_preference_splits, (600, 100)), "gsm8k": (_write_gsm8k, ())}
# the generators that read a data set (`task.generate_from`, else the Hugging Face hub) instead of making one
READS_SOURCE = ("gsm8k",)


def _ensure_data(cfg) -> None:
    """Writes the task's JSONL files with `task.generate`'s generator when they are missing."""
    train, test = Path(cfg.train_file), Path(cfg.test_file)
    if train.exists() and test.exists():
        return
    if not cfg.generate:
        missing = train if not train.exists() else test
        raise FileNotFoundError(f"task data {missing} does not exist: write a set with `lmrl data addition-chat DIR` "
                                f"or `lmrl data word-problems DIR` (prompts: `lmrl data preferences DIR`), or set task.generate")
    if train.parent != test.parent or (train.name, test.name) != ("train.jsonl", "test.jsonl"):
        raise FileNotFoundError(f"task.generate writes DIR/train.jsonl and DIR/test.jsonl; task.train_file="
                                f"{train} and task.test_file={test} are not such a pair")
    writer, sizes = GENERATORS[cfg.generate]
    if cfg.generate not in READS_SOURCE:
        writer(train.parent, *sizes, seed=0)
        return
    from ..data import DataError

    try:
        writer(train.parent, source=cfg.generate_from or None)
    except DataError as e:
        where = f"task.generate_from={cfg.generate_from}" if cfg.generate_from else "the Hugging Face hub"
        raise DataError(f"task.generate={cfg.generate} could not write {train.parent}/ from {where}: {e} (set "
                        f"task.generate_from=DIR to a local copy of the data set's files)") from None


def __getattr__(name):
    if name == "ArithmeticTask":
        from .arithmetic import ArithmeticTask

        return ArithmeticTask
    raise AttributeError(f"module 'lmrl.tasks' has no attribute {name!r}")


__all__ = ["ArithmeticTask", "GENERATORS", "READS_SOURCE", "TASKS", "build_task"]
