"""Held-out evaluation: greedy decoding, no update, the same sampling path as training."""

from __future__ import annotations

import re
from typing import Iterator

import torch
import torch.distributed as dist

from ..parallel.ddp import all_reduce_sum
from ..tasks.protocol import Sourced

# what `evaluate(spread=True)` adds whatever the task (besides each reward function's eval/rewards/<name>/std)
SPREAD_METRICS = ("reward_std", "completions/mean_length", "completions/min_length", "completions/max_length",
                  "completions/clipped_ratio", "completions/mean_terminated_length",
                  "completions/min_terminated_length", "completions/max_terminated_length")
SOURCE_METRICS = ("accuracy", "reward")  # what `evaluate` reports of each data source, as eval/<source>/<name>
MAX_SOURCES = 32  # held-out rows naming more sources than this get no per-source metrics (a column unique per row)
SOURCE_METRIC = re.compile(r"eval/[A-Za-z0-9_.-]+/(accuracy|reward)")  # the shape of a per-source name


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

    A task whose rows name their data source (`Sourced`, verl's `data_source`) also gets
    `eval/<source>/accuracy` and `eval/<source>/reward`, the means over that source's rows (`source_key`
    names; rows without a source count in the overall numbers only; none past MAX_SOURCES sources).

    Under DDP each rank decodes a strided share of `ids` and the sums are all-reduced, so every
    rank returns the same numbers (the sources are read from all of `ids` before they are shared out,
    so a rank whose share holds no row of a source still reports it)."""
    keys = row_source_keys(task, ids)
    sources, _ = reported_sources(keys)
    keys = keys[rank::world_size] if sources else []
    by_source = torch.zeros(len(sources), len(SOURCE_METRICS), 2, dtype=torch.float64)  # (S, M, [sum, rows])
    ids = ids[rank::world_size]
    done = 0  # rows of this rank's share scored so far
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
        if sources:
            by_source += source_sums(keys[done:done + len(chunk)], sources, rows)
        done += len(chunk)
    names = sorted(sums) if sums else ["accuracy", "reward", "length_mean"] + ["completions/clipped_ratio"] * spread
    totals = torch.tensor([x for k in names for x in sums.get(k, [0.0, 0.0])], dtype=torch.float64)
    totals = torch.cat([totals, by_source.reshape(-1)])  # one all-reduce for both
    if world_size > 1:
        totals = all_reduce_sum(totals.to(device)).cpu()
    totals, by_source = totals[:2 * len(names)].view(-1, 2).tolist(), totals[2 * len(names):].view_as(by_source)
    out = {f"eval/{k}": total / rows if rows else 0.0 for k, (total, rows) in zip(names, totals)}
    out.update(source_means(sources, by_source))
    if spread:
        values = {k: torch.cat(v) for k, v in columns.items()}
        counts = {k: rows for k, (_, rows) in zip(names, totals)}
        out.update(spread_metrics(values, counts, out, device=device, world_size=world_size))
    return out


def source_key(source: str) -> str:
    """A data source's name as a metric-key part: ASCII letters, digits, `_`, `-` and `.` kept, every
    other character (`/` included: `openai/gsm8k` is `openai_gsm8k`) made `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", source)


def row_source_keys(task, ids: torch.Tensor) -> list[str | None]:
    """Each row of `ids`'s data source as a metric-key part (`source_key`; None for a row without
    one); [] for a task that does not name its rows' sources (not `Sourced`, or its `row_sources` None)."""
    sources = task.row_sources(ids) if isinstance(task, Sourced) else None
    return [] if sources is None else [source_key(str(s)) if s not in (None, "") else None for s in sources]


def reported_sources(keys: list[str | None], limit: int = MAX_SOURCES) -> tuple[list[str], str]:
    """(the sources `evaluate` reports: the distinct `keys`, sorted, or none when there are more than
    `limit`; the one line that says so then, else "")."""
    sources = sorted({k for k in keys if k is not None})
    if len(sources) <= limit:
        return sources, ""
    return [], (f"the held-out rows name {len(sources)} data sources (data_source), more than {limit}: "
                f"evaluation reports no per-source metrics (eval/<source>/...)")


def source_metric_names(sources: list[str]) -> list[str]:
    """eval/<source>/<metric> for each of `sources` and SOURCE_METRICS: the names `evaluate` adds."""
    return [f"eval/{s}/{m}" for s in sources for m in SOURCE_METRICS]


def source_sums(keys: list[str | None], sources: list[str], rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """(S, M, 2): for each of `sources` and SOURCE_METRICS, the sum of the metric's per-row values (`rows`,
    (B,) each, row i of source `keys[i]`) over that source's rows, and how many of them are not NaN.
    A row whose key is None or not in `sources` counts nowhere."""
    index = {s: i for i, s in enumerate(sources)}
    of = torch.tensor([index.get(k, -1) if k is not None else -1 for k in keys], dtype=torch.long)  # (B,) -1: none
    out = torch.zeros(len(sources), len(SOURCE_METRICS), 2, dtype=torch.float64)
    for m, name in enumerate(SOURCE_METRICS):
        v = rows[name].detach().double().reshape(-1).cpu()
        counted = (of >= 0) & ~v.isnan()
        out[:, m, 0].index_add_(0, of[counted], v[counted])
        out[:, m, 1] = torch.bincount(of[counted], minlength=len(sources)).double()
    return out


def source_means(sources: list[str], sums: torch.Tensor) -> dict[str, float]:
    """{eval/<source>/<metric>: sum / rows} from `source_sums`' (S, M, 2) totals (every rank's); 0 where
    no row of the source has the metric, as `evaluate` reports an overall mean no row has."""
    return {name: total / rows if rows else 0.0
            for name, (total, rows) in zip(source_metric_names(sources), sums.reshape(-1, 2).tolist())}


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
