"""Does training teach SmolLM2-135M-Instruct to answer database questions as a DBBench agent?

Prints two tables for each stage's model (base; after SFT; after SFT + RL), greedy decoding:
- success rate per skill on the held-out procedural tasks (the same tasks for every stage), with
  wall times and episode throughput (episodes per minute, training rollouts and evaluation);
- success per type on real DBBench records (`--dbbench`, AgentBench's dev.jsonl: INSERT 20,
  UPDATE 20, 20 questions), each stage scored by `lmrl eval`'s code (`evaluate_file`) in the RL
  run's environment (its env section and turn length, for every stage: sql.max_rounds rounds, not
  DBBench's 15). The four aggregation-* types (6 records) share a row; "questions" is every record
  but INSERT/UPDATE/DELETE. Each cell: success, its 95% Wilson interval. Then the last stage minus
  each earlier one, with a 95% interval for the difference (Newcombe's square-and-add interval for
  paired proportions: every stage answers the same records); "gain" or "loss" only where that
  interval excludes zero.
Results go to `--json` (default OUT/results.json), each stage's DBBench episodes to
OUT/dbbench/STAGE.completions.jsonl.

    python benchmarks/sql_agent.py [--out runs/bench-sql-agent] [key=value ...]
        base (the adapter as initialised, i.e. the base model) vs after RL (`sql-agent-smollm2`)
    python benchmarks/sql_agent.py --sft [--sft-set data.generate_train=240 ...] [key=value ...]
        base vs after the supervised warm-up on demonstrations (`sql-sft-smollm2`) vs after SFT + RL
        (RL starts from the SFT run's exported model with a fresh adapter)
    python benchmarks/sql_agent.py --sft-model runs/bench-sql-agent/sft/model [key=value ...]
        the same, reusing an SFT model (its time is not measured again)

`key=value` overrides go to the RL preset (`train.steps=0`: evaluate the SFT model, no RL), and
its env.*, sql.*, model.*, run.threads and run.device ones to the SFT preset too (the demonstrations are
played in the RL environment); `--sft-set` ones go to the SFT preset only. `--dbbench-limit N`
scores the first N DBBench records only (a smoke run).
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
from lmrl.tasks.sql import load_dbbench
from lmrl.tasks.sql.agent_task import per_skill_success
from lmrl.tasks.sql.checking import is_modification
from lmrl.train.file_eval import Tally, evaluate_file, paired_difference_interval

DBBENCH_DEV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dbbench" / "dev.jsonl"
AGGREGATION = "aggregation"  # DBBench's aggregation-SUM, -MAX, -MIN and -AVG (2, 2, 1 and 1 records in dev.jsonl)
TYPE_ROWS = ("INSERT", "UPDATE", "other", "comparison", "counting", "ranking", AGGREGATION)
QUESTIONS, OVERALL = "questions", "overall"


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
    task = EvalRecorder(build_task(cfg, tokenizer=model.tokenizer))
    model.eval()
    with torch.no_grad():
        for chunk in task.heldout_ids.split(cfg.eval.batch_size):
            task.rollout(model, chunk, greedy=True)
    return task, task.evals[0]


def by_skill(task, record) -> tuple[dict[str, float], float, int, float]:
    ids, infos, seconds = record
    overall = sum(i.get("outcome") == "correct" for i in infos) / len(infos)
    return per_skill_success(task, torch.tensor(ids), infos), overall, len(infos), seconds


def type_row(kind: str) -> str:
    """The DBBench table's row of a record type: the aggregation-* types share one (1 or 2 records each)."""
    return AGGREGATION if kind.startswith("aggregation-") else kind


def outcomes_by_row(records: list[dict]) -> dict[str, dict[int, bool]]:
    """{row: {record index: correct}} of `evaluate_file` records: the type rows (TYPE_ROWS, then any
    other type), `questions` (every record but INSERT/UPDATE/DELETE) and `overall`."""
    rows: dict[str, dict[int, bool]] = {}
    for r in records:
        for row in (type_row(r["type"]), *(() if is_modification(r["type"]) else (QUESTIONS,)), OVERALL):
            rows.setdefault(row, {})[r["index"]] = bool(r["correct"])
    extra = sorted(set(rows) - {*TYPE_ROWS, QUESTIONS, OVERALL})
    return {row: rows[row] for row in (*TYPE_ROWS, *extra, QUESTIONS, OVERALL) if row in rows}


def dbbench_table(stages: list[tuple[str, list[dict]]]) -> list[dict]:
    """The per-type table of (stage name, `evaluate_file` records) pairs, all on the same records:
    one entry per row (see `outcomes_by_row`) with each stage's tally and the last stage's
    difference from every earlier stage, its paired 95% interval and whether that excludes zero."""
    names = [name for name, _ in stages]
    per_stage = [outcomes_by_row(records) for _, records in stages]
    table = []
    for row in per_stage[0]:
        outcomes = [stage.get(row, {}) for stage in per_stage]
        ids = sorted(outcomes[0])
        if any(sorted(o) != ids for o in outcomes):
            raise ValueError(f"row {row!r}: the stages answered different records; a paired comparison needs the same")
        flags = [[o[i] for i in ids] for o in outcomes]
        differences = []
        for name, earlier in zip(names[:-1], flags[:-1]):
            low, high = paired_difference_interval(flags[-1], earlier)
            differences.append({"from": name, "to": names[-1], "difference": (sum(flags[-1]) - sum(earlier)) / len(ids),
                                "ci95": [low, high], "significant": low > 0 or high < 0})
        table.append({"type": row, "n": len(ids), "differences": differences,
                      "stages": {name: Tally(sum(f), len(f)).as_dict() for name, f in zip(names, flags)}})
    return table


def format_dbbench_table(table: list[dict]) -> list[str]:
    """The table as markdown lines: success [95% Wilson interval] per stage, then the differences."""
    names = list(table[0]["stages"])
    diffs = [f"{d['to']} − {d['from']}" for d in table[0]["differences"]]
    lines = ["| type | n | " + " | ".join(names + diffs) + " |", "|---|---:|" + "---|" * (len(names) + len(diffs))]
    for entry in table:
        cells = [f"{s['accuracy']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" for s in entry["stages"].values()]
        for d in entry["differences"]:
            (low, high), verdict = d["ci95"], ""
            if d["significant"]:
                verdict = " gain" if low > 0 else " loss"
            cells.append(f"{d['difference']:+.2f} [{low:+.2f}, {high:+.2f}]{verdict}")
        name = {AGGREGATION: "aggregation-*"}.get(entry["type"], entry["type"])
        if entry["type"] in (QUESTIONS, OVERALL):
            name = f"**{name}**"
        lines.append(f"| {name} | {entry['n']} | " + " | ".join(cells) + " |")
    return lines


def score_dbbench(stages: list[tuple[str, str]], cfg, path: Path, limit: int | None,
                  out: Path) -> list[tuple[str, object, float]]:
    """(stage, `FileEvaluation`, seconds) for each (stage, model dir or run dir): `lmrl eval`'s code
    on the DBBench file, every stage in the RL run's environment and turn length, greedy."""
    results = []
    for name, source in stages:
        start = time.perf_counter()
        result = evaluate_file(source, path, limit=limit, max_new_tokens=cfg.task.max_new_tokens,
                               batch_size=cfg.eval.batch_size, sections={"env": cfg.env, "sql": cfg.sql},
                               device=cfg.run.device,
                               dtype=cfg.model.dtype,
                               out=out / f"{name.lower().replace(' + ', '-').replace(' ', '-')}.completions.jsonl")
        results.append((name, result, time.perf_counter() - start))
    return results


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
    parser.add_argument("--dbbench", default=str(DBBENCH_DEV), metavar="PATH",
                        help="DBBench records every stage is scored on (default ../shared/data/dbbench/dev.jsonl)")
    parser.add_argument("--dbbench-limit", type=int, default=None, metavar="N",
                        help="score the first N DBBench records only (default: all)")
    parser.add_argument("--json", default=None, metavar="PATH", help="the results as JSON (default OUT/results.json)")
    parser.add_argument("overrides", nargs="*", help="RL config overrides such as train.steps=20")
    args = parser.parse_args()
    if args.dbbench_limit is not None and args.dbbench_limit < 1:
        parser.error(f"--dbbench-limit must be at least 1, got {args.dbbench_limit}")
    dbbench = Path(args.dbbench)
    dbbench_rows = len(load_dbbench(dbbench))  # a missing or damaged file fails now, not after the training
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    # evaluate only before the first update and after the last: every held-out task each time
    cfg = load_config("sql-agent-smollm2", [f"run.dir={out / 'rl'}", "run.progress=false", "run.resume=never",
                                            "train.eval_every=100000", "eval.size=100000", *args.overrides])
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    staged = bool(args.sft or args.sft_model)
    wall_start = time.perf_counter()
    stages, times = [], []  # stages: (name, per-skill, overall, n, eval seconds); times: printed notes
    models = [("base", cfg.model.path)]  # (stage, model or run dir) to score on DBBench

    if staged:
        task, record = evaluate(cfg)
        stages.append(("base", *by_skill(task, record)))
        sft_model = args.sft_model
        if args.sft:
            # the demonstrations are played in the RL run's environment, on its model
            shared = [o for o in args.overrides if o.startswith(("env.", "sql.", "model.", "run.threads=", "run.device="))]
            sft_model, sft, sft_s = run_sft(out, cfg.model.path, shared + args.sft_set)
            best = "" if sft["best"]["value"] is None else \
                f", best {sft['best_metric']} {sft['best']['value']:.4f} at step {sft['best']['step']}"
            times.append(f"SFT: {sft_s / 60:.1f} min ({sft['steps_done']} steps on {sft['train_rows']} demonstrations, "
                         f"{sft['eval_rows']} for validation{best}; evaluation {sft['time_s']['eval']:.0f} s)")
        cfg.model.path = sft_model
        models.append(("SFT", sft_model))
        if cfg.train.steps == 0:  # the SFT model alone
            task, record = evaluate(cfg)
            stages.append(("SFT", *by_skill(task, record)))

    summary = None
    if cfg.train.steps > 0:
        torch.manual_seed(cfg.run.seed)
        model = build_model(cfg.model, lora=cfg.lora)
        task = EvalRecorder(build_task(cfg, tokenizer=model.tokenizer))
        start = time.perf_counter()
        summary = RLTrainer(cfg, model=model, task=task).train()
        rl_wall = time.perf_counter() - start
        first, last = by_skill(task, task.evals[0]), by_skill(task, task.evals[-1])
        trained = "SFT + RL" if staged else "trained"
        stages += [("SFT" if staged else "base", *first), (trained, *last)]
        models.append((trained, str(out / "rl")))  # its latest checkpoint: after the last update
        rows = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
        rollout_s = sum(r.get("time/rollout_s", 0.0) for r in rows)
        episodes = summary["steps_done"] * cfg.train.rollout_size
        train_s = rl_wall - first[3] - last[3]
        times.append(f"RL: {train_s / 60:.1f} min ({summary['steps_done']} steps x {cfg.train.rollout_size} episodes; "
                     f"rollouts {episodes / max(rollout_s, 1e-9) * 60:.1f} episodes/min, "
                     f"{episodes / train_s * 60:.1f} episodes/min with the updates)")
        del model, task

    scored = score_dbbench(models, cfg, dbbench, args.dbbench_limit, out / "dbbench")
    table = dbbench_table([(name, result.records) for name, result, _ in scored])
    wall = time.perf_counter() - wall_start

    n_eval = stages[0][3]
    print(f"\nSmolLM2-135M-Instruct + LoRA r={cfg.lora.r}, {cfg.algo.name}, max_rounds={cfg.sql.max_rounds}, "
          f"{cfg.task.max_new_tokens} tokens a turn; held-out: {n_eval} procedural tasks, greedy\n")
    print("| skill | " + " | ".join(s[0] for s in stages) + " |")
    print("|---|" + "---|" * len(stages))
    for skill in stages[0][1]:
        print(f"| {skill} | " + " | ".join(f"{s[1][skill]:.2f}" for s in stages) + " |")
    print("| **overall** | " + " | ".join(f"**{s[2]:.3f}**" for s in stages) + " |")

    n_db = table[-1]["n"]
    print(f"\nDBBench: {n_db} of the {dbbench_rows} records of {dbbench}, greedy, in the RL run's environment "
          f"(max_rounds={cfg.sql.max_rounds}, {cfg.task.max_new_tokens} tokens a turn, observations cut at "
          f"{cfg.sql.max_chars} characters, context {cfg.env.max_context} tokens). Success [95% Wilson interval]; "
          f"differences [95% paired Newcombe interval], a gain or loss only where it excludes 0; "
          f"aggregation-* = the SUM, MAX, MIN and AVG types together\n")
    for line in format_dbbench_table(table):
        print(line)
    print()
    for note in times:
        print(note)
    print("evaluation: " + ", ".join(f"{s[0]} {s[4]:.0f} s ({s[3] / s[4] * 60:.1f} greedy episodes/min)" for s in stages))
    print("DBBench evaluation: " + ", ".join(f"{name} {sec:.0f} s ({result.overall.rows / sec * 60:.1f} greedy "
                                              f"episodes/min)" for name, result, sec in scored))
    print(f"wall time in all: {wall / 60:.1f} min" + (f"; RL summary: start {summary['warmup_accuracy']:.3f} -> final "
                                                        f"{summary['final_accuracy']:.3f}" if summary else ""))

    results = {
        "args": {"sft": args.sft, "sft_model": args.sft_model, "sft_set": args.sft_set, "overrides": args.overrides},
        "procedural": [{"stage": name, "per_skill": skills, "overall": overall, "tasks": n, "eval_s": seconds}
                       for name, skills, overall, n, seconds in stages],
        "dbbench": {"file": str(dbbench), "limit": args.dbbench_limit, "table": table,
                    "stages": [{"stage": name, **result.as_dict(), "eval_s": sec} for name, result, sec in scored]},
        "times": times, "wall_s": wall, "rl_summary": summary and {k: summary[k] for k in (
            "steps_done", "warmup_accuracy", "final_accuracy") if k in summary}}
    json_path = Path(args.json) if args.json else out / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {json_path}; DBBench episodes: {out / 'dbbench'}/*.completions.jsonl")


if __name__ == "__main__":
    main()
