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
  lean                  `lmrl.rollout.hf_generate.generate` with no prefix sharing, no compaction, no packing
  lean+share            prefill runs the prompts' common prefix (and repeated prompts) once
  lean+compact(f)       finished rows dropped once they are a fraction f of the running batch
  lean+share+compact(f) both
  lean+pack             linear layers from weights prepacked for oneDNN (`lmrl.rollout.packed_linear`)
  lean+share+compact(1/8)+pack   all three: the function's defaults
  lean+static+...       a preallocated StaticCache instead of the dynamic one

Before timing, greedy decoding by `generate` and by the lean loop (defaults) is compared token for
token. `--convert DIR` writes a GGUF model once as a plain directory there and loads that (faster).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch
from transformers import GenerationConfig

from lmrl.models.hf import apply_chat_template, convert_gguf, load_hf_policy
from lmrl.rollout.hf_generate import generate


def questions(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? Put the final answer in <answer></answer>."
            for _ in range(n)]


def real_tokens(completion: torch.Tensor, eos_ids: list[int]) -> int:
    """Tokens up to and including each row's first EOS."""
    is_eos = torch.isin(completion, torch.tensor(eos_ids)).long()
    return int(((is_eos.cumsum(1) - is_eos) == 0).sum())


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
    args = parser.parse_args()
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

    def hf_generate(seed: int, do_sample: bool = True) -> torch.Tensor:
        sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {}
        config = GenerationConfig(max_new_tokens=n, do_sample=do_sample, eos_token_id=eos, pad_token_id=pad, **sampling)
        torch.manual_seed(seed)
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.size(1):]

    def lean(seed: int, **kwargs) -> torch.Tensor:
        return generate(model, ids, mask, n, eos_token_ids=eos, pad_token_id=pad,
                        generator=torch.Generator().manual_seed(seed), **kwargs)[0]

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

    base = statistics.median(t / s for t, s in results["generate"])
    print(f"\n{'arm':<40}{'tokens/s':>10}{'seconds':>9}{'tokens':>8}{'ratio':>7}")
    for name, rs in results.items():
        rate = statistics.median(t / s for t, s in rs)
        print(f"{name:<40}{rate:>10.1f}{statistics.median(s for _, s in rs):>9.2f}"
              f"{statistics.median(t for t, _ in rs):>8.0f}{rate / base:>7.2f}")


if __name__ == "__main__":
    main()
