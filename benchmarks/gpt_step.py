"""The built-in GPT's RL step, part by part, against what PyTorch does without lmrl's choices.

On the `adder` preset's model (4 layers, 8 heads, 256 dims) and shapes (batch 128, 8-token prompts,
5 sampled tokens), under bf16 autocast as the preset trains, each row times one part of a step done
lmrl's way and PyTorch's default way, alternating the two so that drifting machine load hits both:

- attention (`lmrl.models.gpt.attend`, written out in bf16 on a CPU) against
  `F.scaled_dot_product_attention` with its default kernel and with its math kernel: the learner's
  pass (forward and backward), a prefill, a one-token decode step;
- dropout (`lmrl.models.gpt.dropout`, its mask cut from 64-bit random words on a CPU) against
  `F.dropout`, forward and backward over an activation of the warm-up's shape;
- AdamW with `fused=True` (what the trainers make) against its default per-tensor loop;
- whole parts: sampling a rollout (`GPT.generate`); the learner's forward, backward and AdamW step;
  a warm-up step (the same with the preset's dropout 0.1): lmrl's attention, dropout and optimizer
  against SDPA (default kernel, math kernel), `F.dropout` and the per-tensor loop.

    python -m benchmarks.gpt_step [--repeats 7] [--threads N]   # from the repo root

Prints milliseconds per call (median of the repeats) and ours / baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmrl.models import gpt
from lmrl.models.gpt import GPT, GPTConfig

BATCH, PROMPT, NEW = 128, 8, 5  # the adder's rollout: 128 prompts of 8 tokens ("012+345="), 5 tokens sampled


def sdpa_attend(q, k, v, dropout_p: float = 0.0, backend: SDPBackend | None = None):
    """`gpt.sdpa_attend` under SDPA's kernel `backend` (None: PyTorch's choice)."""
    with sdpa_kernel(backend) if backend is not None else nullcontext():
        return gpt.sdpa_attend(q, k, v, dropout_p)


ATTENTION = {
    "lmrl": gpt.attend,
    "sdpa": sdpa_attend,
    "sdpa math": lambda q, k, v, dropout_p=0.0: sdpa_attend(q, k, v, dropout_p, SDPBackend.MATH),
}


def attention_case(Q: int, L: int, grad: bool):
    """A call of `fn` on bf16 (B, nh, ·, hs) queries, keys and values shaped like the adder's."""
    cfg = GPTConfig()
    hs = cfg.n_embd // cfg.n_head
    q = torch.randn(BATCH, cfg.n_head, Q, hs, dtype=torch.bfloat16, requires_grad=grad)
    k, v = (torch.randn(BATCH, cfg.n_head, L, hs, dtype=torch.bfloat16, requires_grad=grad) for _ in range(2))

    def run(fn):
        with torch.set_grad_enabled(grad):
            y = fn(q, k, v)
        if grad:
            y.float().square().sum().backward()
    return run


def median_ms(fn, arms: dict, repeats: int, calls: int) -> dict[str, float]:
    for arm in arms.values():  # warm-up: allocator, kernel selection
        fn(arm)
    times = {name: [] for name in arms}
    for _ in range(repeats):
        for name, arm in arms.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn(arm)
            times[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per row; the median is shown (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, model {model.num_params() / 1e6:.2f}M params, "
          f"batch {BATCH}, {PROMPT}-token prompts, {NEW} new tokens, bf16 autocast")
    rows = []

    for name, Q, L, grad in (("attention: learner pass (fwd+bwd)", PROMPT + NEW - 1, PROMPT + NEW - 1, True),
                             ("attention: prefill", PROMPT, PROMPT, False),
                             ("attention: decode step", 1, PROMPT + NEW - 1, False)):
        rows.append((name, median_ms(attention_case(Q, L, grad), ATTENTION, args.repeats, 20)))

    x = torch.randn(BATCH, PROMPT + NEW - 1, model.config.n_embd, dtype=torch.bfloat16, requires_grad=True)
    rows.append(("dropout 0.1 (fwd+bwd)", median_ms(lambda fn: fn(x, 0.1).float().square().sum().backward(),
                                                    {"lmrl": gpt.dropout, "F.dropout": F.dropout}, args.repeats, 20)))

    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizers = {"lmrl": torch.optim.AdamW(params, lr=1e-4, fused=True),
                  "loop": torch.optim.AdamW(params, lr=1e-4, foreach=False)}
    rows.append(("AdamW step", median_ms(lambda opt: opt.step(), optimizers, args.repeats, 20)))

    prompts = torch.randint(0, 14, (BATCH, PROMPT))
    sequences = torch.randint(0, 14, (BATCH, PROMPT + NEW))
    setups = {"lmrl": (gpt.attend, gpt.dropout, optimizers["lmrl"]),
              "sdpa+loop": (ATTENTION["sdpa"], F.dropout, optimizers["loop"]),
              "math+loop": (ATTENTION["sdpa math"], F.dropout, optimizers["loop"])}

    def sample(setup):
        gpt.attend = setup[0]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model.generate(prompts, NEW)

    def learn(setup):
        gpt.attend, gpt.dropout, optimizer = setup
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(sequences[:, :-1], logits_to_keep=NEW)
        F.cross_entropy(logits.flatten(0, 1), sequences[:, -NEW:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        model.eval()
        rows.append(("rollout: GPT.generate", median_ms(sample, setups, args.repeats, 5)))
        model.train()
        rows.append(("learner: fwd+bwd+AdamW", median_ms(learn, setups, args.repeats, 5)))
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.1
        rows.append(("warm-up step, dropout 0.1", median_ms(learn, setups, args.repeats, 5)))
    finally:
        gpt.attend, gpt.dropout = ATTENTION["lmrl"], setups["lmrl"][1]

    print(f"{'part':<36} {'lmrl ms':>8}  {'baseline':<11} {'ms':>8} {'ratio':>6}")
    for name, ms in rows:
        ours = ms.pop("lmrl")
        for base, t in ms.items():
            print(f"{name:<36} {ours:>8.2f}  {base:<11} {t:>8.2f} {ours / t:>6.2f}")


if __name__ == "__main__":
    main()
