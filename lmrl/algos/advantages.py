"""Advantage estimators: how much better each sampled completion did than expected.

Pure functions on tensors, so each can be checked against hand-computed numbers. Rewards come per
sequence, shape (B,), or per token, shape (B, T) (a task that can say which token earned what);
the same formulas apply elementwise."""

from __future__ import annotations

import torch


def update_moving_baseline(baseline: torch.Tensor | float | None, mean_reward: torch.Tensor | float,
                           decay: float = 0.9) -> torch.Tensor | float:
    """b ← decay·b + (1 − decay)·mean_reward.

    `mean_reward` is the batch mean: a number for sequence rewards, or one mean per completion
    position (T,) for token rewards, giving a baseline per position. The first update (baseline
    None) starts the average at the batch mean instead of at 0, so the first steps do not treat
    every sample as better than expected."""
    if baseline is None:
        return mean_reward.clone() if isinstance(mean_reward, torch.Tensor) else float(mean_reward)
    return decay * baseline + (1.0 - decay) * mean_reward


def baseline_advantages(rewards: torch.Tensor, baseline: torch.Tensor | float) -> torch.Tensor:
    """A = r − b, with b the moving-average baseline *before* this batch updates it.

    rewards (B,) with a scalar b, or (B, T) with b of shape (T,) (broadcast over the batch)."""
    return rewards - baseline
