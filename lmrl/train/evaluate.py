"""Held-out evaluation: greedy decoding, no update, the same sampling path as training."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist

from ..parallel.ddp import all_reduce_sum

# what `evaluate(spread=True)` adds whatever the task (besides each reward function's eval/rewards/<name>/std)
SPREAD_METRICS = ("reward_std", "completions/mean_length", "completions/min_length", "completions/max_length",
                  "completions/clipped_ratio", "completions/mean_terminated_length",
                  "completions/min_terminated_length", "completions/max_terminated_length")


def scored_batches(model, task, ids: torch.Tensor, *, batch_size: int, greedy: bool = True, temperature: float = 1.0,
                   generator: torch.Generator | None = None) -> Iterator[tuple]:
    """(ids, rollout, rewards, exact, extras) for each batch of `ids`: the task's rollout by `model`
    (greedy unless told otherwise) and its `score_rollout`."""
    for chunk in ids.split(batch_size):
        ro = task.rollout(model, chunk, greedy=greedy, temperature=temperature, generator=generator)
        yield (chunk, ro, *task.score_rollout(chunk, ro))


@torch.no_grad()
def evaluate(model, task, ids: torch.Tensor, *, batch_size: int = 500, device="cpu",
             rank: int = 0, world_size: int = 1, spread: bool = False) -> dict[str, float]:
    """Exact-match accuracy, mean reward, mean completion length and the task's extra metrics
    (e.g. `eval/format_rate`) of greedy answers on problems `ids`. Each is the mean over the rows
    that have it: a NaN (an episode whose environment failed, a metric an episode did not report)
    is left out, and a number no row has is 0. With `spread`, also the spread of the same
    completions' rewards and lengths under TRL GRPOTrainer's names (`spread_metrics`).

    Under DDP each rank decodes a strided share of `ids` and the sums are all-reduced, so every
    rank returns the same numbers."""
    ids = ids[rank::world_size]
    sums: dict[str, list[float]] = {}  # name -> [sum, rows]
    columns: dict[str, list[torch.Tensor]] = {}  # with `spread`: name -> this rank's values, batch by batch
    for chunk, ro, rewards, exact, extras in scored_batches(model, task, ids, batch_size=batch_size):
        rows = {"accuracy": exact, "reward": rewards.float().reshape(len(chunk), -1).mean(1),
                "length_mean": ro.mask.sum(1).cpu(), **extras}
        if spread:  # each completion cut off by the length limit (none for fixed-length answers)
            rows["completions/clipped_ratio"] = ro.truncated if ro.truncated is not None else torch.zeros(len(chunk))
        for k, v in rows.items():
            v = v.float()
            total = sums.setdefault(k, [0.0, 0.0])
            total[0] += v.nansum().item()
            total[1] += (~v.isnan()).sum().item()
            if spread:
                columns.setdefault(k, []).append(v.reshape(-1).cpu())
    names = sorted(sums) if sums else ["accuracy", "reward", "length_mean"] + ["completions/clipped_ratio"] * spread
    totals = torch.tensor([x for k in names for x in sums.get(k, [0.0, 0.0])], dtype=torch.float64)
    if world_size > 1:
        totals = all_reduce_sum(totals.to(device)).cpu()
    totals = totals.view(-1, 2).tolist()
    out = {f"eval/{k}": total / rows if rows else 0.0 for k, (total, rows) in zip(names, totals)}
    if spread:
        values = {k: torch.cat(v) for k, v in columns.items()}
        counts = {k: rows for k, (_, rows) in zip(names, totals)}
        out.update(spread_metrics(values, counts, out, device=device, world_size=world_size))
    return out


def spread_metrics(values: dict[str, torch.Tensor], counts: dict[str, float], means: dict[str, float], *,
                   device="cpu", world_size: int = 1) -> dict[str, float]:
    """TRL GRPOTrainer's evaluation statistics of the completions whose per-row `values` (this rank's:
    "reward", "length_mean", "completions/clipped_ratio", each reward function's "rewards/<name>/mean")
    `evaluate` holds, with every rank's `counts` (rows that are not NaN) and `means` (eval/<name>):

    eval/reward_std, eval/rewards/<name>/std    the std over the rows scored (NaN left out), Bessel-corrected
                                                as TRL's nanstd; not reported over fewer than two rows
    eval/completions/{mean,min,max}_length      completion tokens the policy chose
    eval/completions/{mean,min,max}_terminated_length
                                                of the completions that ended before the length limit (0 where
                                                none did, as TRL logs it)
    eval/completions/clipped_ratio              the share cut off by the length limit (`evaluate`'s mean)

    TRL averages each evaluation batch's numbers; these are over the whole held-out set (the same with
    one batch)."""
    empty = torch.zeros(0)
    spread = ["reward"] + [k for k in sorted(counts) if k.startswith("rewards/") and k.endswith("/mean")]
    lengths = values.get("length_mean", empty).double()
    ended = ~values.get("completions/clipped_ratio", torch.zeros_like(lengths)).bool()
    squares = []  # squared deviations from the every-rank means, then the terminated completions' tokens and count
    for k in spread:
        v = values.get(k, empty).double()
        squares.append((v[~v.isnan()] - means[f"eval/{k}"]).pow(2).sum().item())
    sums = torch.tensor(squares + [lengths[ended].sum().item(), ended.sum().item()], dtype=torch.float64)
    # min, -max of all lengths and of the terminated ones (maxima as negated minima: one reduction); a rank
    # without such rows leaves them to the others
    extremes = torch.tensor([x for v in (lengths, lengths[ended]) for x in
                             ((v.min().item(), -v.max().item()) if len(v) else (float("inf"),) * 2)],
                            dtype=torch.float64)
    if world_size > 1:
        sums = all_reduce_sum(sums.to(device)).cpu()
        extremes = extremes.to(device)
        dist.all_reduce(extremes, op=dist.ReduceOp.MIN)
        extremes = extremes.cpu()
    *squares, terminated_tokens, n_terminated = sums.tolist()
    low, high, low_ended, high_ended = extremes.tolist()
    std_names = ["reward_std"] + [k.removesuffix("/mean") + "/std" for k in spread[1:]]
    out = {f"eval/{name}": (sq / (counts[k] - 1)) ** 0.5 for name, k, sq in zip(std_names, spread, squares)
           if counts[k] > 1}
    rows = counts.get("length_mean", 0)
    out.update({
        "eval/completions/mean_length": means.get("eval/length_mean", 0.0),
        "eval/completions/min_length": low if rows else 0.0, "eval/completions/max_length": -high if rows else 0.0,
        "eval/completions/mean_terminated_length": terminated_tokens / n_terminated if n_terminated else 0.0,
        "eval/completions/min_terminated_length": low_ended if n_terminated else 0.0,
        "eval/completions/max_terminated_length": -high_ended if n_terminated else 0.0,
    })
    return out
