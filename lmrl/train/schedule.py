"""Learning-rate schedules: linear warm-up, then constant or cosine decay, as one pure function.

    lr = lr_at(step, base_lr=3e-4, total_steps=1000, name="cosine", warmup_steps=50)
    scheduler = make_scheduler(optimizer, total_steps=1000, name="cosine", warmup_steps=50)
"""

from __future__ import annotations

import math

import torch

SCHEDULES = ("constant", "cosine")


def lr_at(step: int, *, base_lr: float, total_steps: int, name: str = "constant", warmup_steps: int = 0,
          min_lr_ratio: float = 0.1) -> float:
    """The learning rate for 0-based optimizer step `step` (W = warmup_steps, T = total_steps):

        warm-up   s < W:  lr = base_lr · (s + 1) / W
        constant  s ≥ W:  lr = base_lr
        cosine    s ≥ W:  lr = lr_min + (base_lr − lr_min) · ½ · (1 + cos(π · p)),
                          p = min(1, (s − W) / (T − W)),  lr_min = base_lr · min_lr_ratio

    so cosine starts at base_lr right after warm-up, is (1 + min_lr_ratio)/2 · base_lr halfway, and
    reaches lr_min at s = T and stays there."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if name == "constant":
        return base_lr
    decay_steps = total_steps - warmup_steps
    progress = 1.0 if decay_steps <= 0 else min(1.0, (step - warmup_steps) / decay_steps)
    min_lr = base_lr * min_lr_ratio
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, *, total_steps: int, name: str = "constant",
                   warmup_steps: int = 0, min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR that sets each param group's lr to `lr_at(k, base_lr=group's lr, ...)` after k
    `scheduler.step()` calls. Call `scheduler.step()` once after each `optimizer.step()`.

    The multiplier is a plain function (not a callable object), so `state_dict()` holds only the
    step count and resumes exactly; restore the optimizer's state too, which carries the current lr."""
    lr_at(0, base_lr=1.0, total_steps=total_steps, name=name, warmup_steps=warmup_steps,
          min_lr_ratio=min_lr_ratio)  # fail here, not at the first step, on a bad name or ratio

    def multiplier(step: int) -> float:  # lr_at is linear in base_lr, so base_lr=1 gives the factor
        return lr_at(step, base_lr=1.0, total_steps=total_steps, name=name, warmup_steps=warmup_steps,
                     min_lr_ratio=min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
