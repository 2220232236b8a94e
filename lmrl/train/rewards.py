"""Scoring rollouts: the task's verifier, or a user's reward function, with errors that say which
sample broke it."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

# TRL-style: one call scores a batch of (prompt, completion) texts.
RewardFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; nothing was updated."""


def score_rollout(task, rollout, reward_fn: RewardFn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards (B,) and exact-match flags (B,) for a rollout's completions.

    Exact match always comes from the task's verifier (it is the accuracy we report); the reward
    is the task's unless `reward_fn` is given."""
    prompts, completions = rollout.prompts.cpu(), rollout.completions.cpu()
    rewards, exact = task.score_batch(prompts, completions)
    if reward_fn is None:
        return rewards, exact
    p_txt = [task.tokenizer.decode(p) for p in prompts]
    c_txt = [task.tokenizer.decode(c) for c in completions]
    name = getattr(reward_fn, "__qualname__", type(reward_fn).__name__)
    try:
        values = list(reward_fn(p_txt, c_txt))
    except Exception as e:
        raise RewardError(f"reward function {name} raised {type(e).__name__}: {e} "
                          f"(first sample: prompt {p_txt[0]!r}, completion {c_txt[0]!r})") from e
    if len(values) != len(p_txt):
        raise RewardError(f"reward function {name} returned {len(values)} rewards for {len(p_txt)} completions")
    for i, v in enumerate(values):
        try:
            values[i] = float(v)
        except (TypeError, ValueError):
            values[i] = math.nan
        if not math.isfinite(values[i]):
            raise RewardError(f"reward function {name} returned {v!r} for prompt {p_txt[i]!r}, "
                              f"completion {c_txt[i]!r}; rewards must be finite numbers")
    return torch.tensor(values, dtype=torch.float32), exact
