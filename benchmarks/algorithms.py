"""REINFORCE, RLOO, GRPO and PPO from one warm-up checkpoint: held-out accuracy, time, tokens/s.

One run of this script trains the `adder` warm-up once (SFT only), then each algorithm's preset
from exactly those weights (`model.init_from`, `sft.steps=0`), with the same RL step budget,
rollout size and seed, and prints one table:

    python benchmarks/algorithms.py                         # adder, adder-rloo, adder-grpo, adder-ppo
    python benchmarks/algorithms.py --algos adder adder-grpo train.steps=200
    python benchmarks/algorithms.py --threads 1 --parallel 2   # two arms at a time on a 2-core CPU

"first ≥99%" is the first evaluation (every `train.eval_every` steps) at or above 99%; tokens/s
counts prompt + completion tokens of the rollouts over the RL stage's step time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from lmrl.config import TaskConfig, arithmetic_seq_len

QUIET = ["run.progress=false", "run.tensorboard=false", "run.wandb=false"]
ARM = """
import json, sys
from lmrl.config import load_config
from lmrl.train.rl_trainer import RLTrainer
print(json.dumps(RLTrainer(load_config(sys.argv[1], sys.argv[2:])).train()))
"""


def run(preset: str, overrides: list[str], run_dir: Path) -> tuple[dict, float]:
    """One arm in its own process (so arms can run side by side and each gets its own threads)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", ARM, preset, *QUIET, *overrides, f"run.dir={run_dir}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{preset} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), time.perf_counter() - start


def first_reaching(run_dir: Path, threshold: float, sft_steps: int) -> str:
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("eval/accuracy", -1) >= threshold and row["step"] > sft_steps:
            return str(row["step"] - sft_steps)
    return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", nargs="+", default=["adder", "adder-rloo", "adder-grpo", "adder-ppo"])
    ap.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per arm (0 = torch's default)")
    ap.add_argument("--parallel", type=int, default=1, help="arms run at the same time")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every RL arm")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="lmrl-algos-"))
    threads = [f"run.threads={args.threads}"] if args.threads else []

    base = args.algos[0]
    warm, warm_wall = run(base, threads + ["train.steps=0"], out / "warmup")
    ckpt = out / "warmup" / "checkpoints" / f"step_{warm['sft_steps']}"
    print(f"warm-up: {warm['sft_steps']} SFT steps on {warm['sft_examples']} labeled problems -> "
          f"{warm['final_accuracy']:.3f} held-out in {warm_wall:.0f}s ({ckpt})", flush=True)

    def arm(preset: str):
        overrides = threads + ["sft.steps=0", f"model.init_from={ckpt}", *args.overrides]
        summary, wall = run(preset, overrides, out / preset)
        return preset, summary, wall

    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(arm, args.algos))

    header = (f"{'preset':<14}{'algo':<11}{'RL steps':>9}{'start':>8}{'final':>8}{'best':>8}{'first>=99%':>11}"
              f"{'RL s':>8}{'tokens/s':>10}")
    print("\n" + header + "\n" + "-" * len(header))
    for preset, s, wall in results:
        cfg = yaml.safe_load((out / preset / "config.yaml").read_text())
        tokens = s["rl_steps"] * cfg["train"]["rollout_size"] * arithmetic_seq_len(TaskConfig(**cfg["task"]))
        print(f"{preset:<14}{cfg['algo']['name']:<11}{s['rl_steps']:>9}{s['warmup_accuracy']:>8.3f}"
              f"{s['final_accuracy']:>8.3f}{s['best']['accuracy']:>8.3f}{first_reaching(out / preset, 0.99, 0):>11}"
              f"{s['time_s']['rl']:>8.0f}{tokens / max(s['time_s']['rl'], 1e-9):>10.0f}")
    print(f"\nruns in {out}; start = held-out accuracy of the shared warm-up checkpoint")


if __name__ == "__main__":
    main()
