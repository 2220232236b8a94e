"""DAPO's dynamic sampling (`algo.dynamic_sampling`; verl's `algorithm.filter_groups`, OpenRLHF's
`--dynamic_filtering`): a group of completions of one prompt whose rewards all tie has advantage 0
under GRPO and RLOO and teaches nothing, so a step keeps only the groups whose rewards differ and
samples more batches until it has a batch of them.

    parts = [Scored(ids, rollout, rewards, exact, extras)]          # each sampled batch, scored
    while kept_groups(parts, group_size) < n_prompts and len(parts) < max_batches:
        parts.append(...)                                           # another batch of n_prompts prompts
    batch, stats = keep_informative(parts, n_prompts, group_size)

Groups are taken in the order they were sampled: first every informative one, up to `n_prompts`;
then, where `algo.max_sample_batches` ran out first, tied ones fill the batch, so a step always
trains on the batch size it was given (they add nothing to GRPO's gradient, and
`algo.skip_zero_advantage` leaves them out of the pass)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..generation.rollout import Rollout, cat_rollouts, select_rows


@dataclass
class Scored:
    """One sampled batch and its scores: problem ids (B,), the rollout, rewards (B,), exact-match flags
    (B,), the task's per-row extras {name: (B,)}, and the reward functions' completions-log columns
    {name: one value per row} (`RewardLog.columns`)."""
    ids: torch.Tensor
    rollout: Rollout
    rewards: torch.Tensor
    exact: torch.Tensor
    extras: dict[str, torch.Tensor]
    columns: dict[str, list] = field(default_factory=dict)


def informative(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B / group_size,) bool: the groups (contiguous rows) whose rewards differ, over their scored rows
    (a NaN, unscored, reward is left out; a group with fewer than two scored rows teaches nothing)."""
    if rewards.dim() != 1:
        raise ValueError("algo.dynamic_sampling compares each completion's one reward; this task gives one per "
                         "token (e.g. task.reward=per_digit): use a sequence reward or algo.dynamic_sampling=false")
    groups = rewards.float().view(-1, group_size)
    scored = ~groups.isnan()
    high = groups.masked_fill(~scored, -math.inf).amax(1)
    low = groups.masked_fill(~scored, math.inf).amin(1)
    return (scored.sum(1) >= 2) & (high > low)


def kept_groups(parts: list[Scored], group_size: int) -> int:
    """How many informative groups the sampled batches `parts` hold."""
    return sum(int(informative(p.rewards, group_size).sum()) for p in parts)


def keep_informative(parts: list[Scored], n_prompts: int, group_size: int) -> tuple[Scored, dict[str, float]]:
    """One batch of `n_prompts` groups from the sampled `parts`: their informative groups in sampling
    order, then tied ones where there are too few; and {"rollout/sample_batches": batches sampled,
    "rollout/informative_frac": the share of sampled groups that were informative}."""
    flags = [informative(p.rewards, group_size) for p in parts]
    order = [(k, g) for k, f in enumerate(flags) for g in f.nonzero().flatten().tolist()]
    order += [(k, g) for k, f in enumerate(flags) for g in (~f).nonzero().flatten().tolist()]
    chosen = sorted(order[:n_prompts])  # sampling order within the batch
    picked = []
    for k, part in enumerate(parts):
        rows = [g * group_size + j for kk, g in chosen if kk == k for j in range(group_size)]
        if rows:
            picked.append(_select(part, rows))
    sampled = sum(len(f) for f in flags)
    stats = {"rollout/sample_batches": float(len(parts)),
             "rollout/informative_frac": sum(int(f.sum()) for f in flags) / max(sampled, 1)}
    return _cat(picked), stats


def _select(part: Scored, rows: list[int]) -> Scored:
    n, index = len(part.ids), torch.tensor(rows, dtype=torch.long)
    return Scored(part.ids[index], select_rows(part.rollout, rows), part.rewards[index.to(part.rewards.device)],
                  part.exact[index.to(part.exact.device)],
                  {k: v[index.to(v.device)] for k, v in part.extras.items()},
                  {k: [v[i] for i in rows] for k, v in part.columns.items() if len(v) == n})


def _cat(parts: list[Scored]) -> Scored:
    if len(parts) == 1:
        return parts[0]
    names = dict.fromkeys(k for p in parts for k in p.extras)  # an extra a batch lacks is NaN on its rows
    extras = {k: torch.cat([p.extras[k].float() if k in p.extras else torch.full((len(p.ids),), math.nan)
                            for p in parts]) for k in names}
    columns = {k: [x for p in parts for x in p.columns[k]] for k in parts[0].columns
               if all(k in p.columns for p in parts)}
    return Scored(torch.cat([p.ids for p in parts]), cat_rollouts([p.rollout for p in parts]),
                  torch.cat([p.rewards for p in parts]), torch.cat([p.exact for p in parts]), extras, columns)
