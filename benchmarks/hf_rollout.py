"""Rollout speed on a Hugging Face model: plain `model.generate` against lmrl's lean sampling loop.

    python -m benchmarks.hf_rollout [--batch 32] [--max-new-tokens 64] [--repeats 3] [--threads 2]
                                    [--model smollm2-135m-instruct] [--convert /tmp/smollm2-st] [--dtype fp32]
                                    # from the repo root

Samples (temperature 1, no top-k / top-p) `--batch` chat-templated arithmetic questions with each arm,
in turn within each repeat (so load from other processes falls on all arms alike), after one short
untimed warm-up call per arm, and prints the median of `--repeats` runs. Tokens are the real
generated tokens, up to and including each row's first EOS; the ratio is tokens/s over plain
`generate`'s. Repeat r samples with seed r in every arm: the lean arms all draw the very same
tokens (their sampling does not depend on the batch's make-up), `generate` draws others. Arms:

  generate              `model.generate(do_sample=True)` with its default dynamic cache, nothing recorded
  generate+logprobs     `HFPolicy.generate_text` with generation_engine="hf": the same plus a logits
                        processor recording log-probs (lmrl's rollouts before the lean loop)
  lean                  `lmrl.generation.hf_generate.generate` with no prefix sharing, no compaction, no packing
  lean+share            prefill runs the prompts' common prefix (and repeated prompts) once
  lean+compact(f)       finished rows dropped once they are a fraction f of the running batch
  lean+share+compact(f) both
  lean+pack             linear layers from weights prepacked for oneDNN (`lmrl.generation.packed_linear`)
  lean+share+compact(1/8)+pack   all three: the function's defaults
  lean+static+...       a preallocated StaticCache instead of the dynamic one
  ...+concat            transformers' own DynamicCache, which grows by concatenation, instead of the
                        default one written in place (`lmrl.generation.kv_cache`)
  default+autocast(bf16)   the defaults under `torch.autocast(cpu, bf16)`, as `run.mixed_precision=bf16` runs
                        rollouts: fp32 weights, wide layers packed in bf16, products in bf16 (`--dtype fp32` only)
  generate+autocast(bf16)  `model.generate` under the same autocast; the "/roof" of both is the bf16 compute roofline
  lora+autocast(bf16)   default+autocast(bf16) on the model with peft LoRA adapters (r 16, alpha 32 on
                        q/k/v/o, as benchmarks/trl_grpo_step.py trains; B drawn non-zero), whose layers
                        run from merged weights (`lmrl.generation.packed_linear`)
  lora+autocast(bf16)+unmerged  the same with each adapter's own products, as before merging

Before timing, greedy decoding by `generate` and by the lean loop (defaults) is compared token for
token. `--convert DIR` writes a GGUF model once as a plain directory there and loads that (faster).

  vllm                  `--vllm-python PATH` (the interpreter of the environment `make test-vllm` builds,
                        e.g. .venv-vllm/bin/python): `vllm.LLM` (eager, prefix caching off) on the same
                        model directory (`--convert`), dtype, token ids, batch, token budget, temperature 1
                        and threads, in a child process of its own, timed after the other arms (its own
                        warm-up call first; each request seeded). Its tokens/s are real tokens as above.

Roofline: a decode step reads every weight once and does 2 x parameters x B floating-point
operations at batch B, so it can go no faster than the slower of memory (weight bytes / bandwidth)
and arithmetic (2 x parameters x B / matmul rate). Both rates are measured in the same run, before
the arms, with the benchmark's threads: the bandwidth as the best of five passes of `torch.sum` over
a 1 GiB fp32 tensor (reads only, as a decode step's weights are; a copy, read and write counted, is
printed beside it), the matmul rate as the best of five 1024 x 1024 fp32 (or bf16) products. Each
arm's tokens/s is printed as a fraction of the bandwidth roofline (B steps' tokens per weight read)
and of the binding one (the lower of the two). Both are upper bounds: finished rows still cost a
step until the batch ends, the KV cache and activations are read too, and a decode step's thin
matrix products run below a square product's rate. How far below is printed after the arms: the
time one decode step at full batch would take if it ran only its linear layers (packed, in bf16 for
the autocast arms, as the loop runs them), and the tokens/s that allows as a fraction of the roofline.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import unittest.mock
from pathlib import Path

import torch
from transformers import GenerationConfig

from lmrl.models.hf import apply_chat_template, convert_gguf, load_hf_policy
from lmrl.generation import packed_linear
from lmrl.generation.hf_generate import generate


def questions(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? Put the final answer in <answer></answer>."
            for _ in range(n)]


def real_tokens(completion: torch.Tensor, eos_ids: list[int]) -> int:
    """Tokens up to and including each row's first EOS."""
    is_eos = torch.isin(completion, torch.tensor(eos_ids)).long()
    return int(((is_eos.cumsum(1) - is_eos) == 0).sum())


RESULT = "vllm-arm-result:"  # the worker's result line, among whatever else vLLM prints


def best_seconds(run, repeats: int) -> float:
    """The shortest wall time of `repeats` calls of `run()`."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(repeats: int = 5, gib: float = 1.0) -> tuple[float, float]:
    """(read bandwidth, copy bandwidth) in bytes/s, the best of `repeats` passes over a `gib` GiB
    fp32 tensor with torch's current threads: `sum` reads it; `copy_` reads and writes it (counted twice)."""
    x = torch.ones(int(gib * 2**30) // 4)
    y = torch.empty_like(x)
    size = x.numel() * x.element_size()
    return size / best_seconds(x.sum, repeats), 2 * size / best_seconds(lambda: y.copy_(x), repeats)


def matmul_rate(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    """Floating-point operations per second of the best of `repeats` n x n matrix products."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # first call: thread pool and kernel selection, not timed
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats)


def products_seconds(model: torch.nn.Module, batch: int, bf16: bool, repeats: int = 5) -> float:
    """Seconds a decode step at `batch` rows would take if it ran its linear layers and nothing else:
    every `nn.Linear` of `model` called once on a (batch, in_features) fp32 input, packed as the
    sampling loop packs them (in bf16 under autocast, the rest of the step in fp32, as
    `hf_generate.generate` runs `run.mixed_precision=bf16`), the best of `repeats` passes."""
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    inputs = [torch.randn(batch, layer.in_features) for layer in layers]

    def step():
        for layer, x in zip(layers, inputs):
            layer(x)

    with contextlib.ExitStack() as stack:
        if bf16:
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        stack.enter_context(torch.inference_mode())
        stack.enter_context(packed_linear.packed_linears(model, batch))
        stack.enter_context(torch.autocast("cpu", enabled=False))
        step()  # first call: kernel selection, not timed
        return best_seconds(step, repeats)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every distinct parameter and buffer tensor (a tied embedding counts once)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def lora_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with peft LoRA adapters (r 16, alpha 32 on q/k/v/o) whose B is drawn from a
    normal distribution (peft starts it at zero, where the adapters would change nothing), in eval mode."""
    import peft

    wrapped = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 1e-3)
    return wrapped.eval()


def vllm_worker(args) -> None:
    """In the vLLM environment: time `vllm.LLM.generate` on the token ids in `--vllm-job`; print JSON."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(Path(args.vllm_job).read_text())
    llm = LLM(model=job["model"], dtype={"fp32": "float32", "bf16": "bfloat16"}[job["dtype"]], seed=0,
              enforce_eager=True, enable_prefix_caching=False, generation_config="vllm",
              gpu_memory_utilization=job["memory_fraction"])
    prompts = [TokensPrompt(prompt_token_ids=row) for row in job["prompts"]]

    def run(seed: int, rows: list, max_tokens: int) -> tuple[int, float]:
        params = [SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, max_tokens=max_tokens, seed=seed * 1000 + i,
                                 stop_token_ids=job["eos"], detokenize=False) for i in range(len(rows))]
        start = time.perf_counter()
        outputs = llm.generate(rows, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        return sum(len(o.outputs[0].token_ids) for o in outputs), seconds  # up to and including the EOS

    run(12345, prompts[:4], 8)  # warm-up, as the other arms'
    results = [run(r, prompts, job["max_new_tokens"]) for r in range(job["repeats"])]
    print(RESULT, json.dumps({"results": results, "torch_threads": torch.get_num_threads()}), flush=True)


def vllm_arm(args, model_dir: str, ids: torch.Tensor, mask: torch.Tensor, eos: list[int]) -> list[tuple[int, float]]:
    """The vLLM arm's (tokens, seconds) per repeat, from a child process in `args.vllm_python`'s environment."""
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"model": model_dir, "dtype": args.dtype, "prompts": rows, "eos": eos,
                                   "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                                   "memory_fraction": args.vllm_memory_fraction}))
        cmd = [args.vllm_python, str(Path(__file__).resolve()), "--vllm-worker", "--vllm-job", str(job),
               "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        sys.exit(f"the vLLM arm failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if not lines:
        sys.exit(f"the vLLM arm printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    out = json.loads(lines[-1].removeprefix(RESULT))
    for r, (tokens, seconds) in enumerate(out["results"]):
        print(f"  repeat {r}: vllm: {tokens} tokens in {seconds:.2f}s", file=sys.stderr, flush=True)
    return [tuple(x) for x in out["results"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model directory, .gguf or packaged name")
    parser.add_argument("--convert", default=None, help="convert a GGUF model once into this directory and load that")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per arm; the median is shown (default 3)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="model weights (default fp32)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--arms", default="", help="comma-separated arms to time besides `generate` (default: all)")
    parser.add_argument("--no-greedy-check", action="store_true", help="skip comparing greedy outputs")
    parser.add_argument("--vllm-python", default=None,
                        help="interpreter of a vLLM environment (e.g. .venv-vllm/bin/python): adds the vllm arm; "
                             "needs --convert (vLLM loads the model directory)")
    parser.add_argument("--vllm-memory-fraction", type=float, default=0.25,
                        help="vLLM's gpu_memory_utilization: on its CPU build the share of a NUMA node's RAM it "
                             "reserves for weights, activations and KV cache (default 0.25; 0.1 of a 12.6 GiB "
                             "node left no room for the KV cache)")
    parser.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vllm-job", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_worker:
        return vllm_worker(args)
    if args.vllm_python and not args.convert:
        parser.error("--vllm-python needs --convert DIR: vLLM loads the converted model directory")
    torch.set_num_threads(args.threads)

    path = str(convert_gguf(args.model, None, args.convert)) if args.convert else args.model
    policy, tokenizer = load_hf_policy(path, dtype=args.dtype)
    policy.eval()
    model, eos, pad = policy.model, policy.eos_token_ids, tokenizer.pad_token_id
    prompts = [apply_chat_template(tokenizer, [{"role": "user", "content": q}]) for q in questions(args.batch)]
    ids, mask = policy.encode(prompts)
    n = args.max_new_tokens
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.model} ({args.dtype}): "
          f"{policy.num_params() / 1e6:.0f}M params, prompts {tuple(ids.shape)}, max_new_tokens {n}, eos {eos}")
    read_bw, copy_bw = memory_bandwidth()
    flops = matmul_rate(torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    weights = weight_bytes(model)
    memory_roof = args.batch * read_bw / weights  # tokens/s if each step only read the weights
    compute_roof = flops / (2 * policy.num_params())  # tokens/s if each step only did its matrix products
    roofline = min(memory_roof, compute_roof)
    print(f"memory bandwidth {read_bw / 1e9:.1f} GB/s read (sum), {copy_bw / 1e9:.1f} GB/s copy (read + write); "
          f"weights {weights / 1e6:.0f} MB per decode step -> bandwidth roofline {memory_roof:.0f} tokens/s at "
          f"batch {args.batch}; matmul {flops / 1e9:.0f} GFLOP/s -> compute roofline {compute_roof:.0f} tokens/s")

    def hf_generate(seed: int, do_sample: bool = True) -> torch.Tensor:
        sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {}
        config = GenerationConfig(max_new_tokens=n, do_sample=do_sample, eos_token_id=eos, pad_token_id=pad, **sampling)
        torch.manual_seed(seed)
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.size(1):]

    def lean(seed: int, **kwargs) -> torch.Tensor:
        return generate(model, ids, mask, n, eos_token_ids=eos, pad_token_id=pad,
                        generator=torch.Generator().manual_seed(seed), **kwargs)[0]

    def autocast(arm, seed: int, **kwargs) -> torch.Tensor:  # run.mixed_precision=bf16: fp32 weights, bf16 products
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return arm(seed, **kwargs)

    lora_model = None

    def lora(seed: int, merge: bool = True) -> torch.Tensor:  # a LoRA policy's rollouts, adapters merged or not
        nonlocal lora_model
        if lora_model is None:
            lora_model = lora_copy(model)
        merging = contextlib.nullcontext() if merge else unittest.mock.patch.object(packed_linear, "_active_lora",
                                                                                     lambda module: None)
        with torch.autocast("cpu", dtype=torch.bfloat16), merging:
            return generate(lora_model, ids, mask, n, eos_token_ids=eos, pad_token_id=pad,
                            generator=torch.Generator().manual_seed(seed))[0]

    def recorded(seed: int) -> torch.Tensor:  # HFPolicy's HF-`generate` engine, whatever its default
        engine = getattr(policy, "generation_engine", None)
        if engine is not None:
            policy.generation_engine = "hf"
        try:
            return policy.generate_text(prompts, n, generator=torch.Generator().manual_seed(seed))[1]
        finally:
            if engine is not None:
                policy.generation_engine = engine

    if not args.no_greedy_check:
        ref = hf_generate(0, do_sample=False)
        ours = lean(0, greedy=True)
        same = ref.shape == ours.shape and torch.equal(ref, ours)
        print(f"greedy check: lean loop {'==' if same else '!='} model.generate(do_sample=False) on "
              f"{tuple(ref.shape)} tokens" + ("" if same else f", first difference at "
              f"{(ref[:, :ours.size(1)] != ours[:, :ref.size(1)]).nonzero()[:1].tolist()}"))

    arms = {
        "generate": hf_generate,
        "generate+logprobs": recorded,
        "lean": lambda s: lean(s, compact_at=None, share_prefix=False, pack_weights=False),
        "lean+share": lambda s: lean(s, compact_at=None, pack_weights=False),
        "lean+compact(1/8)": lambda s: lean(s, compact_at=0.125, share_prefix=False, pack_weights=False),
        "lean+share+compact(1/8)": lambda s: lean(s, compact_at=0.125, pack_weights=False),
        "lean+pack": lambda s: lean(s, compact_at=None, share_prefix=False),
        "lean+share+compact(0)+pack": lambda s: lean(s, compact_at=0.0),
        "lean+share+compact(1/8)+pack": lambda s: lean(s, compact_at=0.125),
        "lean+share+compact(1/4)+pack": lambda s: lean(s, compact_at=0.25),
        "lean+static+share+compact(1/8)+pack": lambda s: lean(s, compact_at=0.125, cache="static"),
        "lean+share+compact(1/8)+pack+concat": lambda s: lean(s, compact_at=0.125, cache="concat"),
        "default+autocast(bf16)": lambda s: autocast(lean, s, compact_at=0.125),
        "default+autocast(bf16)+concat": lambda s: autocast(lean, s, compact_at=0.125, cache="concat"),
        "generate+autocast(bf16)": lambda s: autocast(hf_generate, s),
        "lora+autocast(bf16)": lora,
        "lora+autocast(bf16)+unmerged": lambda s: lora(s, merge=False),
    }
    if args.arms:
        arms = {k: v for k, v in arms.items() if k == "generate" or k in args.arms.split(",")}
    # Warm-up: each arm once on a few prompts (first calls pay for allocations, thread pools, lazy imports).
    full, n = (ids, mask, prompts), 8
    ids, mask, prompts = ids[:4], mask[:4], prompts[:4]
    for run in arms.values():
        run(12345)
    (ids, mask, prompts), n = full, args.max_new_tokens
    results = {name: [] for name in arms}  # (tokens, seconds) per repeat
    for r in range(args.repeats):
        for name, run in arms.items():
            start = time.perf_counter()
            completion = run(r)
            results[name].append((real_tokens(completion, eos), time.perf_counter() - start))
            print(f"  repeat {r}: {name}: {results[name][-1][0]} tokens in {results[name][-1][1]:.2f}s",
                  file=sys.stderr, flush=True)

    if args.vllm_python:
        results["vllm"] = vllm_arm(args, path, ids, mask, eos)

    # an autocast arm's products run in bf16: its compute roofline is bf16's (the weights read stay fp32)
    bf16_roof = None
    if any("autocast" in name for name in results):
        bf16_flops = matmul_rate(torch.bfloat16)
        bf16_roof = min(memory_roof, bf16_flops / (2 * policy.num_params()))
        print(f"bf16 matmul {bf16_flops / 1e9:.0f} GFLOP/s -> roofline {bf16_roof:.0f} tokens/s for the autocast arms")
    # what the products alone allow: a decode step's thin products run below a square product's rate
    for bf16 in [False, True] if bf16_roof else [False]:
        seconds = products_seconds(model, args.batch, bf16)
        roof = bf16_roof if bf16 else roofline
        print(f"{'bf16 (autocast)' if bf16 else args.dtype} linear layers alone at batch {args.batch}: "
              f"{seconds * 1e3:.1f} ms a decode step -> at most {args.batch / seconds:.0f} tokens/s, "
              f"{args.batch / seconds / roof:.2f} of the roofline")
    base = statistics.median(t / s for t, s in results["generate"])
    vllm_rate = statistics.median(t / s for t, s in results["vllm"]) if "vllm" in results else None
    print(f"\n{'arm':<40}{'tokens/s':>10}{'seconds':>9}{'tokens':>8}{'ratio':>7}{'/bw roof':>9}{'/roof':>7}"
          + (f"{'/vllm':>7}" if vllm_rate else ""))
    for name, rs in results.items():
        rate = statistics.median(t / s for t, s in rs)
        print(f"{name:<40}{rate:>10.1f}{statistics.median(s for _, s in rs):>9.2f}"
              f"{statistics.median(t for t, _ in rs):>8.0f}{rate / base:>7.2f}{rate / memory_roof:>9.2f}"
              f"{rate / (bf16_roof if 'autocast' in name else roofline):>7.2f}"
              + (f"{rate / vllm_rate:>7.2f}" if vllm_rate else ""))


if __name__ == "__main__":
    main()
