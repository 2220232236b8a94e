"""Does REINFORCE + LoRA teach SmolLM2-135M-Instruct to answer database questions as a DBBench agent?

Runs the `sql-agent-smollm2` preset (overrides allowed) from a fresh run dir and prints one table:
success rate per skill on the held-out procedural tasks (the same tasks, greedy decoding) for the
base model (the adapter as initialised, i.e. the base model) and for the trained adapter, with
wall times and episode throughput (episodes per minute, training rollouts and evaluation).

    python benchmarks/sql_agent.py [--out runs/bench-sql-agent] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from lmrl import RLTrainer, load_config
from lmrl.models import build_model
from lmrl.tasks import build_task
from lmrl.tasks.sql.agent_task import per_skill_success


class EvalRecorder:
    """Wraps the task so every greedy (evaluation) pass is kept: the trainer evaluates the base
    model before its first update and the trained one after its last, on the same held-out tasks."""

    def __init__(self, task):
        self.task, self.evals = task, []  # each: (ids, infos, seconds)

    def __getattr__(self, name):
        return getattr(self.task, name)

    def rollout(self, policy, ids, **kw):
        start = time.perf_counter()
        ro = self.task.rollout(policy, ids, **kw)
        if kw.get("greedy"):
            if not self.evals or len(self.evals[-1][0]) >= len(self.task.heldout_ids):
                self.evals.append(([], [], 0.0))
            done_ids, infos, seconds = self.evals[-1]
            self.evals[-1] = (done_ids + ids.tolist(), infos + ro.infos, seconds + time.perf_counter() - start)
        return ro


def by_skill(task, record) -> tuple[dict[str, float], float, int, float]:
    ids, infos, seconds = record
    overall = sum(i.get("outcome") == "correct" for i in infos) / len(infos)
    return per_skill_success(task, torch.tensor(ids), infos), overall, len(infos), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench-sql-agent", help="run dir (emptied first)")
    parser.add_argument("overrides", nargs="*", help="config overrides such as train.steps=20")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    # evaluate only before the first update and after the last: every held-out task each time
    cfg = load_config("sql-agent-smollm2", [f"run.dir={args.out}", "run.progress=false", "run.resume=never",
                                            "train.eval_every=100000", "eval.size=100000", *args.overrides])
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model, lora=cfg.lora)
    task = EvalRecorder(build_task(cfg.task, tokenizer=model.tokenizer, reward=cfg.reward, env=cfg.env))
    start = time.perf_counter()
    summary = RLTrainer(cfg, model=model, task=task).train()
    wall = time.perf_counter() - start
    (base, base_all, n_eval, base_s), (after, after_all, _, after_s) = by_skill(task, task.evals[0]), by_skill(task, task.evals[-1])
    train_s = wall - base_s - after_s
    rows = [json.loads(line) for line in (Path(args.out) / "metrics.jsonl").read_text().splitlines()]
    rollout_s = sum(r.get("time/rollout_s", 0.0) for r in rows)
    episodes = summary["steps_done"] * cfg.train.rollout_size

    print(f"\nSmolLM2-135M-Instruct + LoRA r={cfg.lora.r}, {cfg.algo.name}, {summary['steps_done']} steps x "
          f"{cfg.train.rollout_size} episodes, max_rounds={cfg.env.max_rounds}; held-out: {n_eval} procedural tasks\n")
    print("| skill | base | trained |")
    print("|---|---|---|")
    for skill in base:
        print(f"| {skill} | {base[skill]:.2f} | {after[skill]:.2f} |")
    print(f"| **overall** | **{base_all:.3f}** | **{after_all:.3f}** |")
    print(f"\ntraining: {train_s / 60:.1f} min ({episodes} episodes; rollouts {episodes / max(rollout_s, 1e-9) * 60:.1f} "
          f"episodes/min); evaluation: base {base_s:.0f} s, trained {after_s:.0f} s "
          f"({n_eval / base_s * 60:.1f} and {n_eval / after_s * 60:.1f} greedy episodes/min)")
    print(f"wall time in all: {wall / 60:.1f} min; summary: base {summary['warmup_accuracy']:.3f} -> "
          f"final {summary['final_accuracy']:.3f}")


if __name__ == "__main__":
    main()
