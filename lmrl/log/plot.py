"""Training curves from a run's metrics.jsonl: one PNG per family of metrics (loss, reward, KL,
entropy, learning rate, evaluation), step on the x axis, one line per key.

    paths = plot_run("runs/adder-grpo")            # runs/adder-grpo/plots/loss.png, reward.png, ...
    paths = plot_run("runs/adder-grpo", out_dir="/tmp/curves")
    $ lmrl plot runs/adder-grpo [--out DIR]

A family with no data makes no file. A key missing from a row is a gap in that key's points, not a
zero; consecutive points of a key are joined, so metrics logged every N steps (eval/*) still read as
lines. Non-finite values (NaN, Infinity) are gaps too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

Series = dict[str, tuple[list[int], list[float]]]  # key -> (steps, values)


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


# (file stem, title, y label, which keys belong). A key may belong to more than one family:
# eval/reward_mean is both a reward and an evaluation.
FAMILIES: tuple[tuple[str, str, str, Callable[[str], bool]], ...] = (
    ("loss", "Losses", "loss", lambda k: _name(k).endswith("loss")),
    ("reward", "Rewards", "reward",
     lambda k: k.startswith("rewards/") or ("reward" in _name(k) and not _name(k).endswith("loss"))),
    ("kl", "KL divergence", "KL", lambda k: _name(k) == "kl" or _name(k).endswith("_kl")),
    ("entropy", "Entropy", "entropy (nats)", lambda k: "entropy" in _name(k)),
    ("lr", "Learning rate", "learning rate", lambda k: k.endswith("/lr")),
    ("eval", "Evaluation", "value", lambda k: k.startswith("eval/")),
)
MARKERS_UP_TO = 40  # points: short series (evaluations, quick runs) get a dot per point


def read_metrics(path: str | os.PathLike) -> Series:
    """Every numeric key of a metrics.jsonl as (steps, values), in file order. Blank lines are
    skipped; a line that is not a JSON object with an integer "step" is a ValueError naming
    `path:line`. Non-numeric values (and booleans) are left out."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path} (is this a run directory?)")
    series: Series = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err})") from None
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                raise ValueError(f"{path}:{number}: expected an object with an integer \"step\", "
                                 f"got {line.strip()[:80]}")
            for key, value in row.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value) if math.isfinite(value) else math.nan)
    return series


def _save_png_atomically(figure, path: Path) -> None:
    """Render to a temporary file beside `path`, then os.replace: a reader (an image viewer
    refreshing while training runs) never sees half a PNG."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            figure.savefig(f, format="png", dpi=100)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write `<family>.png` into out_dir (default `<run_dir>/plots`) for each family in FAMILIES
    with data in `<run_dir>/metrics.jsonl`; returns the written paths in FAMILIES order."""
    run_dir = Path(run_dir)
    series = read_metrics(run_dir / "metrics.jsonl")
    # No pyplot: a bare Figure on an Agg canvas needs no display and leaves no global state behind.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    written = []
    for stem, title, ylabel, belongs in FAMILIES:
        keys = [k for k in series if belongs(k) and any(not math.isnan(v) for v in series[k][1])]
        if not keys:
            continue
        figure = Figure(figsize=(8, 4.5), layout="constrained")
        FigureCanvasAgg(figure)
        ax = figure.add_subplot()
        for key in sorted(keys):
            steps, values = series[key]
            ax.plot(steps, values, label=key, linewidth=1.2, marker="o" if len(steps) <= MARKERS_UP_TO else None,
                    markersize=3)
        ax.set(title=f"{title}: {run_dir.resolve().name}", xlabel="step", ylabel=ylabel)
        if stem == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))  # 3e-4, not 0.0003
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{stem}.png"
        _save_png_atomically(figure, path)
        written.append(path)
    return written


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `lmrl plot RUN_DIR [--out DIR]`."""
    p = subparsers.add_parser("plot", help="PNG curves (loss, reward, KL, entropy, LR, eval) from a run's metrics")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="output dir (default RUN_DIR/plots)")
    return p


def run(args: argparse.Namespace) -> int:
    """Print each written file; exit status 1 (and say so) when the metrics hold nothing to plot
    or a line is malformed."""
    try:
        paths = plot_run(args.run_dir, args.out)
    except ValueError as err:
        print(f"lmrl plot: error: {err}", file=sys.stderr)
        return 1
    if not paths:
        print(f"lmrl plot: nothing to plot in {Path(args.run_dir) / 'metrics.jsonl'}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0
