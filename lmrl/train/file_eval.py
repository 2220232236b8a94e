"""A model's answers to a JSONL or parquet test file, checked by the task that trains on such rows:
`lmrl eval MODEL FILE`.

    result = evaluate_file("smollm2-135m-instruct", "data/gsm8k-test/gsm8k.jsonl", limit=50,
                           out="gsm8k.completions.jsonl")
    print(result.overall)              # 12/50 right = 24.0% (95% CI 14.3-37.4%)
    result.by_type["leg_counting"]     # a Tally per value of the rows' `task` (or `type`, or `data_source`) column
    result.records[0]                  # {"index", "prompt", "completion", "ground_truth", "correct", "reward", ...}

The model is any Hugging Face causal LM `load_hf_policy` loads (a local dir, a .gguf file, the packaged
`smollm2-135m-instruct`), optionally with a PEFT LoRA `adapter` dir put on it and merged (what TRL's
trainers and lmrl's LoRA checkpoints write), or a run dir, whose checkpoint (`checkpoint`: latest, best,
step_N) is loaded on its base model. The rows go through the task that trains on them, so prompts are
rendered and answers checked as in training; the file's format (`lmrl.tasks.register_test_file_format`)
is told by the keys of its first row:

    math rows {prompt | messages, ground_truth}        MathTask: math-verify
    reasoning-gym rows {prompt, ground_truth, task,    MathTask: the data set's own scorer, correct at a full
        metadata, rg_config}                           score (see lmrl.tasks.reasoning_gym)
    DBBench records {description, label, table, type}  SQLAgentTask: multi-turn SQL episodes in the sandbox,
                                                       correct when the answer (or the table) matches

The prompt settings (chat template, system prompt, prompt template, max new tokens), where a row
holds its prompt and its ground truth (`task.prompt_key` / `task.label_key`: the file's rows are read
as the run read its training rows, verl's layout and parquet included), the math reward's format rule
and an environment's settings (turns, context, the `sql` section) come from the run's config; for a
bare model from the config defaults, except `require_format`, which is off: a
completion's answer is its `<answer>` block if it has one, else its last number (math) or its last
line (reasoning-gym). Decoding is greedy unless `temperature` > 0. Accuracy comes with its 95% Wilson
score interval, overall and per type; two models' verdicts on the same rows compare with
`paired_difference_interval`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from statistics import NormalDist
from typing import Mapping, Sequence

import torch

from ..config import Config, load_config
from ..common.data import iter_file_rows, write_jsonl
from ..parallel.ddp import DistInfo, resolve_device
from ..common.errors import ConfigError
from ..models.hf import load_hf_policy
from ..common.options import Section
from ..tasks import test_file_format
from .evaluate import scored_batches
from .inspect import load_run_model


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of the proportion correct / n:

        (p + z²/2n ± z·√(p(1 − p)/n + z²/4n²)) / (1 + z²/n),   z = the standard normal's (1 + confidence)/2 quantile

    Unlike p ± z·√(p(1 − p)/n) it stays inside [0, 1] and has a width at p = 0 or 1. (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_interval(correct_a: int, n_a: int, correct_b: int, n_b: int, confidence: float = 0.95,
                        phi: float = 0.0) -> tuple[float, float]:
    """Newcombe's square-and-add interval of the difference p_a − p_b, from the Wilson intervals
    (l_a, u_a) and (l_b, u_b) of the two proportions:

        low  = d − √((p_a − l_a)² − 2φ(p_a − l_a)(u_b − p_b) + (u_b − p_b)²)
        high = d + √((u_a − p_a)² − 2φ(u_a − p_a)(p_b − l_b) + (p_b − l_b)²),   d = p_a − p_b

    φ = 0: two independent samples (Newcombe 1998, Stat Med 17:873, method 10). Two scorings of the
    same items correlate: `paired_difference_interval` passes their φ. Inside [−1, 1]; an empty side
    gives its proportion the whole of [0, 1]."""
    p_a, p_b = correct_a / n_a if n_a else 0.0, correct_b / n_b if n_b else 0.0
    l_a, u_a = wilson_interval(correct_a, n_a, confidence)
    l_b, u_b = wilson_interval(correct_b, n_b, confidence)
    d = p_a - p_b
    below_a, above_b = p_a - l_a, u_b - p_b
    above_a, below_b = u_a - p_a, p_b - l_b
    low = d - math.sqrt(max(0.0, below_a ** 2 - 2 * phi * below_a * above_b + above_b ** 2))
    high = d + math.sqrt(max(0.0, above_a ** 2 - 2 * phi * above_a * below_b + below_b ** 2))
    return max(-1.0, low), min(1.0, high)


def paired_difference_interval(a: Sequence[bool], b: Sequence[bool],
                               confidence: float = 0.95) -> tuple[float, float]:
    """The interval of p_a − p_b when a[i] and b[i] are the same item's verdicts under two scorings
    (two models on one test set): Newcombe's square-and-add interval for paired proportions
    (Newcombe 1998, Stat Med 17:2635, method 10), `difference_interval` with φ the correlation of the
    2×2 table (both right r, only a s, only b t, neither u; N items):

        φ = (A − N/2) / √((r+s)(t+u)(r+t)(s+u))  where A = ru − st > N/2,   0 where 0 ≤ A ≤ N/2,
            A / √(...) where A < 0,   and 0 when a margin is empty."""
    if len(a) != len(b):
        raise ValueError(f"paired verdicts need one of each per item: got {len(a)} and {len(b)}")
    n = len(a)
    r = sum(1 for x, y in zip(a, b) if x and y)
    s = sum(1 for x, y in zip(a, b) if x and not y)
    t = sum(1 for x, y in zip(a, b) if y and not x)
    u = n - r - s - t
    margins = (r + s) * (t + u) * (r + t) * (s + u)
    agreement = r * u - s * t
    if margins == 0 or 0 <= agreement <= n / 2:
        phi = 0.0
    else:
        phi = (agreement - n / 2 if agreement > 0 else agreement) / math.sqrt(margins)
    return difference_interval(r + s, n, r + t, n, confidence, phi)


@dataclass(frozen=True)
class Tally:
    """`correct` right answers among `rows`."""
    correct: int
    rows: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.rows if self.rows else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson_interval(self.correct, self.rows)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "correct": self.correct, "accuracy": self.accuracy, "ci95": list(self.ci95)}

    def __str__(self) -> str:
        low, high = self.ci95
        return (f"{self.correct}/{self.rows} right = {100 * self.accuracy:.1f}% "
                f"(95% CI {100 * low:.1f}-{100 * high:.1f}%)")


@dataclass
class FileEvaluation:
    model: str                   # what answered: a model path or name, or a run dir
    checkpoint: str | None       # the run's checkpoint dir, or the adapter on a bare model; None for a bare model alone
    file: str
    overall: Tally
    by_type: dict[str, Tally]    # per value of the rows' task / type / data_source column (SQL: skill); or empty
    metrics: dict[str, float]    # means over rows: reward, completion tokens, the task's extras (format_rate, turns)
    completions_file: str | None
    records: list[dict] = field(repr=False)  # one per row, as written to completions_file

    def as_dict(self) -> dict:
        """The report `lmrl eval` prints (records left out: they are in the completions file)."""
        return {"model": self.model, "checkpoint": self.checkpoint, "file": self.file, **self.overall.as_dict(),
                "by_type": {name: tally.as_dict() for name, tally in self.by_type.items()}, **self.metrics,
                "completions": self.completions_file}


def evaluate_file(model: str | Path, test_file: str | Path, *, checkpoint: str = "latest", limit: int | None = None,
                  max_new_tokens: int | None = None, batch_size: int = 16, out: str | Path | None = None,
                  chat: bool | None = None, system_prompt: str | None = None, prompt_template: str | None = None,
                  require_format: bool | None = None, temperature: float = 0.0, seed: int = 0,
                  device: str = "auto", dtype: str = "fp32", adapter: str | Path | None = None,
                  sections: Mapping[str, Section] | None = None, prompt_key: str | None = None,
                  label_key: str | None = None) -> FileEvaluation:
    """Answers of `model` (a Hugging Face model or a run dir, see the module docstring) to the first
    `limit` rows of `test_file` (all when None), `batch_size` rows at a time, checked by the rows'
    task; every row's record is written to `out` as JSONL when given. None settings take the run's
    (or the defaults'): `prompt_key` / `label_key` are where a row holds its prompt and its ground
    truth (`task.prompt_key` / `task.label_key`, dotted paths allowed), so a run trained on other keys
    reads its test file as it read its training file; `dtype` and `adapter` are a bare model's (a run
    keeps its own). `sections` replace the run's config sections by name (e.g. {"env": cfg.env, "sql":
    cfg.sql}: the limits and environment episodes are played in), so models compared on one file are
    scored alike, whatever their runs said."""
    for name, value, low in (("limit", limit, 1), ("batch_size", batch_size, 1), ("max_new_tokens", max_new_tokens, 1)):
        if value is not None and value < low:
            raise ConfigError(f"{name} must be at least {low}, got {value}")
    if not temperature >= 0:
        raise ConfigError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    for name, key in (("prompt_key", prompt_key), ("label_key", label_key)):
        if key is not None and not (isinstance(key, str) and key.strip()):
            raise ConfigError(f"{name} must name a key of the test file's rows, got {key!r}")
    if adapter is not None and _is_run_dir(model):
        raise ConfigError(f"{model} is a run dir, which evaluates its own checkpoint (--checkpoint); an adapter "
                          f"goes on a bare model: lmrl eval MODEL FILE --adapter DIR")
    test_file = Path(test_file)
    _, first = next(iter_file_rows(test_file))
    file_format = test_file_format(first)
    cfg = _config(model)
    unknown = sorted(set(sections or {}) - {f.name for f in fields(cfg)})
    if unknown:
        raise ConfigError(f"sections={unknown} are not config sections")
    task_options = {k: v for k, v in (("chat", chat), ("system_prompt", system_prompt),
                                      ("prompt_template", prompt_template), ("prompt_key", prompt_key),
                                      ("label_key", label_key)) if v is not None}
    cfg = replace(cfg, **{**(sections or {}), "task": replace(cfg.task, **task_options),
                          "reward": replace(cfg.reward, require_format=cfg.reward.require_format
                                            if require_format is None else require_format)})
    file_format.check(test_file, cfg)  # a bad row fails here, naming it, before the model loads
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"adapter {str(adapter)!r} holds no adapter_config.json (a PEFT adapter dir: what "
                                f"TRL's trainer.save_model or an lmrl LoRA checkpoint writes)")
    policy, checkpoint_dir = _load(model, checkpoint, dtype, adapter)
    policy.to(resolve_device(device, DistInfo()))
    task = file_format.build(cfg, tokenizer=policy.tokenizer, test_file=test_file,
                             max_new_tokens=max_new_tokens or cfg.task.max_new_tokens)
    ids = task.heldout_ids[:limit]
    try:
        records, sums = _answer(policy, task, ids, batch_size, temperature, seed, file_format.row)
    finally:
        close = getattr(task, "close", None) or getattr(getattr(task, "reward", None), "close", None)
        if close is not None:
            close()  # the math checker's server process, an environment's workers
    types: dict[str, list[int]] = {}
    for r in records:
        if r.get("type") is not None:
            types.setdefault(str(r["type"]), []).append(r["correct"])
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(out, records)
    return FileEvaluation(
        model=str(model), checkpoint=None if (checkpoint_dir or adapter) is None else str(checkpoint_dir or adapter),
        file=str(test_file),
        overall=Tally(sum(r["correct"] for r in records), len(records)),
        by_type={name: Tally(sum(flags), len(flags)) for name, flags in sorted(types.items())},
        metrics={name: total / rows if rows else 0.0 for name, (total, rows) in sums.items()},
        completions_file=None if out is None else str(out), records=records)


def default_completions_path(model: str | Path, test_file: str | Path) -> Path:
    """Where `lmrl eval` writes completions when not told: RUN_DIR/eval/<file>.completions.jsonl for a
    run, ./<model>-<file>.completions.jsonl for a model."""
    stem = Path(test_file).name
    for suffix in (".gz", ".jsonl", ".json", ".parquet"):
        stem = stem.removesuffix(suffix)
    if _is_run_dir(model):
        return Path(model) / "eval" / f"{stem}.completions.jsonl"
    return Path(f"{Path(str(model).rstrip('/')).stem}-{stem}.completions.jsonl")


@torch.no_grad()
def _answer(policy, task, ids: torch.Tensor, batch_size: int, temperature: float, seed: int,
            describe) -> tuple[list[dict], dict[str, float]]:
    """A record per row, and each metric's [sum, rows] over the rows that have it (not NaN)."""
    records, sums = [], {}
    generator = torch.Generator().manual_seed(seed)
    for chunk, ro, rewards, exact, extras in scored_batches(policy, task, ids, batch_size=batch_size,
                                                            greedy=temperature == 0, temperature=temperature or 1.0,
                                                            generator=generator):
        _, completions = task.texts(chunk, ro)
        per_row = {"reward": rewards.float().reshape(len(chunk), -1).mean(1), "length": ro.mask.sum(1).float().cpu(),
                   **{name: values.float() for name, values in extras.items()}}
        infos = getattr(ro, "infos", None) or [{}] * len(chunk)  # a multi-turn episode's: its env_error, if any
        for k, i in enumerate(chunk.tolist()):
            prompt, truth, kind = describe(task, i)
            # NaN (an episode whose environment failed, a metric it did not report) is written as null
            record = {"index": i - task.n_train, "prompt": prompt, "completion": completions[k], "ground_truth": truth,
                      "correct": bool(exact[k] > 0.5), **({"type": kind} if kind is not None else {}),
                      **{name: None if math.isnan(v := values[k].item()) else v for name, values in per_row.items()},
                      **({"env_error": infos[k]["env_error"]} if "env_error" in infos[k] else {})}
            records.append(record)
        for name, values in per_row.items():
            key = {"reward": "reward_mean", "length": "length_mean"}.get(name, name)
            total = sums.setdefault(key, [0.0, 0])
            total[0] += values.nansum().item()
            total[1] += int((~values.isnan()).sum())
    return records, sums


def _config(model: str | Path) -> Config:
    """The config a test file is played in: a run dir's own (its saved config.yaml, read before its
    model loads), or for a bare model the default config with the format rule off."""
    if _is_run_dir(model):
        cfg = load_config(Path(model) / "config.yaml", saved_run=True)
        if cfg.model.type != "hf":
            raise ConfigError(f"{model}: its model is the built-in GPT (model.type: gpt); evaluating a test file "
                              f"needs a Hugging Face model (model.type: hf)")
        return cfg
    cfg = Config()
    return replace(cfg, reward=replace(cfg.reward, require_format=False))


def _load(model: str | Path, checkpoint: str, dtype: str, adapter: str | Path | None = None) -> tuple:
    """(policy, checkpoint dir or None) for a run dir, or a bare model with its adapter merged in, if given."""
    if _is_run_dir(model):
        _, path, policy = load_run_model(Path(model), checkpoint)
        return policy, path
    policy, _ = load_hf_policy(str(model), dtype=dtype)
    if adapter is not None:
        from ..models.lora import load_adapter

        load_adapter(policy, adapter, trainable=False)
        policy.model = policy.model.merge_and_unload()  # plain linear layers: the sampling loop's fast path
    policy.eval()
    return policy, None


def _is_run_dir(model: str | Path) -> bool:
    return (Path(model) / "config.yaml").is_file()
