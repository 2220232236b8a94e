"""Where metrics go: one `MetricsLogger.log(step, metrics)` call fans out to JSONL, TensorBoard,
Weights & Biases and a one-line console summary.

    log = setup_logging(run_dir)
    with MetricsLogger([JsonlSink(run_dir / "metrics.jsonl"), TensorBoardSink(run_dir / "tb"),
                        ConsoleSink(log, total_steps=200)]) as metrics:
        metrics.log(50, {"train/loss": 0.234, "train/lr": 1e-4}, stage="rl")

Every sink has `log(step, metrics, **context)` and `close()`. `context` carries display hints
(`stage`, `stage_step`, `stage_total`) that only the console reads.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

from tqdm import tqdm

WANDB_MISSING = ("Weights & Biases logging needs the 'wandb' extra: pip install 'lmrl[wandb]' "
                 "(or pass --no-wandb)")


class Sink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float], **context: Any) -> None: ...
    def close(self) -> None: ...


def to_number(key: str, value: Any) -> int | float:
    """A metric as a plain Python number: tensors and numpy scalars via `.item()`; ints stay ints
    (counts read better as 3 than 3.0), everything else becomes float."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}") from None


class JsonlSink:
    """Appends `{"step": step, **metrics}` as one line per call and flushes it, so a killed process
    loses nothing already logged. Non-finite values are written as Python's json writes them
    (NaN, Infinity): not strict JSON, but `json.loads` and pandas read them back."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float], **context: Any) -> None:
        row = {"step": step, **{k: to_number(k, v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def truncate_jsonl(path: str | os.PathLike, after_step: int | None) -> int:
    """Rewrite `path` keeping only the lines with step <= after_step, so a run resumed from the
    checkpoint at `after_step` ends with the same file as one that never stopped. `after_step=None`
    (a run restarting with no checkpoint to resume from) keeps no line, step 0 included: the run
    writes them all again. Lines that do not parse (a write torn by a kill) are dropped. Atomic:
    written to a temporary file beside it, then `os.replace`d. A missing file is left missing.
    Returns the number of lines kept."""
    path = Path(path)
    if not path.exists():
        return 0
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if after_step is not None and step <= after_step:
            kept.append(line + "\n")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(kept)


class TensorBoardSink:
    """One scalar per metric key. `purge_step` (the step a resumed run restarts after, plus one)
    tells TensorBoard to hide events the interrupted run wrote from that step on."""

    def __init__(self, log_dir: str | os.PathLike, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # slow import: only when asked for

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, float], **context: Any) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, to_number(key, value), global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    """A Weights & Biases run (offline by default: `wandb sync` uploads it later): metrics, and tables
    (`log_table`: the completions log's)."""

    def __init__(self, project: str, name: str | None, config: dict, dir: str | os.PathLike, mode: str = "offline"):
        try:
            import wandb
        except ImportError as err:
            raise ImportError(WANDB_MISSING) from err
        Path(dir).mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(project=project, name=name, config=config, dir=str(dir), mode=mode)

    def log(self, step: int, metrics: Mapping[str, float], **context: Any) -> None:
        self.run.log({k: to_number(k, v) for k, v in metrics.items()}, step=step)

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """`rows` (numbers, texts, None) as the `wandb.Table` `name` at `step`; its columns are every key
        of the rows, in order of first appearance, a row's missing ones None."""
        columns = list(dict.fromkeys(key for row in rows for key in row))
        table = self.wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        self.run.log({name: table}, step=step)

    def close(self) -> None:
        self.run.finish()


# The console line: one field per family of metric, whatever the trainer. A family is (format,
# {key: label}), the keys in order of preference: the first key present is shown, with its label.
# Every trainer's loss, accuracy-like value, reward-like value and learning rate fit these four.
# lmrl's names come first; TRL's (loss, reward, learning_rate), which lmrl's trainers log beside
# them, close each family, so a line reads the same whichever a run has.
CONSOLE_FIELDS: tuple[tuple[str, dict[str, str]], ...] = (
    (".3f", dict.fromkeys(("train/policy_loss", "train/loss", "sft/loss", "dpo/loss", "rm/loss", "loss"), "Loss")),
    (".3f", dict.fromkeys(("train/accuracy", "sft/accuracy", "sft/token_accuracy", "rewards/accuracies",
                           "rm/accuracy"), "Acc")),
    (".3f", {"train/avg_reward": "Reward", "rewards/margins": "Margin", "rm/margin_mean": "Margin",
             "reward": "Reward"}),
    (".2e", dict.fromkeys(("train/lr", "sft/lr", "dpo/lr", "rm/lr", "learning_rate"), "LR")),
)
# The held-out families, shown together as the last field: `Eval: loss 0.512, acc 0.750, margin 0.210`.
# DPO's held-out margin is eval/rewards/margins, the reward model's eval/margin_mean (evaluation
# drops the trainer's prefix from its training keys).
EVAL_FIELDS: tuple[tuple[str, dict[str, str]], ...] = (
    (".3f", {"eval/loss": "loss"}),
    (".3f", {"eval/accuracy": "acc"}),
    (".3f", {"eval/reward": "reward", "eval/rewards/margins": "margin", "eval/margin_mean": "margin"}),
)


def _pick(metrics: Mapping[str, float], families) -> list[tuple[str, str]]:
    """(label, formatted value) of the first key present in each family, in family order."""
    shown = []
    for fmt, labels in families:
        key = next((k for k in labels if k in metrics), None)
        if key is not None:
            shown.append((labels[key], f"{to_number(key, metrics[key]):{fmt}}"))
    return shown


class ConsoleSink:
    """One line per call, e.g. `[rl] Step 50/200 | Loss: 0.234 | Acc: 0.750 | Reward: 0.750 | LR: 1.00e-04`,
    from the keys in CONSOLE_FIELDS, then `| Eval: acc 0.800, reward 0.800` when the call carries
    EVAL_FIELDS keys: at most five fields, whichever trainer logs. Other keys go to the other sinks
    only, and a call with none of them prints nothing. Context `stage` adds the tag;
    `stage_step`/`stage_total` replace the global step and `total_steps` in the count."""

    def __init__(self, logger: logging.Logger, total_steps: int | None = None):
        self.logger = logger
        self.total_steps = total_steps

    def format(self, step: int, metrics: Mapping[str, float], *, stage: str | None = None,
               stage_step: int | None = None, stage_total: int | None = None, **context: Any) -> str | None:
        fields = [f"{label}: {value}" for label, value in _pick(metrics, CONSOLE_FIELDS)]
        held_out = _pick(metrics, EVAL_FIELDS)
        if held_out:
            fields.append("Eval: " + ", ".join(f"{label} {value}" for label, value in held_out))
        if not fields:
            return None
        shown, total = (step, self.total_steps) if stage_step is None else (stage_step, stage_total)
        count = f"Step {shown}" if total is None else f"Step {shown}/{total}"
        tag = f"[{stage}] " if stage else ""
        return tag + " | ".join([count, *fields])

    def log(self, step: int, metrics: Mapping[str, float], **context: Any) -> None:
        line = self.format(step, metrics, **context)
        if line is not None:
            self.logger.info(line)

    def close(self) -> None:
        pass


class TqdmConsoleHandler(logging.Handler):
    """Writes records through `tqdm.write`, which lifts any progress bar out of the way and redraws
    it below. The stream is looked up at each write, so redirected or captured stderr is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


LOG_FORMAT = logging.Formatter("%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S")


def setup_logging(run_dir: str | os.PathLike, name: str = "lmrl") -> logging.Logger:
    """The logger `name` at INFO, writing to stderr (tqdm-safe) and appending to run_dir/train.log.
    Idempotent: a second call replaces the handlers an earlier call added (closing its file), so
    nothing is printed twice. Records do not propagate to the root logger, for the same reason."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(name)
    for handler in [h for h in logger.handlers if getattr(h, "_lmrl", False)]:
        logger.removeHandler(handler)
        handler.close()
    for handler in (TqdmConsoleHandler(), logging.FileHandler(run_dir / "train.log", mode="a", encoding="utf-8")):
        handler.setFormatter(LOG_FORMAT)
        handler._lmrl = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class MetricsLogger:
    """Fans each `log(step, metrics, **context)` out to every sink; `close()` closes them all (the
    first error, if any, is raised after the rest are closed). Also a context manager."""

    def __init__(self, sinks: Iterable[Sink]):
        self.sinks = list(sinks)

    def log(self, step: int, metrics: Mapping[str, float], **context: Any) -> None:
        metrics = {k: to_number(k, v) for k, v in metrics.items()}  # convert tensors once, not per sink
        for sink in self.sinks:
            sink.log(step, metrics, **context)

    def close(self) -> None:
        first_error = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:  # noqa: BLE001 — keep closing; a lost TB flush must not lose the JSONL
                first_error = first_error or err
        self.sinks = []
        if first_error is not None:
            raise first_error

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(total: int, initial: int = 0, desc: str | None = None, enabled: bool = True) -> tqdm:
    """A step progress bar that starts at `initial` (for resumed runs); `enabled=False` (other
    ranks, run.progress=false) turns it into a no-op with the same interface, as does a stderr
    that is not a terminal (CI logs, redirected output)."""
    return tqdm(total=total, initial=initial, desc=desc, disable=None if enabled else True, dynamic_ncols=True,
                unit="step")
