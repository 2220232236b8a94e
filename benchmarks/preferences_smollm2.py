"""Preference learning on SmolLM2-135M-Instruct, end to end on the CPU: the reward model, DPO, and
PPO against the reward model, each from its preset, then one table.

    python benchmarks/preferences_smollm2.py                   # rm-smollm2, dpo-smollm2, ppo-rm-smollm2
    python benchmarks/preferences_smollm2.py --out /tmp/pref   # keep the runs
    python benchmarks/preferences_smollm2.py --skip-ppo train.max_steps=10

Targets (issue "Preference learning and RLHF"): the reward model and DPO each reach >= 90% preference
accuracy on the held-out synthetic pairs; PPO raises the mean reward-model score of greedy
completions to held-out prompts. The reward model's accuracy is also split by kind of pair
(right vs wrong sums; concise vs rambling replies), scored again from the exported model.
Overrides after the flags go to the reward-model and DPO runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUIET = ["run.progress=false", "run.tensorboard=false"]


def train(preset: str, run_dir: Path, overrides: list[str], cwd: Path) -> tuple[dict, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lmrl", "train", preset, f"run.dir={run_dir}", *QUIET, *overrides],
                         cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{preset} failed:\n{out.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text()), time.perf_counter() - start


def accuracy_by_kind(reward_model: Path, test_file: Path) -> dict[str, float]:
    from lmrl.tasks.rewards import RewardModelScorer
    from lmrl.tasks.preference_data import read_preference

    scorer = RewardModelScorer(reward_model)
    pairs = read_preference(test_file)
    chosen = scorer([p.prompt for p in pairs], [p.chosen for p in pairs])
    rejected = scorer([p.prompt for p in pairs], [p.rejected for p in pairs])
    kinds: dict[str, list[bool]] = {}
    for p, c, r in zip(pairs, chosen, rejected):
        kind = "arithmetic" if "=" in p.chosen else "concise"
        kinds.setdefault(kind, []).append(c > r)
    return {k: (sum(v) / len(v), len(v)) for k, v in sorted(kinds.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="where the runs and data go (default: a temp dir)")
    ap.add_argument("--skip-ppo", action="store_true")
    args, overrides = ap.parse_known_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="lmrl-pref-"))
    root.mkdir(parents=True, exist_ok=True)

    rm, rm_s = train("rm-smollm2", root / "rm", overrides, root)
    dpo, dpo_s = train("dpo-smollm2", root / "dpo", overrides, root)
    rows = [("reward model", "rm-smollm2", rm["steps_done"], "-", f"{rm['final']['eval/accuracy']:.3f}", rm_s),
            ("DPO", "dpo-smollm2", dpo["steps_done"], "-", f"{dpo['final']['eval/accuracy']:.3f}", dpo_s)]
    if not args.skip_ppo:
        ppo, ppo_s = train("ppo-rm-smollm2", root / "ppo", [f"reward.model={rm['exported']}"], root)
        rows.append(("PPO (reward = RM)", "ppo-rm-smollm2", ppo["steps_done"],
                     f"{ppo['start_eval']['eval/reward']:.3f}", f"{ppo['final_eval']['eval/reward']:.3f}", ppo_s))

    print(f"\n{'stage':<18} {'preset':<15} {'steps':>5} {'before':>8} {'after':>8} {'wall s':>7}")
    print("-" * 66)
    for stage, preset, steps, before, after, secs in rows:
        print(f"{stage:<18} {preset:<15} {steps:>5} {before:>8} {after:>8} {secs:>7.0f}")
    print("\nRM and DPO: preference accuracy on the held-out pairs (after the run; the best checkpoint is the exported one)."
          "\nPPO: mean reward-model score of greedy completions to the held-out prompts, before and after RL.")
    by_kind = accuracy_by_kind(Path(rm["exported"]), root / "data" / "preferences" / "test.jsonl")
    print("reward model accuracy by kind: " + ", ".join(f"{k} {a:.3f} ({n} pairs)" for k, (a, n) in by_kind.items()))
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
