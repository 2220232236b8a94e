"""RL throughput by rollout placement: in the learner's process, overlapped with the update, and on
Ray rollout workers (with and without overlap), from one preset and seed.

    python benchmarks/scale_throughput.py                          # adder, 40 RL steps per arm
    python benchmarks/scale_throughput.py --steps 20 --workers 2 train.rollout_size=256
    python benchmarks/scale_throughput.py --arms local,overlap    # no Ray

Each arm trains the preset's RL stage from the same initial weights (no warm-up, no evaluation in
the timed steps) and reports samples/s = completions per step / median step time, with the
step's rollout and update times. The first 3 steps (allocation, Ray actor start-up, first weight
sync) are left out. Overlap arms train one step off-policy (`rollout/staleness` = 1), so they are
faster per step but not the same run. On a machine with few cores every arm competes for the same
cores: the table is a measurement of this machine, not of the design's ceiling.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lmrl.config import load_config
from lmrl.train.rl_trainer import RLTrainer

QUIET = ["run.progress=false", "run.tensorboard=false", "run.wandb=false", "sft.steps=0",
         "train.log_every=1", "train.ckpt_every=100000", "eval.size=50"]
ARMS = {
    "local": [],
    "overlap": ["rollout.overlap=true"],
    "ray": ["distributed.backend=ray", "rollout.workers={workers}"],
    "ray+overlap": ["distributed.backend=ray", "rollout.workers={workers}", "rollout.overlap=true"],
}
SKIP = 3  # warm-up steps left out of the medians


def run_arm(preset: str, overrides: list[str], run_dir: Path, steps: int) -> dict:
    cfg = load_config(preset, QUIET + overrides + [f"train.steps={steps}", f"train.eval_every={steps}",
                                                   f"run.dir={run_dir}"])
    start = time.perf_counter()
    RLTrainer(cfg).train()
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    rows = [r for r in rows if "time/step_s" in r][SKIP:]
    med = {k: statistics.median(r[k] for r in rows) for k in ("time/step_s", "time/rollout_s", "time/update_s")}
    return {"samples_per_s": cfg.train.rollout_size / med["time/step_s"], "step_s": med["time/step_s"],
            "rollout_s": med["time/rollout_s"], "update_s": med["time/update_s"], "wall_s": wall,
            "staleness": max(r.get("rollout/staleness", 0) for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="adder")
    ap.add_argument("--steps", type=int, default=40, help="RL steps per arm")
    ap.add_argument("--workers", type=int, default=2, help="Ray rollout workers in the ray arms")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    ap.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every arm")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="lmrl-scale-"))
    arms = args.arms.split(",")
    if any(a.startswith("ray") for a in arms) and importlib.util.find_spec("ray") is None:
        print("ray is not installed (pip install 'lmrl[ray]'): leaving out the ray arms")
        arms = [a for a in arms if not a.startswith("ray")]
    results = {}
    for arm in arms:
        overrides = [o.format(workers=args.workers) for o in ARMS[arm]] + args.overrides
        results[arm] = run_arm(args.preset, overrides, out / arm.replace("+", "_"), args.steps)
        print(f"{arm}: {results[arm]['samples_per_s']:.0f} samples/s", flush=True)

    base = results.get("local", next(iter(results.values())))["samples_per_s"]
    print(f"\npreset {args.preset} | {args.steps} RL steps per arm | {torch.get_num_threads()} torch threads | "
          f"{args.workers} Ray workers | medians over steps {SKIP + 1}..{args.steps}")
    print(f"{'arm':<12} {'samples/s':>10} {'vs local':>9} {'step s':>8} {'rollout s':>10} {'update s':>9} "
          f"{'staleness':>9} {'wall s':>7}")
    for arm, r in results.items():
        print(f"{arm:<12} {r['samples_per_s']:>10.0f} {r['samples_per_s'] / base:>8.2f}x {r['step_s']:>8.3f} "
              f"{r['rollout_s']:>10.3f} {r['update_s']:>9.3f} {r['staleness']:>9.0f} {r['wall_s']:>7.0f}")


if __name__ == "__main__":
    main()
