"""The distribution a sampler draws the next token from, given the model's logits: temperature, then
top-k, then top-p (nucleus), in the order and with the tie rules of transformers' logits warpers
(`TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`), so lmrl's samplers, `generate`
with lmrl's log-prob recorder, and TRL's rollouts draw from the same distribution.

    logits = warp_logits(logits, temperature=0.7, top_k=50, top_p=0.9)   # (B, V), -inf outside
"""

from __future__ import annotations

import torch


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """`logits` (..., V) divided by `temperature`, with -inf outside the `top_k` most likely tokens
    (0: off) and outside the nucleus: the most likely tokens whose probabilities sum to at least
    `top_p` (1: off; the most likely token always stays). `logits` itself is left as it is."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = logits.sort(dim=-1)
        # drop the least likely tokens while the mass dropped stays within 1 - top_p
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits
