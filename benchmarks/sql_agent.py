"""Does training teach SmolLM2-135M-Instruct to answer database questions as a DBBench agent?

Prints one table: success rate per skill on the held-out procedural tasks (the same tasks, greedy
decoding) for each stage, with wall times and episode throughput (episodes per minute, training
rollouts and evaluation).

    python benchmarks/sql_agent.py [--out runs/bench-sql-agent] [key=value ...]
        base (the adapter as initialised, i.e. the base model) vs after RL (`sql-agent-smollm2`)
    python benchmarks/sql_agent.py --sft [--sft-set data.generate_train=240 ...] [key=value ...]
        base vs after the supervised warm-up on demonstrations (`sql-sft-smollm2`) vs after SFT + RL
        (RL starts from the SFT run's exported model with a fresh adapter)
    python benchmarks/sql_agent.py --sft-model runs/bench-sql-agent/sft/model [key=value ...]
        the same, reusing an SFT model (its time is not measured again)

`key=value` overrides go to the RL preset (`train.steps=0`: evaluate the SFT model, no RL), and
its env.*, model.*, run.threads and run.device ones to the SFT preset too (the demonstrations are
played in the RL environment); `--sft-set` ones go to the SFT preset only.
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
    """Wraps the task so every greedy (evaluation) pass is kept: the trainer evaluates the starting
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


def evaluate(cfg, model_path: str | None = None) -> tuple:
    """The held-out greedy evaluation the trainer runs, on the model at `model_path` (default
    cfg.model.path) with a fresh adapter (= that model). Returns (task, (ids, infos, seconds))."""
    torch.manual_seed(cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    model_cfg = cfg.model if model_path is None else type(cfg.model)(**{**vars(cfg.model), "path": model_path})
    model = build_model(model_cfg, lora=cfg.lora)
    task = EvalRecorder(build_task(cfg.task, tokenizer=model.tokenizer, reward=cfg.reward, env=cfg.env))
    model.eval()
    with torch.no_grad():
        for chunk in task.heldout_ids.split(cfg.eval.batch_size):
            task.rollout(model, chunk, greedy=True)
    return task, task.evals[0]


def by_skill(task, record) -> tuple[dict[str, float], float, int, float]:
    ids, infos, seconds = record
    overall = sum(i.get("outcome") == "correct" for i in infos) / len(infos)
    return per_skill_success(task, torch.tensor(ids), infos), overall, len(infos), seconds


def run_sft(out: Path, model_path: str, settings: list[str]) -> tuple[str, dict, float]:
    """The `sql-sft-smollm2` run (demonstrations written into OUT/sft-data). Returns (exported model
    dir, summary, wall seconds)."""
    from lmrl.train.sft_trainer import SFTTrainer

    cfg = load_config("sql-sft-smollm2", [f"run.dir={out / 'sft'}", "run.progress=false", "run.resume=never",
                                          f"model.path={model_path}", f"data.train_file={out / 'sft-data/train.jsonl'}",
                                          f"data.eval_file={out / 'sft-data/test.jsonl'}", *settings])
    start = time.perf_counter()
    summary = SFTTrainer(cfg).train()
    return str(out / "sft" / "model"), summary, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench-sql-agent", help="output dir (emptied first)")
    parser.add_argument("--sft", action="store_true", help="run the sql-sft-smollm2 warm-up first; RL starts from it")
    parser.add_argument("--sft-model", default=None, help="start RL from this SFT model dir instead of training one")
    parser.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for the SFT preset (repeatable)")
    parser.add_argument("overrides", nargs="*", help="RL config overrides such as train.steps=20")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    # evaluate only before the first update and after the last: every held-out task each time
    cfg = load_config("sql-agent-smollm2", [f"run.dir={out / 'rl'}", "run.progress=false", "run.resume=never",
                                            "train.eval_every=100000", "eval.size=100000", *args.overrides])
    staged = bool(args.sft or args.sft_model)
    wall_start = time.perf_counter()
    stages, times = [], []  # stages: (name, per-skill, overall, n, eval seconds); times: printed notes

    if staged:
        task, record = evaluate(cfg)
        stages.append(("base", *by_skill(task, record)))
        sft_model = args.sft_model
        if args.sft:
            # the demonstrations are played in the RL run's environment, on its model
            shared = [o for o in args.overrides if o.startswith(("env.", "model.", "run.threads=", "run.device="))]
            sft_model, sft, sft_s = run_sft(out, cfg.model.path, shared + args.sft_set)
            best = "" if sft["best"]["value"] is None else \
                f", best {sft['best_metric']} {sft['best']['value']:.4f} at step {sft['best']['step']}"
            times.append(f"SFT: {sft_s / 60:.1f} min ({sft['steps_done']} steps on {sft['train_rows']} demonstrations, "
                         f"{sft['eval_rows']} for validation{best}; evaluation {sft['time_s']['eval']:.0f} s)")
        cfg.model.path = sft_model
        if cfg.train.steps == 0:  # the SFT model alone
            task, record = evaluate(cfg)
            stages.append(("SFT", *by_skill(task, record)))

    summary = None
    if cfg.train.steps > 0:
        torch.manual_seed(cfg.run.seed)
        model = build_model(cfg.model, lora=cfg.lora)
        task = EvalRecorder(build_task(cfg.task, tokenizer=model.tokenizer, reward=cfg.reward, env=cfg.env))
        start = time.perf_counter()
        summary = RLTrainer(cfg, model=model, task=task).train()
        rl_wall = time.perf_counter() - start
        first, last = by_skill(task, task.evals[0]), by_skill(task, task.evals[-1])
        stages += [("SFT" if staged else "base", *first), ("SFT + RL" if staged else "trained", *last)]
        rows = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
        rollout_s = sum(r.get("time/rollout_s", 0.0) for r in rows)
        episodes = summary["steps_done"] * cfg.train.rollout_size
        train_s = rl_wall - first[3] - last[3]
        times.append(f"RL: {train_s / 60:.1f} min ({summary['steps_done']} steps x {cfg.train.rollout_size} episodes; "
                     f"rollouts {episodes / max(rollout_s, 1e-9) * 60:.1f} episodes/min, "
                     f"{episodes / train_s * 60:.1f} episodes/min with the updates)")
    wall = time.perf_counter() - wall_start

    n_eval = stages[0][3]
    print(f"\nSmolLM2-135M-Instruct + LoRA r={cfg.lora.r}, {cfg.algo.name}, max_rounds={cfg.env.max_rounds}, "
          f"{cfg.task.max_new_tokens} tokens a turn; held-out: {n_eval} procedural tasks, greedy\n")
    print("| skill | " + " | ".join(s[0] for s in stages) + " |")
    print("|---|" + "---|" * len(stages))
    for skill in stages[0][1]:
        print(f"| {skill} | " + " | ".join(f"{s[1][skill]:.2f}" for s in stages) + " |")
    print("| **overall** | " + " | ".join(f"**{s[2]:.3f}**" for s in stages) + " |")
    print()
    for note in times:
        print(note)
    print("evaluation: " + ", ".join(f"{s[0]} {s[4]:.0f} s ({s[3] / s[4] * 60:.1f} greedy episodes/min)" for s in stages))
    print(f"wall time in all: {wall / 60:.1f} min" + (f"; RL summary: start {summary['warmup_accuracy']:.3f} -> final "
                                                        f"{summary['final_accuracy']:.3f}" if summary else ""))


if __name__ == "__main__":
    main()
