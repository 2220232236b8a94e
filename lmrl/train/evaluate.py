"""Held-out evaluation: greedy decoding, no update, the same sampling path as training."""

from __future__ import annotations

from typing import Iterator

import torch

from ..parallel.ddp import all_reduce_sum


def scored_batches(model, task, ids: torch.Tensor, *, batch_size: int, greedy: bool = True, temperature: float = 1.0,
                   generator: torch.Generator | None = None) -> Iterator[tuple]:
    """(ids, rollout, rewards, exact, extras) for each batch of `ids`: the task's rollout by `model`
    (greedy unless told otherwise) and its `score_rollout`."""
    for chunk in ids.split(batch_size):
        ro = task.rollout(model, chunk, greedy=greedy, temperature=temperature, generator=generator)
        yield (chunk, ro, *task.score_rollout(chunk, ro))


@torch.no_grad()
def evaluate(model, task, ids: torch.Tensor, *, batch_size: int = 500, device="cpu",
             rank: int = 0, world_size: int = 1) -> dict[str, float]:
    """Exact-match accuracy, mean reward, mean completion length and the task's extra metrics
    (e.g. `eval/format_rate`) of greedy answers on problems `ids`. Each is the mean over the rows
    that have it: a NaN (an episode whose environment failed, a metric an episode did not report)
    is left out, and a number no row has is 0.

    Under DDP each rank decodes a strided share of `ids` and the sums are all-reduced, so every
    rank returns the same numbers."""
    ids = ids[rank::world_size]
    sums: dict[str, list[float]] = {}  # name -> [sum, rows]
    for chunk, ro, rewards, exact, extras in scored_batches(model, task, ids, batch_size=batch_size):
        rows = {"accuracy": exact, "reward": rewards.float().reshape(len(chunk), -1).mean(1),
                "length_mean": ro.mask.sum(1).cpu(), **extras}
        for k, v in rows.items():
            v = v.float()
            total = sums.setdefault(k, [0.0, 0.0])
            total[0] += v.nansum().item()
            total[1] += (~v.isnan()).sum().item()
    names = sorted(sums) if sums else ["accuracy", "reward", "length_mean"]
    totals = torch.tensor([x for k in names for x in sums.get(k, [0.0, 0.0])], dtype=torch.float64)
    if world_size > 1:
        totals = all_reduce_sum(totals.to(device)).cpu()
    totals = totals.view(-1, 2).tolist()
    return {f"eval/{k}": total / rows if rows else 0.0 for k, (total, rows) in zip(names, totals)}
