"""Advantage estimators: how much better each sampled completion did than expected.

Pure functions on tensors, so each can be checked against hand-computed numbers."""

from __future__ import annotations

import torch


def update_moving_baseline(baseline: float | None, mean_reward: float, decay: float = 0.9) -> float:
    """b ← decay·b + (1 − decay)·mean_reward.

    The first update (baseline None) starts the average at the batch mean instead of at 0, so the
    first steps do not treat every sample as better than expected."""
    if baseline is None:
        return float(mean_reward)
    return decay * baseline + (1.0 - decay) * float(mean_reward)


def baseline_advantages(rewards: torch.Tensor, baseline: float) -> torch.Tensor:
    """A_i = r_i − b, with b the moving-average baseline *before* this batch updates it."""
    return rewards - baseline
