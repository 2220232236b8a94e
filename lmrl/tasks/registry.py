"""Tasks and data generators as registered specs: `task.name` and `task.generate` / `data.generate` /
`lmrl data` take their choices from here, and every other layer asks a task's traits, never its name.

    @register_task("countdown", model="hf", chat=True, reads_files=True)
    def build_countdown(config, *, tokenizer, **_):
        return CountdownTask(config.task.train_file, config.task.test_file, tokenizer)

A builder gets the whole config (a task reads its own section: `task`, or `env` for environments,
or the section its spec names) and keyword arguments: `tokenizer` (the policy's, None for the
built-in GPT before it exists), `device`, and `env_factory` (an environment factory handed in from
Python, for `task.name=env`). It returns an object satisfying `lmrl.tasks.protocol.Task`.

Traits (what the other layers ask):
- `model`: "gpt" (the built-in GPT and its character tokenizer) or "hf" (a Hugging Face model);
- `chat`: prompts are conversations (rendered with the chat template);
- `multi_turn`: episodes alternate the policy's turns with an environment's observations;
- `labeled`: the supervised warm-up (`sft.steps`) can train on its labels (`LabeledTask`);
- `reads_files`: problems come from `task.train_file` / `task.test_file` (or `train_dataset=`);
- `vllm`: `rollout.engine=vllm` can sample it (single-turn text prompts);
- `needs_reward`: it has no verifier of its own (reward.model, reward.cls or reward functions score it);
- `tools`: its prompts can be answered with `env.tools` (TRL's `tools=`) over several turns;
- `section`: the config section holding its options (listed in `lmrl config`);
- `metrics`: the extra metrics its `score_rollout` reports (evaluated as `eval/<name>`), when they are
  fixed (None: known once it runs), so `train.best_metric` is checked before a model loads.
`check(config) -> [problem, ...]` adds rules between its options and other sections; `debug(config)
-> [override, ...]` shrinks it for `lmrl train --debug` beyond the generic shrinking.

A data generator writes DIR/train.jsonl and DIR/test.jsonl: `write(out_dir, n_train, n_test, *, seed,
config, source)` returns the two paths (and may return statistics as a third item)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..common.errors import ConfigError

MODELS = ("gpt", "hf")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    build: Callable
    help: str = ""
    model: str = "hf"
    chat: bool = False
    multi_turn: bool = False
    labeled: bool = False
    reads_files: bool = False
    vllm: bool = False
    needs_reward: bool = False
    tools: bool = False
    section: str = "task"
    check: Callable | None = None
    debug: Callable | None = None
    metrics: tuple[str, ...] | None = None

    def problems(self, config) -> list[str]:
        return list(self.check(config)) if self.check is not None else []

    def debug_overrides(self, config) -> list[str]:
        return list(self.debug(config)) if self.debug is not None else []


TASKS: dict[str, TaskSpec] = {}


def register_task(name: str, *, help: str = "", model: str = "hf", chat: bool = False, multi_turn: bool = False,
                  labeled: bool = False, reads_files: bool = False, vllm: bool = False, needs_reward: bool = False,
                  tools: bool = False, section: str = "task", check: Callable | None = None,
                  debug: Callable | None = None, metrics: tuple[str, ...] | None = None):
    """Function decorator: `task.name: <name>` builds its task with the decorated builder."""
    if model not in MODELS:
        raise ValueError(f"register_task({name!r}): model={model!r} is not one of {', '.join(MODELS)}")

    def register(build: Callable) -> Callable:
        known = TASKS.get(name)
        if known is not None and known.build is not build:
            raise ValueError(f"task {name!r} is already registered (by {known.build.__module__}."
                             f"{known.build.__qualname__})")
        TASKS[name] = TaskSpec(name, build, help, model, chat, multi_turn, labeled, reads_files, vllm, needs_reward,
                               tools, section, check, debug, None if metrics is None else tuple(metrics))
        return build

    return register


def task_spec(name: str) -> TaskSpec:
    """The spec registered as `name`, or a ConfigError naming the registered ones."""
    if name not in TASKS:
        raise ConfigError(f"task.name={name!r} is not one of {', '.join(TASKS)}")
    return TASKS[name]


def build_task(config, *, tokenizer=None, device="cpu", env_factory=None):
    """The task `config.task.name` names, built from the whole config (see the module docstring)."""
    return task_spec(config.task.name).build(config, tokenizer=tokenizer, device=device, env_factory=env_factory)


# -- test-file formats (`lmrl eval MODEL FILE`) -------------------------------------------------------------
@dataclass(frozen=True)
class TestFileFormat:
    """How `lmrl eval` plays a test file whose first row holds all of `keys`: `check(path, config)` reads
    every row as the task built from `config` will (a bad row fails, naming it, before a model loads;
    prompt rows through `config.task.prompt_key` / `label_key`), `build(config, *, tokenizer, test_file,
    max_new_tokens)` returns the task that answers and checks its rows (its `heldout_ids` are the file's
    rows), and `row(task, i) -> (prompt as the task read it, ground truth, type or None)` describes row i
    for the completions file. `config` is the run's (a bare model's: the defaults), with `lmrl eval`'s
    options applied."""

    name: str
    keys: tuple[str, ...]
    check: Callable
    build: Callable
    row: Callable


TEST_FILE_FORMATS: dict[str, TestFileFormat] = {}


def register_test_file_format(name: str, *, keys: tuple[str, ...], check: Callable, row: Callable):
    """Function decorator on a builder: `lmrl eval` plays files whose first row holds `keys` with it
    (the format with the most matching keys wins; `keys=()` takes any file)."""

    def register(build: Callable) -> Callable:
        TEST_FILE_FORMATS[name] = TestFileFormat(name, tuple(keys), check, build, row)
        return build

    return register


def test_file_format(first_row: dict) -> TestFileFormat:
    """The registered format of a test file whose first row is `first_row`."""
    fits = [f for f in TEST_FILE_FORMATS.values() if all(key in first_row for key in f.keys)]
    if not fits:
        raise ConfigError(f"no test-file format takes a first row with keys {sorted(first_row)}; known: "
                          + "; ".join(f"{f.name} {list(f.keys)}" for f in TEST_FILE_FORMATS.values()))
    return max(fits, key=lambda f: len(f.keys))


# -- data generators ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataGenerator:
    name: str
    write: Callable
    sizes: tuple[int, int]  # (train, test) rows written by default
    help: str = ""
    reads_source: bool = False  # converts a data set (`task.generate_from`, else the hub) instead of making one
    uses: tuple[str, ...] = ("task", "data")  # which of task.generate / data.generate may name it
    options: dict = field(default_factory=dict)  # `lmrl data` options: flag -> (default, help)
    check: Callable | None = None  # (config) -> [problem, ...]: what it needs of the config it plays in
    preset: str = ""  # the preset it plays in when `lmrl data` names none with --config ("": needs none)

    def problems(self, config) -> list[str]:
        return list(self.check(config)) if self.check is not None else []


GENERATORS: dict[str, DataGenerator] = {}


def register_generator(name: str, *, sizes: tuple[int, int], help: str = "", reads_source: bool = False,
                       uses: tuple[str, ...] = ("task", "data"), options: dict | None = None,
                       check: Callable | None = None, preset: str = ""):
    """Function decorator: `lmrl data <name>`, and `task.generate` / `data.generate` as `uses` says."""

    def register(write: Callable) -> Callable:
        GENERATORS[name] = DataGenerator(name, write, sizes, help, reads_source, tuple(uses), dict(options or {}),
                                        check, preset)
        return write

    return register


def generators_for(use: str) -> tuple[str, ...]:
    """The generator names `task.generate` (use="task") or `data.generate` (use="data") may take."""
    return tuple(name for name, g in GENERATORS.items() if use in g.uses)


def ensure_data(config, section: str) -> None:
    """Writes a config section's files with its `generate` generator when either is missing: `task`
    (train_file, test_file, from generate_from) for a task, `data` (train_file, eval_file; generate_train
    and generate_test rows, generators given the whole config) for the offline trainers."""
    if section == "task":
        t = config.task
        ensure_files(t.train_file, t.test_file, t.generate, key="task", source=t.generate_from)
    else:
        d = config.data
        ensure_files(d.train_file, d.eval_file, d.generate, key="data", config=config, n_train=d.generate_train,
                     n_test=d.generate_test)


def ensure_files(train_file, test_file, generate: str, *, key: str, config=None, source: str = "",
                 n_train: int | None = None, n_test: int | None = None, seed: int = 0) -> None:
    """Writes `train_file` and `test_file` with generator `generate` when either is missing; `key` is
    the config section whose `generate` asked (task or data), for the errors."""
    train, test = Path(train_file), Path(test_file) if test_file else None
    if train.exists() and (test is None or test.exists()):
        return
    missing = train if not train.exists() else test
    if not generate:
        makers = ", ".join(generators_for(key))
        raise FileNotFoundError(f"{missing} does not exist: write it with `lmrl data KIND DIR` ({makers}) or "
                                f"`lmrl prepare-data`, or set {key}.generate")
    if test is None or train.parent != test.parent or (train.name, test.name) != ("train.jsonl", "test.jsonl"):
        raise ConfigError(f"{key}.generate writes DIR/train.jsonl and DIR/test.jsonl; {train} and {test} are not "
                          f"such a pair")
    gen = GENERATORS[generate]
    sizes = (n_train or gen.sizes[0], n_test or gen.sizes[1])
    if not gen.reads_source:
        gen.write(train.parent, *sizes, seed=seed, config=config)
        return
    from ..common.data import DataError

    try:
        gen.write(train.parent, *sizes, seed=seed, config=config, source=source or None)
    except DataError as e:
        where = f"{key}.generate_from={source}" if source else "the Hugging Face hub"
        raise DataError(f"{key}.generate={generate} could not write {train.parent}/ from {where}: {e} (set "
                        f"{key}.generate_from=DIR to a local copy of the data set's files)") from None
