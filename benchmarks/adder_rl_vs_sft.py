"""Does RL do the work? SFT only vs SFT + RL at the same label budget and the same wall time.

One run of this script trains, from the same preset (default `adder`) and seed:

  (a) SFT only        the warm-up alone, given as many steps as fit in arm (b)'s total time;
  (b) SFT + REINFORCE the preset as it is: the warm-up, then REINFORCE on the reward alone;
  (c) SFT + GRPO      the `<preset>-grpo` preset where one exists, stopped at (b)'s wall time
                      (`train.time_limit_min`), so its cosine may not have run out.

Every arm sees the same `sft.examples` labeled problems (the same draw: it depends only on the
seed) and is scored on the same 1,000 held-out problems. Arm (a)'s step count is arm (b)'s wall
time divided by (b)'s time per warm-up step, corrected once by the wall time that guess took, so
both spend the same time (within ~5%); the table shows the times actually taken.

    python benchmarks/adder_rl_vs_sft.py                       # the adder preset
    python benchmarks/adder_rl_vs_sft.py --preset multiplier
    python benchmarks/adder_rl_vs_sft.py train.steps=100       # overrides apply to every arm
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lmrl.config import list_presets, load_config
from lmrl.train.rl_trainer import RLTrainer

QUIET = ["run.progress=false", "run.tensorboard=false", "run.wandb=false"]


def run_arm(preset: str, overrides: list[str], run_dir: Path) -> tuple[dict, float]:
    cfg = load_config(preset, QUIET + overrides + [f"run.dir={run_dir}"])
    start = time.perf_counter()
    summary = RLTrainer(cfg).train()
    return summary, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="adder")
    ap.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every arm")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="lmrl-bench-"))

    def sft_only(steps: int, name: str) -> tuple[dict, float]:
        return run_arm(args.preset, args.overrides + [f"sft.steps={steps}", "train.steps=0"], out / name)

    rows = []
    rl, rl_wall = run_arm(args.preset, args.overrides, out / "sft_reinforce")
    # SFT only, for as long as (b) took: a first guess from (b)'s warm-up speed, then one correction
    # from the guess's own wall time (a run's first steps are slower than its later ones).
    sft_steps = max(int(rl_wall * rl["sft_steps"] / rl["time_s"]["sft"]), rl["sft_steps"])
    sft, sft_wall = sft_only(sft_steps, "sft_only_guess")
    if abs(sft_wall - rl_wall) > 0.05 * rl_wall:
        rows.append(("(a') SFT only, 1st try", sft, sft_wall, f"{sft_steps} SFT"))
        sft_steps = int(sft_steps * rl_wall / sft_wall)
        sft, sft_wall = sft_only(sft_steps, "sft_only")
    rows.insert(0, ("(a) SFT only", sft, sft_wall, f"{sft_steps} SFT"))
    rows.append(("(b) SFT + REINFORCE", rl, rl_wall, f"{rl['sft_steps']} SFT + {rl['steps_done']} RL"))
    grpo = f"{args.preset}-grpo"
    if grpo in list_presets():
        # The same wall time as (b): the run stops RL there (train.time_limit_min), then evaluates.
        limit = [f"train.time_limit_min={rl_wall / 60:.3f}"]
        g, g_wall = run_arm(grpo, args.overrides + limit, out / "sft_grpo")
        rows.append(("(c) SFT + GRPO", g, g_wall, f"{g['sft_steps']} SFT + {g['steps_done']} RL"))
    else:
        rows.append(("(c) SFT + GRPO", None, None, f"no {grpo} preset yet"))

    print(f"\n{args.preset}: {rl['sft_examples']} labeled problems for every arm, "
          f"{rl['eval_size']} held-out problems, runs in {out}\n")
    header = f"{'arm':<24}{'steps':<20}{'after warm-up':>14}{'final':>8}{'wall s':>9}{'vs (a)':>9}"
    print(header)
    print("-" * len(header))
    base = rows[0][1]["final_accuracy"]
    for name, s, wall, steps in rows:
        if s is None:
            print(f"{name:<24}{steps}")
            continue
        gain = s["final_accuracy"] - base
        print(f"{name:<24}{steps:<20}{s['warmup_accuracy']:>14.3f}{s['final_accuracy']:>8.3f}{wall:>9.0f}"
              f"{gain:>+9.3f}")


if __name__ == "__main__":
    main()
