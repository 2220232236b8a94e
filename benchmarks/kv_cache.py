"""How much the KV cache speeds up sampling from the built-in GPT.

Times `GPT.generate(..., use_cache=True)` against `use_cache=False`, which recomputes the whole
prefix every step, on the `adder` preset's model shape (4 layers, 8 heads, 256 dims, n_position 64)
with random weights and greedy decoding, and checks that both draw the same tokens.

    python -m benchmarks.kv_cache [--batch 256] [--repeats 3] [--budget 30] [--threads N]   # from the repo root

Cases: the adder's real rollout (8-token prompts, 4 new tokens) and a long generation that fills
n_position (56 new tokens), where recomputing the prefix costs O(T^2) forwards instead of O(T).
Each case shows the median of `--repeats` runs, fewer where a case has used up `--budget` seconds:
at batch 256 one uncached long generation alone is ~3 TFLOP, tens of seconds on a laptop CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lmrl.models.gpt import GPT, GPTConfig
from lmrl.tasks.arithmetic import ArithmeticTask

CASES = [  # (name, new tokens)
    ("adder rollout", 4),
    ("long generation", 56),  # 8-token prompt + 56 = n_position 64
]


def adder_model(vocab_size: int) -> GPT:
    """Random-init GPT with the `adder` preset's shape (its `model` config section)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, n_position=64, n_layer=4, n_head=8, n_embd=256)).eval()


def timed_generate(model: GPT, prompts: torch.Tensor, new_tokens: int, use_cache: bool) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    tokens, _ = model.generate(prompts, new_tokens, greedy=True, use_cache=use_cache)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="prompts sampled together (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case, within --budget; the median is shown (default 3)")
    parser.add_argument("--budget", type=float, default=30.0,
                        help="stop repeating a case once it has taken this many seconds; it always runs once (default 30)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    task = ArithmeticTask()
    model = adder_model(task.tokenizer.vocab_size)
    prompts = task.batch(task.sample_train_ids(args.batch, torch.Generator().manual_seed(0))).prompts  # (B, 8)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"model {model.num_params() / 1e6:.2f}M params, prompts {tuple(prompts.shape)}")

    # Warm-up: a short call of each kind at the real batch size, so one-time costs (allocator,
    # kernel selection) stay out of the timings without paying for a full uncached long run.
    for use_cache in (True, False):
        timed_generate(model, prompts, 2, use_cache)

    header = (f"{'case':<16} {'batch':>5} {'new tokens':>10} {'runs':>4} {'cached s':>9} {'uncached s':>10} "
              f"{'speedup':>8}  identical")
    print(header)
    print("-" * len(header))
    for name, new_tokens in CASES:
        cached_s, uncached_s, identical = [], [], True
        case_start = time.perf_counter()
        while len(cached_s) < args.repeats:  # alternate the two so drifting machine load hits both alike
            t, cached = timed_generate(model, prompts, new_tokens, use_cache=True)
            cached_s.append(t)
            t, uncached = timed_generate(model, prompts, new_tokens, use_cache=False)
            uncached_s.append(t)
            identical &= torch.equal(cached, uncached)
            if time.perf_counter() - case_start > args.budget:
                break
        c, u = statistics.median(cached_s), statistics.median(uncached_s)
        print(f"{name:<16} {args.batch:>5} {new_tokens:>10} {len(cached_s):>4} {c:>9.3f} {u:>10.3f} "
              f"{u / c:>7.2f}x  {'yes' if identical else 'no'}", flush=True)


if __name__ == "__main__":
    main()
