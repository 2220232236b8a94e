"""Training curves from a run's metrics.jsonl: one PNG per family of metrics (loss, accuracy, reward,
KL, entropy, learning rate, evaluation), step on the x axis, one line per key.

    paths = plot_run("runs/adder-grpo")            # runs/adder-grpo/plots/loss.png, reward.png, ...
    paths = plot_run("runs/adder-grpo", out_dir="/tmp/curves")
    $ lmrl plot runs/adder-grpo [--out DIR]

A family with no data makes no file. A key missing from a row is a gap in that key's points, not a
zero; consecutive points of a key are joined, so metrics logged every N steps (eval/*) still read as
lines. Non-finite values (NaN, Infinity) are gaps too.

Rates in [0, 1] (accuracies, *_rate, *_frac) never share an axis with unbounded values: a family
holding both draws them in a second panel below, on a 0-1 scale. A key whose points are the same as
those of a key already drawn on that axis (train/avg_reward and rollout/reward_mean) is not drawn
again: its name joins the drawn line's legend entry, `rollout/reward_mean = train/avg_reward`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Series = dict[str, tuple[list[int], list[float]]]  # key -> (steps, values)


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def is_rate(key: str) -> bool:
    """A fraction in [0, 1]: train/accuracy, rewards/accuracies, eval/format_rate, train/clip_frac,
    and TRL's frac_reward_zero_std, clip_ratio/* and completions/clipped_ratio (not learning_rate)."""
    name = _name(key)
    return (name in ("accuracy", "accuracies", "clipped_ratio") or name.endswith(("_accuracy", "_rate", "_frac"))
            or name.startswith("frac_") or key.startswith("clip_ratio/")) and name != "learning_rate"


def is_reward(key: str) -> bool:
    """A reward, not a rate nor a loss: rewards/chosen, train/avg_reward, eval/reward, and the reward
    model's mean scores of chosen and rejected answers and their margin (rm/chosen_mean, ...)."""
    name = _name(key)
    return not is_rate(key) and not name.endswith("loss") and (
        key.startswith("rewards/") or "reward" in name or name in ("chosen_mean", "rejected_mean", "margin_mean"))


# (file stem, title, y label, which keys belong). A key may belong to more than one family:
# eval/reward is both a reward and an evaluation, eval/accuracy both an accuracy and an evaluation.
FAMILIES: tuple[tuple[str, str, str, Callable[[str], bool]], ...] = (
    ("loss", "Losses", "loss", lambda k: _name(k).endswith("loss")),
    ("accuracy", "Accuracy and rates", "fraction", is_rate),
    ("reward", "Rewards", "reward", is_reward),
    ("kl", "KL divergence", "KL", lambda k: _name(k) == "kl" or _name(k).endswith("_kl")),
    ("entropy", "Entropy", "entropy (nats)", lambda k: "entropy" in _name(k)),
    ("lr", "Learning rate", "learning rate", lambda k: k.endswith("/lr") or k == "learning_rate"),
    # eval/num_tokens is the training tokens so far (TRL's), a count no held-out value shares an axis with
    ("eval", "Evaluation", "value", lambda k: k.startswith("eval/") and k != "eval/num_tokens"),
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


def _same_points(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    """Same steps and same values, a NaN matching a NaN."""
    return a[0] == b[0] and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a[1], b[1]))


def _draw(ax, series: Series, keys: list[str]) -> None:
    """One line per distinct series of `keys` (sorted); a repeat is named in the first one's label."""
    drawn: list[tuple[str, object]] = []  # (key, Line2D)
    for key in sorted(keys):
        twin = next((line for first, line in drawn if _same_points(series[first], series[key])), None)
        if twin is not None:
            twin.set_label(f"{twin.get_label()} = {key}")
            continue
        steps, values = series[key]
        line, = ax.plot(steps, values, label=key, linewidth=1.2,
                        marker="o" if len(steps) <= MARKERS_UP_TO else None, markersize=3)
        drawn.append((key, line))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def family_figures(series: Series, run_name: str) -> list[tuple[str, Figure]]:
    """(file stem, figure) for each family in FAMILIES with a finite point, in FAMILIES order. A
    figure has one axis, or two stacked ones sharing the step axis when the family holds both
    unbounded values (top, the family's y label) and rates (bottom, 0-1)."""
    # No pyplot: a bare Figure on an Agg canvas needs no display and leaves no global state behind.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figures = []
    for stem, title, ylabel, belongs in FAMILIES:
        keys = [k for k in series if belongs(k) and any(not math.isnan(v) for v in series[k][1])]
        if not keys:
            continue
        values, rates = [k for k in keys if not is_rate(k)], [k for k in keys if is_rate(k)]
        panels = [(values, ylabel), (rates, "fraction (0-1)")] if values and rates else [(keys, ylabel)]
        figure = Figure(figsize=(8, 4.5 if len(panels) == 1 else 7), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (panel_keys, panel_ylabel) in zip(axes, panels):
            _draw(ax, series, panel_keys)
            ax.set_ylabel(panel_ylabel)
            if all(is_rate(k) for k in panel_keys):  # all of 0-1, widened only to show a value outside it
                points = [v for k in panel_keys for v in series[k][1] if not math.isnan(v)]
                ax.set_ylim(min(-0.05, *points), max(1.05, *points))
        axes[0].set_title(f"{title}: {run_name}")
        axes[-1].set_xlabel("step")
        if stem == "lr":
            axes[0].ticklabel_format(axis="y", style="sci", scilimits=(0, 0))  # 3e-4, not 0.0003
        figures.append((stem, figure))
    return figures


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write `<family>.png` into out_dir (default `<run_dir>/plots`) for each figure of
    `family_figures` over `<run_dir>/metrics.jsonl`; returns the written paths in FAMILIES order."""
    run_dir = Path(run_dir)
    series = read_metrics(run_dir / "metrics.jsonl")
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    written = []
    for stem, figure in family_figures(series, run_dir.resolve().name):
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{stem}.png"
        _save_png_atomically(figure, path)
        written.append(path)
    return written


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `lmrl plot RUN_DIR [--out DIR]`."""
    p = subparsers.add_parser("plot", help="PNG curves (loss, accuracy, reward, KL, entropy, LR, eval) from a run's "
                                           "metrics")
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
