"""The completions log of an RL run (TRL's `log_completions`): each logged step's sampled completions
appended to `RUN_DIR/completions.jsonl`, one JSON object per completion, flushed after each step; a few
of them printed to the run log; with Weights & Biases on, the step's rows as its `completions` table.

    log = CompletionsLog(run_dir / COMPLETIONS_FILE, logger, to_print=2, wandb=wandb_sink)
    log.log(10, [{"step": 10, "prompt": "What is 2+2?", "completion": "4", "reward": 1.0}, ...])
    log.close()

A row is a dict the trainer makes (`lmrl.train.rl_trainer.completion_rows`): `step`, `prompt`,
`completion`, `reward` and, where the run has them, `rewards` ({reward function: reward}),
`advantage`, `extra` ({log_extra column: value}) and for a multi-turn episode `messages` (its
conversation), `turns`, `truncated` and `env_error` (its environment's failure, None when it ran).
A value JSON has no type for is written as its `tolist()` (tensors, numpy values) or else its `str`;
a NaN or infinite number as null, so every line is standard JSON."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Sequence

from .sinks import WandbSink

COMPLETIONS_FILE = "completions.jsonl"
TABLE = "completions"  # the Weights & Biases table's name, as TRL's
# characters of a printed prompt and completion: their start and end, the middle cut
PROMPT_CHARS, COMPLETION_CHARS = 160, 320


class CompletionsLog:
    """Appends rows to the JSONL file at `path`, prints `to_print` of each step's to `logger`, and
    hands them to `wandb` as a table when one is given."""

    def __init__(self, path: str | os.PathLike, logger: logging.Logger, *, to_print: int = 0,
                 wandb: WandbSink | None = None):
        self.logger, self.to_print, self.wandb = logger, to_print, wandb
        self._file = open(Path(path), "a", encoding="utf-8")

    def log(self, step: int, rows: Sequence[dict], *, title: str = "") -> None:
        """Writes and prints step `step`'s `rows`; `title` heads the printed ones (default: the step)."""
        self._file.writelines(json.dumps(_finite(row), default=_plain) + "\n" for row in rows)
        self._file.flush()
        if self.to_print and rows:
            self.logger.info(format_completions(title or f"Step {step}", rows, self.to_print))
        if self.wandb is not None:
            self.wandb.log_table(step, TABLE, [table_row(row) for row in rows])

    def close(self) -> None:
        self._file.close()


def _plain(value: Any) -> Any:
    """A value JSON has no type for: a tensor's or numpy value's `tolist()`, else its str."""
    return _finite(value.tolist()) if hasattr(value, "tolist") else str(value)


def _finite(value: Any) -> Any:
    """`value` with each NaN or infinite float inside it (dicts, lists, tuples) as None: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def table_row(row: dict) -> dict:
    """`row` as one line of a table: `rewards` and `extra` one column per entry (`rewards/<name>`,
    `extra/<column>`), a value that is not a number, text or None as JSON text."""
    flat = {}
    for key, value in row.items():
        if key in ("rewards", "extra"):
            flat.update({f"{key}/{name}": _cell(v) for name, v in value.items()})
        else:
            flat[key] = _cell(value)
    return flat


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float)):
        return value
    return json.dumps(value, default=_plain)


def format_completions(title: str, rows: Sequence[dict], n: int) -> str:
    """`n` of a step's rows, spread evenly over them (so several prompts' groups show), as lines of
    the run log under `title`: the row's numbers, then its prompt and completion, each on one line."""
    shown = rows if n >= len(rows) else [rows[i * len(rows) // n] for i in range(n)]
    lines = [f"{title}: {len(shown)} of {len(rows)} completions"]
    for row in shown:
        lines += ["  " + " | ".join(_numbers(row)),
                  f"    prompt:     {_clip(row['prompt'], PROMPT_CHARS)}",
                  f"    completion: {_clip(row['completion'], COMPLETION_CHARS)}"]
    return "\n".join(lines)


def _numbers(row: dict) -> list[str]:
    """'reward 1.000', each reward function's, the advantage and the extra columns, as printed."""
    fields = [f"reward {_number(row['reward'])}"]
    if row.get("rewards"):
        fields.append(", ".join(f"{name} {_number(v)}" for name, v in row["rewards"].items()))
    if "advantage" in row:
        fields.append(f"advantage {_number(row['advantage'])}")
    fields += [f"{column}: {_clip(str(v), PROMPT_CHARS)}" for column, v in row.get("extra", {}).items()]
    return fields


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _clip(text: str, width: int) -> str:
    """`text` on one line (newlines shown as ⏎), its middle cut to keep `width` characters."""
    text = text.replace("\n", "⏎")
    if len(text) <= width:
        return text
    half = (width - 3) // 2
    return f"{text[:half]} … {text[-half:]}"
