"""Does GRPO + LoRA teach SmolLM2-135M-Instruct 2-digit addition asked in chat form?

Runs the `math-grpo-smollm2` preset (overrides allowed) and prints one table: held-out accuracy of
the base model (evaluated before the first update, same prompts and scoring) and after RL, the
format rate, steps and wall time. Target: >= 30 points over the base model within 30 minutes on a
2-core CPU.

    python benchmarks/math_grpo_smollm2.py [--out runs/bench-math] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lmrl import RLTrainer, load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench-math-grpo-smollm2", help="run dir")
    parser.add_argument("overrides", nargs="*", help="config overrides such as train.steps=40")
    args = parser.parse_args()
    cfg = load_config("math-grpo-smollm2", [f"run.dir={args.out}", "run.progress=false", *args.overrides])
    start = time.perf_counter()
    summary = RLTrainer(cfg).train()
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (Path(args.out) / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    fmt = evals[-1].get("eval/format_rate", float("nan")) if evals else float("nan")
    base, final = summary["warmup_accuracy"], summary["final_accuracy"]
    print(f"\n| model | held-out | base acc | final acc | gain (points) | format rate | steps | wall |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| SmolLM2-135M-Instruct + LoRA r={cfg.lora.r}, GRPO G={cfg.algo.group_size} | {summary['eval_size']} "
          f"| {base:.3f} | {final:.3f} | {100 * (final - base):+.1f} | {fmt:.3f} | {summary['steps_done']} | {wall / 60:.1f} min |")
    print("\naccuracy by step: " + ", ".join(f"{r['step']}: {r['eval/accuracy']:.3f}" for r in evals))


if __name__ == "__main__":  # math-verify's worker processes import this script
    main()
