"""reasoning-gym's procedural data sets as math-task rows, checked with each data set's own scorer.

    rows = generate(["basic_arithmetic", "leg_counting"], size=200, seed=0, config={"max_terms": 4})
    reward(completions=["... <answer>-4</answer>"], **columns)   # TRL's call: one score in [0, 1] per completion

    lmrl prepare-data --rg-tasks basic_arithmetic leg_counting --size 200 --rg-config max_terms=4
    reward.funcs: [lmrl.tasks.reasoning_gym:reward]               # in a config whose rows are these

A row is `{"prompt", "ground_truth", "task", "metadata", "rg_config"}`: the entry's question and answer
(`""` for the data sets with no single answer, such as graph_color and rush_hour, whose scorer checks
an answer against the puzzle itself), the data set's name (the row's type), the entry's metadata as
JSON, and the `create_dataset` keywords it was made with (seed, size and any config). A row with an
`rg_config` is reasoning-gym's: the math task scores it with this module instead of math-verify.

Scoring is the data set's own `score_answer(answer, entry)`, on a data set built with the row's
`rg_config` (some scorers read their config) and the entry rebuilt from the row. A score is in
[0, 1]; some data sets give partial credit (a close answer, a valid but longer solution), and a row
counts as correct only at 1. The answer is the completion's last `<answer>...</answer>` block, else
its last non-empty line (`extract_answer`). A scorer that raises on an answer scores it 0.

Generated rows are checked as they are made: the entry's own answer, scored from its JSON row, must
score 1. ARC's boards are tuples, which JSON turns into lists, so arc_agi and rearc rows fail that
check and are refused rather than scored wrong later.

Item i of a data set is drawn from seed + i: two sets overlap unless their ranges [seed, seed + size)
do not, so make a test set with a seed at least the training set's seed + size.

reasoning-gym is an optional dependency (`pip install 'lmrl[reasoning-gym]'`), imported on first use.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from functools import lru_cache
from typing import Iterator, Mapping, Sequence

from ..common.data import DataError
from ..common.errors import MissingPackage
from .math_reward import RewardInfo, completion_text, parse_completion

GENERATED_KEYS = ("seed", "size")  # create_dataset keywords set by generate's own arguments, not by config


def is_reasoning_gym_row(row: Mapping) -> bool:
    """Whether a row is scored by reasoning-gym: it carries the `rg_config` it was made with."""
    return isinstance(row.get("rg_config"), dict)


@lru_cache(maxsize=1)
def dataset_names() -> tuple[str, ...]:
    """The reasoning-gym data sets that can be made by name ("composite" mixes others: name them instead)."""
    return tuple(sorted(name for name in _reasoning_gym().factory.DATASETS if name != "composite"))


def generate(names: Sequence[str], size: int, seed: int = 0, config: Mapping[str, object] | None = None) -> list[dict]:
    """`size` rows of each named data set (see the module docstring for a row), in order; `config`
    keys set a field of every named data set (`max_value`) or of one (`basic_arithmetic.max_value`)."""
    return [row_from_entry(entry, where) for where, entry in entries(names, size, seed, config)]


def entries(names: Sequence[str], size: int, seed: int = 0,
            config: Mapping[str, object] | None = None) -> Iterator[tuple[str, dict]]:
    """("reasoning-gym NAME item i", entry) for item 0..size-1 of each data set: reasoning-gym's entry
    ({question, answer, metadata}) with the data set's `task` name and the `rg_config` it was made
    with. Names and config keys are checked before any item is made."""
    if size < 1:
        raise DataError(f"reasoning-gym: the size must be at least 1, got {size}")
    per_task = split_config(names, config or {})
    rg = _reasoning_gym()
    for name in names:
        kwargs = {"seed": seed, "size": size, **per_task[name]}
        try:
            dataset = rg.create_dataset(name, **kwargs)
        except Exception as e:  # the data set's own config check (assertions, ValueErrors)
            raise DataError(f"reasoning-gym {name}: its config {_show(kwargs)} was refused: "
                            f"{type(e).__name__}: {e}") from None
        for i in range(size):
            entry = dataset[i]
            yield f"reasoning-gym {name} item {i}", {**entry, "task": name, "rg_config": kwargs}


def split_config(names: Sequence[str], config: Mapping[str, object]) -> dict[str, dict]:
    """{name: its config} from `config`, whose keys are `field` (every named data set) or `name.field`;
    an unknown name or field is a DataError that suggests close matches."""
    known = dataset_names()
    if not names:
        raise DataError("reasoning-gym: name at least one data set (e.g. basic_arithmetic, leg_counting)")
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}?" if close else f"the {len(known)} data sets: {', '.join(known)}"
            raise DataError(f"unknown reasoning-gym data set {name!r}; {hint}")
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise DataError(f"reasoning-gym: {', '.join(twice)} named twice")
    per_task: dict[str, dict] = {name: {} for name in names}
    for key, value in config.items():
        task, _, field = key.rpartition(".")
        if task and task not in per_task:
            raise DataError(f"reasoning-gym config {key}={value!r}: {task!r} is not one of the data sets named "
                            f"({', '.join(names)})")
        if field in GENERATED_KEYS:
            raise DataError(f"reasoning-gym config {key}={value!r}: the {field} is set on its own (--{field}, or "
                            f"generate's {field}=), not as a config key")
        for name in [task] if task else names:
            fields = _config_fields(name)
            if field not in fields:
                close = difflib.get_close_matches(field, fields, n=3, cutoff=0.6)
                hint = f"did you mean {' or '.join(close)}?" if close else f"its keys: {', '.join(fields)}"
                scope = "" if task or len(names) == 1 else " (name one data set as NAME.key to set it there only)"
                raise DataError(f"reasoning-gym {name} has no config key {field!r}; {hint}{scope}")
            per_task[name][field] = value
    return per_task


def row_from_entry(entry: Mapping, where: str = "") -> dict:
    """A reasoning-gym entry ({question, answer, metadata} and its data set's `task` or
    metadata.source_dataset, optionally the `rg_config` it was made with) as a row; DataError when it
    cannot be one. The entry's own answer must score 1 from the row (see the module docstring)."""
    prefix = f"{where}: " if where else ""
    question, answer, metadata = entry.get("question"), entry.get("answer"), entry.get("metadata")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{prefix}'question' must be non-empty text")
    if answer is not None and not isinstance(answer, str):
        raise DataError(f"{prefix}'answer' must be text or null, got {type(answer).__name__}")
    if not isinstance(metadata, dict):
        raise DataError(f"{prefix}'metadata' must be an object (reasoning-gym's scorer reads it)")
    task = entry.get("task") or metadata.get("source_dataset")
    if not isinstance(task, str) or task not in dataset_names():
        raise DataError(f"{prefix}cannot tell which reasoning-gym data set scores this entry (its 'task' or "
                        f"metadata.source_dataset is {task!r})")
    config = entry.get("rg_config") or {}
    if not isinstance(config, dict):
        raise DataError(f"{prefix}'rg_config' must be an object of create_dataset keywords")
    try:  # JSON as the file will hold it: tuples become lists, keys strings
        metadata = json.loads(json.dumps(metadata))
        config = json.loads(json.dumps(config))
    except (TypeError, ValueError) as e:
        raise DataError(f"{prefix}the metadata of this {task} entry cannot be written as JSON ({e})") from None
    row = {"prompt": question, "ground_truth": "" if answer is None else answer, "task": task,
           "metadata": metadata, "rg_config": config}
    if answer is not None:
        own = score(answer, row)
        if own != 1.0:
            raise DataError(f"{prefix}the entry's own answer scores {own:g}, not 1, when scored from its JSON row "
                            f"(its metadata does not survive JSON), so lmrl cannot score {task} rows")
    return row


def extract_answer(completion) -> str | None:
    """The answer a completion gives: the content of its last `<answer>...</answer>` block
    (reasoning-gym's own `extract_answer`), else its last non-empty line, stripped; None when it is
    blank. A TRL conversation (a list of messages) answers with its last message."""
    text = completion_text(completion)
    answer = _reasoning_gym().utils.extract_answer(text)
    if answer is not None:
        return answer
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def score(answer: str | None, row: Mapping) -> float:
    """reasoning-gym's score in [0, 1] of `answer` for a row (its ground_truth, task, metadata and
    rg_config; a prompt, if given, becomes the entry's question)."""
    if answer is None:
        return 0.0
    scorer = _dataset(row["task"], json.dumps(row.get("rg_config") or {}, sort_keys=True))
    truth = row.get("ground_truth")
    entry = {"question": row.get("prompt") or "", "answer": truth if truth else None, "metadata": row["metadata"]}
    try:
        return float(scorer.score_answer(answer, entry))
    except Exception:  # a scorer failing on a model's answer (unparseable text): the answer is not right
        return 0.0


def check(completion: str, row: Mapping, *, format_weight: float = 0.0, correct_weight: float = 1.0,
          require_format: bool = True) -> RewardInfo:
    """A completion of a reasoning-gym row scored as MathReward scores math rows: format_ok is the
    `<think>...</think> <answer>...</answer>` form; the reward is format_weight·[well-formed] +
    correct_weight·score, where the score counts only for a well-formed completion when
    `require_format`; correct means a full score."""
    format_ok, _ = parse_completion(completion)
    value = score(extract_answer(completion), row) if format_ok or not require_format else 0.0
    return RewardInfo(format_weight * format_ok + correct_weight * value, format_ok, value >= 1.0)


def reward(completions, task=None, metadata=None, ground_truth=None, rg_config=None, prompts=None,
           **kwargs) -> list[float | None]:
    """A reward function as TRL calls it (`reward.funcs: [lmrl.tasks.reasoning_gym:reward]`): each
    completion's reasoning-gym score in [0, 1] for its row, the answer read by `extract_answer` (last
    `<answer>` block, else last line). Rows without an `rg_config` (not reasoning-gym's) get None."""
    n = len(completions)
    columns = {name: list(values) if values is not None else [None] * n
               for name, values in (("task", task), ("metadata", metadata), ("ground_truth", ground_truth),
                                    ("rg_config", rg_config))}
    rewards = []
    for i, completion in enumerate(completions):
        row = {name: values[i] for name, values in columns.items()}
        if not is_reasoning_gym_row(row):
            rewards.append(None)
            continue
        rewards.append(score(extract_answer(completion), row))
    return rewards


@lru_cache(maxsize=64)
def _dataset(task: str, config_json: str):
    """The data set whose `score_answer` scores `task` rows made with this config (built once)."""
    rg = _reasoning_gym()
    config = json.loads(config_json)
    try:
        return rg.create_dataset(task, **config)
    except Exception as e:
        raise DataError(f"reasoning-gym {task}: cannot rebuild its scorer from rg_config {_show(config)}: "
                        f"{type(e).__name__}: {e}") from None


def _config_fields(name: str) -> list[str]:
    _, config_class = _reasoning_gym().factory.DATASETS[name]
    return [f.name for f in dataclasses.fields(config_class) if f.name not in GENERATED_KEYS]


def _reasoning_gym():
    try:
        import reasoning_gym
        import reasoning_gym.factory
        import reasoning_gym.utils
    except ImportError:
        raise MissingPackage("reasoning-gym data sets need the reasoning-gym package: "
                             "pip install 'lmrl[reasoning-gym]'") from None
    return reasoning_gym


def _show(config: Mapping) -> str:
    return " ".join(f"{k}={v!r}" for k, v in config.items()) or "(defaults)"
