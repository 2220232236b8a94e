"""The main job's speed: presets (or one preset with overrides) run one after the other in the same
benchmark run, each in its own process: wall time to the first held-out evaluation at or above the
target, final held-out accuracy, and RL's share of it.

    python benchmarks/main_job.py                                  # adder vs ...: arms from --arm
    python benchmarks/main_job.py --arm adder --arm "adder model.n_embd=128" --target 0.99
    python benchmarks/main_job.py --arm multiplier --target 0.98 --out /tmp/mult

An arm is a preset name followed by overrides, as `lmrl train` takes them. Each arm reports: the run's
wall time (the process, start to exit, model build and every evaluation included), the run's own
time to the first evaluation at or above `--target` (`time/elapsed_s` of that metrics row: from the
trainer's start, the warm-up and the evaluations included), the held-out accuracy after the
warm-up and at the end, and RL's gain (final - after warm-up); the ratio column is each arm's time
to target over the first arm's. Targets of the speed issue: the adder at >= 99% held-out with RL
>= +30 points in <= 2 minutes wall, <= 0.4x the current preset's time; the multiplier at >= 98% in
<= 15 minutes. Run it on an otherwise idle machine: another busy process skews one arm more than
the other.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUIET = ["run.progress=false", "run.tensorboard=false", "--no_wandb"]


def run_arm(arm: str, run_dir: Path) -> dict:
    """Trains one arm in a child process and reads what it wrote."""
    preset, *overrides = shlex.split(arm)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "lmrl", "train", preset, f"run.dir={run_dir}", *QUIET, *overrides],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"arm {arm!r} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"arm": arm, "wall_s": wall, "rows": rows, "summary": summary}


def time_to(rows: list[dict], target: float) -> tuple[float | None, int | None]:
    """(run time in seconds, step) of the first evaluation at or above `target`, or (None, None)."""
    for row in rows:
        if row.get("eval/accuracy", -1.0) >= target:
            return row["time/elapsed_s"], row["step"]
    return None, None


def report(results: list[dict], target: float) -> list[dict]:
    table = []
    for r in results:
        s = r["summary"]
        seconds, step = time_to(r["rows"], target)
        table.append({"arm": r["arm"], "wall_s": round(r["wall_s"], 1),
                      "to_target_s": None if seconds is None else round(seconds, 1), "to_target_step": step,
                      "warmup_accuracy": s["warmup_accuracy"], "final_accuracy": s["final_accuracy"],
                      "rl_gain": s["rl_gain"]})
    base = table[0]["to_target_s"]
    for row in table:
        row["ratio"] = None if base is None or row["to_target_s"] is None else round(row["to_target_s"] / base, 3)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", default=None,
                        help="a preset and its overrides, quoted (repeatable; default: adder)")
    parser.add_argument("--target", type=float, default=0.99, help="held-out accuracy to time (default 0.99)")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the table here too")
    args = parser.parse_args()
    arms = args.arm or ["adder"]
    root = args.out or Path(tempfile.mkdtemp(prefix="lmrl-main-job-"))
    results = [run_arm(arm, root / f"arm{i}") for i, arm in enumerate(arms)]
    table = report(results, args.target)
    width = max(len("arm"), *(len(row["arm"]) for row in table))
    print(f"{'arm':{width}} {'wall s':>8} {'to ' + format(args.target, '.0%') + ' s':>10} {'step':>6} "
          f"{'warm-up':>8} {'final':>7} {'RL gain':>8} {'ratio':>6}")
    for row in table:
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        print(f"{row['arm']:{width}} {row['wall_s']:8.1f} {fmt(row['to_target_s'], '10.1f')} "
              f"{fmt(row['to_target_step'], '6d')} {fmt(row['warmup_accuracy'], '8.3f')} "
              f"{row['final_accuracy']:7.3f} {fmt(row['rl_gain'], '+8.3f')} {fmt(row['ratio'], '6.3f')}")
    if args.json:
        args.json.write_text(json.dumps({"target": args.target, "arms": table}, indent=2))


if __name__ == "__main__":
    main()
