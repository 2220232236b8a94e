"""Held-out evaluation: greedy decoding, no update, the same sampling path as training."""

from __future__ import annotations

import torch

from ..dist.ddp import all_reduce_sum
from ..rollout.local import sample


@torch.no_grad()
def evaluate(model, task, ids: torch.Tensor, *, batch_size: int = 500, device="cpu",
             rank: int = 0, world_size: int = 1) -> dict[str, float]:
    """Exact-match accuracy and mean reward of greedy answers on problems `ids`.

    Under DDP each rank decodes a strided share of `ids` and the counts are summed, so every rank
    returns the same numbers."""
    ids = ids[rank::world_size]
    totals = torch.zeros(3, dtype=torch.float64)  # exact, reward, count
    for chunk in ids.split(batch_size):
        batch = task.batch(chunk)
        ro = sample(model, batch.prompts.to(device), task.answer_len, greedy=True)
        rewards, exact = task.score_batch(batch.prompts, ro.completions.cpu())
        totals += torch.tensor([exact.sum().item(), rewards.sum().item(), len(chunk)], dtype=torch.float64)
    if world_size > 1:
        totals = all_reduce_sum(totals.to(device)).cpu()
    n = max(totals[2].item(), 1.0)
    return {"eval/accuracy": totals[0].item() / n, "eval/reward": totals[1].item() / n}
