"""The prepared device check: one command on a GPU machine, every stage timed, one JSON of figures.

    scripts/gpu_check.sh [--cpu] --out DIR          # ≡ make gpu-check OUT=DIR (the .sh picks the python)
    python scripts/gpu_check.py [--cpu] --out DIR [--stages adder,ddp] [--work DIR] [--budget-s 470]

Written for a GPU machine without network (one H100 or H200; torch, transformers, peft, accelerate,
safetensors installed; no vLLM, Ray, datasets or math-verify): it needs the working tree and nothing
else. Each stage runs in a child process of its own with a time limit (its own cap, and never past
the run's `--budget-s`), so a stage that fails, hangs or kills its process leaves the others running.
DIR gets two files: gpu_check.json, {stage: {ok, seconds, figures..., error}}, and gpu_check.log,
every child's output. Run dirs and model dirs go to `--work` (a temporary dir by default). On a lent
device machine the whole check is one call: `scripts/gpu_check.sh --out $OUT` with a 540 s limit (the
stages' budget is 470 s), both files come back from $OUT.

Stages, in order:
  env           python, torch, CUDA and the GPUs, package versions
  install       lmrl importable from outside the repo, else `pip install --no-deps --no-build-isolation -e .`
                (nothing downloaded, no CUDA wheel pulled); then lmrl's own imports
  cuda-tests    pytest -m cuda tests/test_cuda.py (sampling loop vs log-probs, its CUDA graph against the eager
                step, bf16 steps, no CPU-only paths, prompt sharing off for a small model)
  models        random-weight model dirs with the real shapes and tokenizers: SmolLM2-135M and Qwen2.5-1.5B
                (config.json + tokenizer from scripts/gpu_check_assets, bf16 weights drawn on the device)
  grpo-smollm2  GRPO + LoRA steps of the math-grpo-qwen-gpu preset (bf16 weights, r 32 on every projection)
  grpo-qwen1.5b  on open prompts scored by a reward that always varies, `algo.skip_zero_advantage=false` so
                the whole update runs: seconds per step, rollout and update seconds, peak GPU memory and
                what the first update held at its peak by allocation site (`first_update_memory`), `lmrl
                plan`'s peak and step time for the same run, and the sampling loop's tokens/s (with its CUDA
                graph, and without) against `model.generate` at batch 64 (same prompts, 128 new tokens)
  ddp           torchrun --nproc_per_node=N (N = the GPUs; one GPU: a one-process NCCL group, so the DDP code
  fsdp          path runs) GRPO + LoRA on the SmolLM2 shape, a small rollout (16 x 32 tokens: the code path,
                not a speed); fsdp the same with distributed.strategy=fsdp
  adder         `lmrl train adder run.device=cuda` (the preset: it stops at 99% held-out), within what is left
                of its limit (train.time_limit_min): time to 99% held-out from its metrics.jsonl

`--cpu` is the dry run the test suite makes (tests/test_gpu_check.py): the same stages on the CPU at
tiny sizes (2-layer models with the real tokenizers, a few steps, fp32 weights), gloo instead of NCCL.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "scripts" / "gpu_check_assets"
MODELS = {"smollm2": "smollm2-135m", "qwen1.5b": "qwen2.5-1.5b"}  # stage suffix -> asset dir
# --cpu: the real tokenizers and architectures at a size a 2-core CPU trains in seconds
TINY_SHAPE = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16}


def stage_caps(cpu: bool) -> dict[str, float]:
    """Each stage's time limit in seconds (the run's budget may cut it shorter)."""
    if cpu:
        return {"env": 60, "install": 120, "cuda-tests": 120, "models": 120, "grpo-smollm2": 120,
                "grpo-qwen1.5b": 120, "ddp": 120, "fsdp": 120, "adder": 120}
    # the adder last: its time to 99% is the least predictable, and it stops itself at the time it is given
    return {"env": 60, "install": 120, "cuda-tests": 120, "models": 120, "grpo-smollm2": 150,
            "grpo-qwen1.5b": 200, "ddp": 120, "fsdp": 120, "adder": 180}


# ------------------------------------------------------------------------------------------ the driver

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=False, type=Path, help="where gpu_check.json and gpu_check.log go")
    p.add_argument("--cpu", action="store_true", help="the dry run: every stage on the CPU at tiny sizes, gloo")
    p.add_argument("--stages", default="", help="a comma-separated subset of the stages (default: all)")
    p.add_argument("--work", type=Path, default=None, help="run and model dirs (default: a temporary dir)")
    p.add_argument("--budget-s", type=float, default=470.0, help="the whole run's time limit (default 470 s)")
    p.add_argument("--stage", help=argparse.SUPPRESS)  # a child: run this one stage
    p.add_argument("--torchrun-worker", help=argparse.SUPPRESS)  # a torchrun rank of the ddp / fsdp stage
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--limit-s", type=float, default=None, help=argparse.SUPPRESS)  # a child: its time limit
    args = p.parse_args(argv)
    if args.stage or args.torchrun_worker:
        return run_child(args)
    if args.out is None:
        p.error("--out DIR is required")
    caps = stage_caps(args.cpu)
    names = [s for s in args.stages.split(",") if s] or list(caps)
    unknown = [s for s in names if s not in caps]
    if unknown:
        p.error(f"unknown stage {unknown[0]!r}; the stages: {', '.join(caps)}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="lmrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    return drive(names, caps, args.out, work, args.cpu, args.budget_s)


def drive(names: list[str], caps: dict, out: Path, work: Path, cpu: bool, budget_s: float) -> int:
    log_path, json_path = out / "gpu_check.log", out / "gpu_check.json"
    results: dict[str, dict] = {}
    deadline = time.monotonic() + budget_s
    env = child_env()
    with open(log_path, "w") as log:
        log.write(f"gpu_check {'--cpu ' if cpu else ''}work dir {work}\n")
        for name in names:
            limit = min(caps[name], deadline - time.monotonic())
            if limit < max(5.0, caps[name] / 4):  # a stage cut to a stub of its time would only report a timeout
                results[name] = {"ok": False, "seconds": 0.0, "error": f"not run: {max(limit, 0):.0f}s left of the "
                                                                       f"run's budget of {budget_s:g}s"}
                continue
            results[name] = run_stage(name, limit, work, cpu, log, env)
            json_path.write_text(json.dumps(results, indent=2) + "\n")  # what is done so far, if the run is killed
            status = "ok" if results[name]["ok"] else f"FAILED: {results[name].get('error')}"
            print(f"{name:15s} {results[name]['seconds']:7.1f}s  {status}", flush=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {json_path} and {log_path}")
    return 0 if all(r["ok"] for r in results.values()) else 1


def child_env() -> dict:
    """The children's environment: the repo (and this folder, for the reward class) importable, no hub."""
    path = [str(REPO), str(REPO / "scripts"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)), PYTHONUNBUFFERED="1",
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled")


def run_stage(name: str, limit: float, work: Path, cpu: bool, log, env: dict) -> dict:
    """One stage in a child process (its own session, so a timeout kills torchrun's ranks too)."""
    result_file = work / f"result-{name}.json"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--stage", name, "--work", str(work), "--result", str(result_file),
           "--limit-s", f"{limit:.0f}"]
    cmd += ["--cpu"] if cpu else []
    log.write(f"\n===== {name} (limit {limit:.0f}s): {' '.join(cmd)}\n")
    log.flush()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=limit)
        error = None if code == 0 else f"exit code {code}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's whole session: it and any rank it started
        proc.wait()
        code, error = None, f"timed out after {limit:.0f}s"
    seconds = round(time.monotonic() - start, 1)
    found = json.loads(result_file.read_text()) if result_file.is_file() else {}
    error = found.pop("error", None) or error
    ok = code == 0 and error is None and found.pop("ok", True)
    found.pop("ok", None)
    return {"ok": bool(ok), "seconds": seconds, **found, "error": error}


# ------------------------------------------------------------------------------------------ a child

def run_child(args) -> int:
    """A stage (or a torchrun rank): its figures, or its error as one line, go to `args.result`."""
    figures: dict = {}
    try:
        if args.torchrun_worker:
            torchrun_worker(args.torchrun_worker, args.work, args.cpu, args.result)
            return 0
        STAGE_LIMIT_S[0] = args.limit_s
        figures = STAGES[args.stage](args.work, args.cpu) or {}
    except Exception as e:  # the stage failed: one line in the JSON, the traceback in the log
        traceback.print_exc()
        figures["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
    if args.result is not None:
        args.result.write_text(json.dumps(figures))
    return 0 if "error" not in figures else 1


def stage_env(work: Path, cpu: bool) -> dict:
    import platform

    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
             "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    if torch.cuda.is_available():
        found["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        version = torch.cuda.nccl.version()
        found["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    for name in ("transformers", "peft", "accelerate", "safetensors", "numpy", "yaml", "tensorboard"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    if not cpu and not found["cuda_available"]:
        raise RuntimeError("no CUDA device visible to torch (use --cpu for the dry run)")
    return found


def stage_install(work: Path, cpu: bool) -> dict:
    """lmrl importable by this python from anywhere (what `python -m lmrl` under torchrun needs), else an
    editable install of the working tree with nothing fetched; then every module the stages import."""
    probe = [sys.executable, "-c", "import lmrl, sys; sys.stdout.write(lmrl.__file__)"]
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(probe, capture_output=True, text=True, cwd="/", env=clean)
    how = "already importable"
    if found.returncode != 0:
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-e",
               str(REPO)]
        done = subprocess.run(pip, capture_output=True, text=True, env=clean)
        print(done.stdout[-3000:], done.stderr[-3000:])
        if done.returncode != 0:
            raise RuntimeError(f"pip install -e failed: {done.stderr.strip().splitlines()[-1:]}")
        found = subprocess.run(probe, capture_output=True, text=True, cwd="/", env=clean)
        if found.returncode != 0:
            raise RuntimeError(f"lmrl still not importable after pip install -e: {found.stderr.strip()[-300:]}")
        how = "pip install --no-deps --no-build-isolation -e ."
    import importlib

    modules = ["lmrl.cli", "lmrl.train.rl_trainer", "lmrl.models.hf", "lmrl.models.lora", "lmrl.parallel.fsdp",
               "lmrl.generation.hf_generate", "lmrl.train.plan"]
    for m in modules:
        importlib.import_module(m)
    return {"how": how, "lmrl": found.stdout.strip(), "modules_imported": len(modules)}


def stage_cuda_tests(work: Path, cpu: bool) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/test_cuda.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", last)}
    if proc.returncode != 0:
        raise RuntimeError(f"pytest exit {proc.returncode}: {last}")
    if not cpu and counts.get("skipped"):
        raise RuntimeError(f"CUDA tests were skipped on a GPU machine: {last}")
    return {"passed": counts.get("passed", 0), "skipped": counts.get("skipped", 0), "summary": last}


STAGE_LIMIT_S: list[float | None] = [None]  # a child's own time limit (--limit-s)


def stage_adder(work: Path, cpu: bool) -> dict:
    """The main job on the device; time to 99% held-out from its metrics.jsonl (the preset stops there)."""
    run_dir = work / "adder"
    shutil.rmtree(run_dir, ignore_errors=True)
    device = "cpu" if cpu else "cuda"
    extra = ["run.threads=1", "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "sft.steps=20",
             "sft.examples=200", "train.steps=10", "train.eval_every=5", "eval.size=100"] if cpu else []
    # RL stops itself in time to evaluate, save and exit within the stage's limit (start-up and warm-up ~40 s)
    minutes = max(0.5, ((STAGE_LIMIT_S[0] or 180) - 45) / 60)
    cmd = [sys.executable, "-m", "lmrl", "train", "adder", f"run.dir={run_dir}", f"run.device={device}",
           "run.progress=false", "run.tensorboard=false", f"train.time_limit_min={minutes:.2f}", *extra]
    proc = subprocess.run(cmd, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"lmrl train adder exited {proc.returncode}")
    rows = read_metrics(run_dir)
    hit = next((r for r in rows if r.get("eval/accuracy", 0) >= 0.99), None)
    summary = json.loads((run_dir / "summary.json").read_text())
    rl = [r["time/step_s"] for r in rows if "train/policy_loss" in r and "time/step_s" in r]
    return {"device": device, "time_limit_min": round(minutes, 2),
            "seconds_to_99": hit and round(hit["time/elapsed_s"], 1), "step_at_99": hit and hit["step"],
            "warmup_accuracy": summary.get("warmup_accuracy"), "final_accuracy": summary.get("final_accuracy"),
            "rl_steps": summary.get("rl_steps"), "rl_step_s_median": rl and round(statistics.median(rl), 4),
            "time_s": summary.get("time_s")}


def stage_models(work: Path, cpu: bool) -> dict:
    found = {}
    for key in MODELS:
        start = time.monotonic()
        directory = random_model_dir(key, work, cpu)
        found[key] = {"dir": str(directory), "seconds": round(time.monotonic() - start, 1),
                      "parameters": json.loads((directory / "lmrl_random.json").read_text())["parameters"]}
    return found


def stage_grpo(key: str):
    def run(work: Path, cpu: bool) -> dict:
        return grpo_run(key, work, cpu)
    return run


# ------------------------------------------------------------------------------------------ models

def unpack_assets(name: str, directory: Path, shape: dict | None = None) -> None:
    """config.json (with `shape` over it) and the tokenizer files of `ASSETS/name`, gunzipped, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in (ASSETS / name).iterdir():
        if f.suffix == ".gz":
            with gzip.open(f) as src, open(directory / f.stem, "wb") as dst:
                shutil.copyfileobj(src, dst)
        elif f.suffix == ".json":
            shutil.copy(f, directory / f.name)
    if shape:
        config = json.loads((directory / "config.json").read_text())
        config.update(shape)
        (directory / "config.json").write_text(json.dumps(config, indent=2))


def random_model_dir(key: str, work: Path, cpu: bool) -> Path:
    """A model dir of `MODELS[key]`'s architecture and tokenizer with random bf16 weights (seed 0), drawn on
    the GPU when there is one; kept in `work` and reused. --cpu: the tiny shape."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = work / "models" / (MODELS[key] + ("-tiny" if cpu else ""))
    done = directory / "lmrl_random.json"
    if done.is_file():
        return directory
    unpack_assets(MODELS[key], directory, TINY_SHAPE if cpu else None)
    config = AutoConfig.from_pretrained(directory)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    done.write_text(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "seed": 0}))
    del model
    return directory


class DistinctCharacters:
    """The GRPO stages' reward (`reward.cls=gpu_check:DistinctCharacters`): the number of distinct
    characters in a completion. Random weights never answer anything; this varies from one
    completion to the next, so advantages are not zero and every update has a gradient."""

    def __call__(self, prompts, completions, **kwargs):
        return [float(len(set(c))) for c in completions]


def grpo_overrides(key: str, work: Path, cpu: bool, run_dir: Path) -> list[str]:
    """math-grpo-qwen-gpu on open prompts, random weights, a few steps, every completion in the update."""
    from lmrl.tasks.word_problems import write_addition_chat

    data = work / "prompts"
    if not (data / "test.jsonl").is_file():
        write_addition_chat(data, n_train=256, n_test=16, seed=0)
    size = ["train.steps=2", "train.rollout_size=8", "algo.group_size=4", "train.ga_steps=2",
            "task.max_new_tokens=8", "run.threads=2", "lora.r=4"] if cpu else \
        ["train.steps=4", "train.rollout_size=64", "algo.group_size=8", "train.ga_steps=8", "task.max_new_tokens=128"]
    # bf16 weights on the GPU (the preset's); fp32 on the CPU, where bf16 weights run 3x slower outside autocast
    return [f"model.path={random_model_dir(key, work, cpu)}", f"model.dtype={'fp32' if cpu else 'bf16'}",
            f"model.gradient_checkpointing={str(key != 'smollm2').lower()}",  # the 1.5B as the preset; 135M needs none
            "task.name=prompts", "task.generate=", f"task.train_file={data / 'train.jsonl'}",
            f"task.test_file={data / 'test.jsonl'}", "reward.cls=gpu_check:DistinctCharacters",
            "algo.skip_zero_advantage=false", "train.log_every=1", "train.eval_every=1000000",
            "train.ckpt_every=1000000", "eval.size=8", "eval.batch_size=8", "run.progress=false",
            "run.tensorboard=false", f"run.device={'cpu' if cpu else 'cuda'}", f"run.dir={run_dir}", *size]


def grpo_run(key: str, work: Path, cpu: bool) -> dict:
    import torch

    from lmrl.config import load_config
    from lmrl.train.rl_trainer import RLTrainer

    run_dir = work / f"grpo-{key}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config("math-grpo-qwen-gpu", grpo_overrides(key, work, cpu, run_dir))
    trace = None
    if torch.cuda.is_available() and not cpu:
        torch.cuda.reset_peak_memory_stats()
        trace = UpdateMemoryTrace()
    trainer = RLTrainer(cfg, callbacks=[trace] if trace else None)
    summary = trainer.train()
    rows = [r for r in read_metrics(run_dir) if "time/step_s" in r]
    later = rows[1:] or rows  # the first step warms up kernels and allocators
    found = {"steps": summary.get("rl_steps"), "rollout_size": cfg.train.rollout_size,
             "max_new_tokens": cfg.task.max_new_tokens, "gradient_checkpointing": cfg.model.gradient_checkpointing,
             "lora_r": cfg.lora.r, "step_s_median": median(r["time/step_s"] for r in later),
             "rollout_s_median": median(r["time/rollout_s"] for r in later),
             "update_s_median": median(r["time/update_s"] for r in later),
             "update_fraction": median(r.get("train/update_fraction", 1.0) for r in later)}
    found.update(peak_memory(cpu))
    if trace is not None:
        found["first_update_memory"] = trace.breakdown
    found.update(planned(cfg, found, cpu))
    found.update(rollout_speed(trainer, cfg, batch=cfg.train.rollout_size, cpu=cpu))
    return found


def planned(cfg, measured: dict, cpu: bool) -> dict:
    """`lmrl plan`'s figures for the run just measured: its peak without the process's own runtime
    (what torch's allocator counts, as `peak_gpu_allocated_gib` does), its error against that peak,
    and its step-time estimate."""
    from lmrl.train.plan import RUNTIME_BYTES, plan

    p = plan(cfg)
    peak = (p.peak_bytes - RUNTIME_BYTES[p.device.kind]) / 2**30
    found = {"plan_peak_gib": round(peak, 2), "plan_step_s": round(p.step_seconds["step"], 3)}
    if not cpu and measured.get("peak_gpu_allocated_gib"):
        found["plan_peak_error"] = round(peak / measured["peak_gpu_allocated_gib"] - 1, 3)
    return found


def rollout_speed(trainer, cfg, *, batch: int, cpu: bool) -> dict:
    """Tokens/s of the sampling loop against `model.generate(do_sample=True)` on the same `batch` prompts
    (GRPO groups: batch / group_size prompts, each repeated), `task.max_new_tokens` each; the median of 2
    timed calls per arm after one untimed one. On a GPU also the loop with its CUDA graph off (one timed
    call), and whether the graph was used. Tokens are real tokens up to each row's first EOS."""
    import torch

    policy, task = trainer.model, trainer.task
    ids = torch.arange(batch // cfg.algo.group_size).repeat_interleave(cfg.algo.group_size)
    enc, mask = policy.encode(task.prompts(ids))
    n = cfg.task.max_new_tokens
    sync = torch.cuda.synchronize if enc.is_cuda else (lambda: None)
    eos = policy.eos_token_ids

    def lean(seed):
        return int(policy.generate_ids(enc, mask, n, generator=torch.Generator(enc.device).manual_seed(seed))[1].sum())

    def hf(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            out = policy.hf_model.generate(input_ids=enc, attention_mask=mask, max_new_tokens=n, do_sample=True,
                                           temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos,
                                           pad_token_id=policy.tokenizer.pad_token_id)[:, enc.size(1):]
        ended = torch.isin(out, torch.tensor(eos, device=out.device)).long()
        return int(((ended.cumsum(1) - ended) == 0).sum())

    def lean_eager(seed):  # the loop without CUDA graphs: one timed call, its kernels warmed up by `lean`'s
        policy.cuda_graphs = False
        try:
            return lean(seed)
        finally:
            policy.cuda_graphs = True

    from lmrl.generation import decode_graph

    found = {"rollout_batch": batch}
    policy.eval()
    arms = [("loop", lean, True, (1, 2)), ("generate", hf, True, (1, 2))]
    if enc.is_cuda:
        arms.insert(1, ("loop_eager", lean_eager, False, (1,)))
    for name, arm, warm, seeds in arms:
        if warm:
            arm(0)
        speeds = []
        for seed in seeds:
            sync()
            start = time.perf_counter()
            tokens = arm(seed)
            sync()
            speeds.append(tokens / (time.perf_counter() - start))
        found[f"{name}_tokens_per_s"] = round(statistics.median(speeds), 1)
    found["loop_vs_generate"] = round(found["loop_tokens_per_s"] / found["generate_tokens_per_s"], 2)
    if enc.is_cuda:  # whether the decode step really ran as a CUDA graph (decode_graph falls back to eager)
        found["cuda_graph"] = type(policy.model) not in decode_graph._capture_failed
    return found


def peak_memory(cpu: bool) -> dict:
    import resource

    import torch

    found = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    if torch.cuda.is_available() and not cpu:
        found["peak_gpu_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        found["peak_gpu_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return found


class UpdateMemoryTrace:
    """A trainer callback (`lmrl.train.callbacks` hooks) that records the CUDA allocator's history over the
    first step's update (from its first scored episode to the end of its optimizer step: the rollout is
    left out) and keeps `live_at_peak` of it as `breakdown`: what the update held at its peak, by where
    it was allocated, the figures `lmrl plan`'s update parts are checked against. Python stacks only,
    and the first step is left out of the timed medians."""

    MAX_EVENTS = 500_000

    def __init__(self):
        self.breakdown: dict | None = None
        self._baseline: int | None = None

    def on_episode_end(self, trainer, episode) -> None:
        import torch

        if self._baseline is None:
            torch.cuda.synchronize()
            self._baseline = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=self.MAX_EVENTS, stacks="python")

    def on_update_end(self, trainer, step: int) -> None:
        import torch

        if self._baseline is None or self.breakdown is not None:
            return
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = snapshot["device_traces"][torch.cuda.current_device()]
        self.breakdown = live_at_peak(events, self._baseline)


def live_at_peak(events: list[dict], baseline: int = 0, top: int = 12) -> dict:
    """What a CUDA allocator trace (`torch.cuda.memory._snapshot()["device_traces"][device]`, events in
    order: `alloc` and `free_requested` with `addr`, `size`, `frames` innermost first) held when its
    allocated bytes peaked, `baseline` bytes being allocated as it began: the peak, and the blocks
    alive then summed by `allocation_site`, largest first (`top` of them; the rest as one line)."""
    total = peak = 0
    at = -1  # the event after which the peak was reached (-1: before any)
    for i, e in enumerate(events):
        total += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_requested" else 0
        if total > peak:
            peak, at = total, i
    live: dict[int, dict] = {}
    for e in events[:at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)  # blocks allocated before the trace began are in the baseline
    sites: dict[str, list[int]] = {}
    for e in live.values():
        site = sites.setdefault(allocation_site(e.get("frames", [])), [0, 0])
        site[0] += e["size"]
        site[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])
    rest = ranked[top:]
    rows = [{"where": where, "gib": round(size / 2**30, 3), "blocks": n} for where, (size, n) in ranked[:top]]
    if rest:
        rows.append({"where": f"{len(rest)} other sites", "gib": round(sum(s for _, (s, _) in rest) / 2**30, 3),
                     "blocks": sum(n for _, (_, n) in rest)})
    return {"baseline_gib": round(baseline / 2**30, 3), "peak_gib": round((baseline + peak) / 2**30, 3),
            "events": len(events), "peak_after_event": at, "live_at_peak": rows}


def allocation_site(frames: list[dict]) -> str:
    """`file:line function` of the innermost Python frame outside torch itself (paths from the package
    or repo root), e.g. transformers/models/llama/modeling_llama.py:118 forward."""
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" in name or not name.endswith(".py"):
            continue
        for root in ("site-packages/", "dist-packages/", f"{REPO}/"):
            if root in name:
                name = name.split(root, 1)[1]
                break
        return f"{name}:{f.get('line')} {f.get('name')}"
    return "no Python frame (autograd's backward thread, or torch itself)"


# ------------------------------------------------------------------------------------------ torchrun

def stage_torchrun(strategy: str):
    def run(work: Path, cpu: bool) -> dict:
        import torch

        gpus = 0 if cpu else torch.cuda.device_count()
        if not cpu and gpus == 0:
            raise RuntimeError("no CUDA device for NCCL")
        n = max(gpus, 1)
        random_model_dir("smollm2", work, cpu)  # made once here, not by every rank
        result = work / f"torchrun-{strategy}.json"
        result.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__,
               "--torchrun-worker", strategy, "--work", str(work), "--result", str(result)] + (["--cpu"] if cpu else [])
        proc = subprocess.run(cmd, cwd=REPO)
        found = json.loads(result.read_text()) if result.is_file() else {}
        if proc.returncode != 0 or "error" in found:
            raise RuntimeError(found.get("error") or f"torchrun exited {proc.returncode}")
        return {"nproc_per_node": n, **found}
    return run


def torchrun_worker(strategy: str, work: Path, cpu: bool, result: Path) -> None:
    """One rank: GRPO + LoRA on the SmolLM2 shape under `distributed.strategy`; rank 0 writes the figures,
    after checking that the strategy's code path really ran (a DDP wrapper, or FSDP-sharded modules)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from lmrl.config import load_config
    from lmrl.parallel.ddp import shutdown
    from lmrl.parallel.fsdp import is_sharded
    from lmrl.train.rl_trainer import RLTrainer

    run_dir = work / f"torchrun-{strategy}-run"
    if os.environ.get("RANK", "0") == "0":
        shutil.rmtree(run_dir, ignore_errors=True)
    # the code path, not a speed: a small rollout (the grpo stages time the full-size one)
    small = [] if cpu else ["train.rollout_size=16", "train.ga_steps=2", "task.max_new_tokens=32"]
    overrides = grpo_overrides("smollm2", work, cpu, run_dir) + [f"distributed.strategy={strategy}", "train.steps=3",
                                                                  *small]
    if torch.cuda.is_available() and not cpu:
        torch.cuda.reset_peak_memory_stats()
    try:
        trainer = RLTrainer(load_config("math-grpo-qwen-gpu", overrides))
        trainer.train()
        wrapped = (isinstance(trainer.train_model, DistributedDataParallel) if strategy == "ddp"
                   else is_sharded(trainer.module))
        found = {"backend": dist.get_backend() if dist.is_initialized() else None,
                 "world_size": trainer.dist.world_size, f"{strategy}_code_path": wrapped}
        if trainer.dist.is_main:
            rows = [r for r in read_metrics(run_dir) if "time/step_s" in r]
            found["step_s_median"] = median(r["time/step_s"] for r in rows[1:] or rows)
            found.update(peak_memory(cpu))
            if not wrapped or found["backend"] != ("gloo" if cpu else "nccl"):
                found["error"] = (f"{strategy} did not run as asked: backend {found['backend']}, "
                                  f"{strategy} code path {wrapped}")
            result.write_text(json.dumps(found))
    finally:
        shutdown()


# ------------------------------------------------------------------------------------------ helpers

def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def median(values) -> float | None:
    values = list(values)
    return round(statistics.median(values), 4) if values else None


STAGES = {"env": stage_env, "install": stage_install, "cuda-tests": stage_cuda_tests, "adder": stage_adder,
          "models": stage_models, "grpo-smollm2": stage_grpo("smollm2"), "grpo-qwen1.5b": stage_grpo("qwen1.5b"),
          "ddp": stage_torchrun("ddp"), "fsdp": stage_torchrun("fsdp")}

if __name__ == "__main__":
    sys.exit(main())
