"""Learning-rate schedules: linear warm-up, then constant, linear or cosine decay, or warm-up-stable-decay
(one pure function of the step), or reduce-on-plateau (driven by evaluation results).

    lr = lr_at(step, base_lr=3e-4, total_steps=1000, name="cosine", warmup_steps=50)
    scheduler = make_scheduler(optimizer, total_steps=1000, name="plateau", warmup_steps=50)
    ...  # each training step: optimizer.step(); scheduler.step()
    ...  # each evaluation:    scheduler.observe(accuracy)   (a no-op unless name="plateau")
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _constant(base_lr: float, min_lr: float, progress: float) -> float:
    return base_lr


def _linear(base_lr: float, min_lr: float, progress: float) -> float:
    return base_lr - (base_lr - min_lr) * progress


def _cosine(base_lr: float, min_lr: float, progress: float) -> float:
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _one_minus_sqrt(base_lr: float, min_lr: float, progress: float) -> float:
    return min_lr + (base_lr - min_lr) * (1.0 - math.sqrt(progress))


# lr after warm-up, from the peak lr, the floor and the decay's progress p in [0, 1]: the schedule's own
# shape, or (wsd) the shape its last steps decay by. `schedule.name` takes its choices from SCHEDULES.
AFTER_WARMUP = {"constant": _constant, "linear": _linear, "cosine": _cosine}
DECAY_SHAPES = {"cosine": _cosine, "linear": _linear, "1-sqrt": _one_minus_sqrt}
STEP_SCHEDULES = (*AFTER_WARMUP, "wsd")  # the lr is a function of the step alone
SCHEDULES = (*STEP_SCHEDULES, "plateau")
PLATEAU_MODES = ("max", "min")


def _check(name: str, warmup_steps: int, min_lr_ratio: float, decay_steps: int = 0,
           decay_shape: str = "cosine") -> None:
    if name not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if name == "wsd" and decay_steps < 1:
        raise ValueError(f"the wsd schedule decays over its last decay_steps steps: decay_steps must be >= 1, "
                         f"got {decay_steps}")
    if decay_shape not in DECAY_SHAPES:
        raise ValueError(f"decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {decay_shape!r}")


def lr_at(step: int, *, base_lr: float, total_steps: int, name: str = "constant", warmup_steps: int = 0,
          min_lr_ratio: float = 0.1, decay_steps: int = 0, decay_shape: str = "cosine") -> float:
    """The learning rate for 0-based optimizer step `step` (W = warmup_steps, T = total_steps):

        warm-up   s < W:  lr = base_lr · s / W
        constant  s ≥ W:  lr = base_lr
        linear    s ≥ W:  lr = base_lr − (base_lr − lr_min) · p
        cosine    s ≥ W:  lr = lr_min + (base_lr − lr_min) · ½ · (1 + cos(π · p)),
                          p = min(1, (s − W) / (T − W)),  lr_min = base_lr · min_lr_ratio

    so the warm-up starts at 0 and reaches base_lr at s = W, and linear and cosine are
    (1 + min_lr_ratio)/2 · base_lr halfway and reach lr_min at s = T and stay there. These are
    `transformers.get_scheduler`'s numbers, step for step (tests/test_schedule.py): "constant" is its
    constant_with_warmup, "cosine" its cosine_with_min_lr (min_lr_rate = min_lr_ratio), and with
    min_lr_ratio = 0 "linear" and "cosine" are its linear and cosine. Two deliberate differences:
    min_lr_ratio defaults to 0.1 (transformers decays to 0), and past T the lr stays at lr_min where
    transformers' cosine climbs back up.

        wsd  (warm-up, stable, decay; D = decay_steps)
                  s < W:      lr = lr_min + (base_lr − lr_min) · s / W
              W ≤ s < T − D:  lr = base_lr
                  s ≥ T − D:  decay_shape's lr at p = min(1, (s − T + D) / D): cosine or linear as
                              above, or 1-sqrt: lr_min + (base_lr − lr_min) · (1 − √p)

    is transformers' warmup_stable_decay with its linear warm-up, step for step (whose warm-up starts
    at the floor); W + D must not exceed T. "plateau" has no closed form (it depends on evaluation
    results): use `make_scheduler`."""
    _check(name, warmup_steps, min_lr_ratio, decay_steps, decay_shape)
    if name not in STEP_SCHEDULES:
        raise ValueError(f"the {name!r} schedule depends on evaluation results, not only the step: "
                         "use make_scheduler(...) and call .observe(metric) after each evaluation")
    min_lr = base_lr * min_lr_ratio
    if name == "wsd":
        if warmup_steps + decay_steps > total_steps:
            raise ValueError(f"the wsd schedule's warmup_steps ({warmup_steps}) and decay_steps ({decay_steps}) "
                             f"add up to more than the run's {total_steps} steps")
        if step < warmup_steps:
            return min_lr + (base_lr - min_lr) * step / warmup_steps
        progress = min(1.0, max(0.0, (step - total_steps + decay_steps) / decay_steps))
        return DECAY_SHAPES[decay_shape](base_lr, min_lr, progress)
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    span = total_steps - warmup_steps
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup_steps) / span)
    return AFTER_WARMUP[name](base_lr, min_lr, progress)


class StepScheduler(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR (same behaviour, same `state_dict`) that also takes `observe(metric)` and ignores
    it, so a trainer can report every evaluation whatever the schedule."""

    def observe(self, metric: float) -> None:
        pass


class PlateauScheduler:
    """Linear warm-up to each param group's lr, then that lr times a `scale` that starts at 1 and is
    multiplied by `factor` whenever `patience` evaluations in a row fail to improve on the best
    metric so far, never going below `min_lr_ratio`:

        lr = base_lr · warm-up(s) · scale,   scale ← max(min_lr_ratio, scale · factor)

    An evaluation improves when metric > best + threshold·|best| (mode "max"; for "min",
    metric < best − threshold·|best|). Unlike torch's ReduceLROnPlateau, the cut comes at the
    `patience`-th bad evaluation, not the one after. Evaluations during warm-up update the best
    but never count as bad: the lr is still rising, and a cut then would stop it short of its peak.

    Call `step()` after each `optimizer.step()` and `observe(metric)` after each evaluation, with
    the same metric on every rank. `state_dict()` holds the progress (step, scale, best, bad count
    and base lrs); the settings come from the constructor, as a LambdaLR's function does."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_steps: int = 0, min_lr_ratio: float = 0.1,
                 mode: str = "max", factor: float = 0.5, patience: int = 2, threshold: float = 1e-3):
        _check("plateau", warmup_steps, min_lr_ratio)
        if mode not in PLATEAU_MODES:
            raise ValueError(f"plateau mode must be one of {', '.join(PLATEAU_MODES)}, got {mode!r}")
        if not 0.0 < factor < 1.0:
            raise ValueError(f"plateau factor must be in (0, 1), got {factor}")
        if patience < 1:
            raise ValueError(f"plateau patience must be >= 1 evaluation, got {patience}")
        if threshold < 0:
            raise ValueError(f"plateau threshold must be >= 0, got {threshold}")
        self.optimizer = optimizer
        self.warmup_steps, self.min_lr_ratio = warmup_steps, min_lr_ratio
        self.mode, self.factor, self.patience, self.threshold = mode, factor, patience, threshold
        # as torch's schedulers do: the base is the lr the optimizer was built with
        self.base_lrs = [group.setdefault("initial_lr", group["lr"]) for group in optimizer.param_groups]
        self.last_step = 0  # scheduler.step() calls so far
        self.scale = 1.0
        self.best: float | None = None
        self.bad_evals = 0
        self._apply()

    def _apply(self) -> None:
        warm = lr_at(self.last_step, base_lr=1.0, total_steps=0, warmup_steps=self.warmup_steps)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * warm * self.scale

    def _improves(self, metric: float) -> bool:
        if math.isnan(metric):  # a NaN is no improvement, as in torch (a comparison with NaN is false)
            return False
        if self.best is None:
            return True
        margin = self.threshold * abs(self.best)
        return metric > self.best + margin if self.mode == "max" else metric < self.best - margin

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def observe(self, metric: float) -> None:
        metric = float(metric)
        if self._improves(metric):
            self.best, self.bad_evals = metric, 0
            return
        if self.last_step < self.warmup_steps:
            return
        self.bad_evals += 1
        if self.bad_evals >= self.patience:
            self.scale = max(self.min_lr_ratio, self.scale * self.factor)
            self.bad_evals = 0
            self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "scale": self.scale, "best": self.best, "bad_evals": self.bad_evals,
                "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scale" not in state:
            raise ValueError("this scheduler state is not from a plateau schedule (was schedule.name changed "
                             "between the checkpoint and now?)")
        self.last_step, self.scale, self.best = state["last_step"], state["scale"], state["best"]
        self.bad_evals, self.base_lrs = state["bad_evals"], list(state["base_lrs"])
        self._apply()


def make_scheduler(optimizer: torch.optim.Optimizer, *, total_steps: int, name: str = "constant",
                   warmup_steps: int = 0, min_lr_ratio: float = 0.1, decay_steps: int = 0,
                   decay_shape: str = "cosine", plateau_mode: str = "max",
                   plateau_factor: float = 0.5, plateau_patience: int = 2,
                   plateau_threshold: float = 1e-3) -> StepScheduler | PlateauScheduler:
    """The scheduler for `name`. Call `scheduler.step()` once after each `optimizer.step()` and
    `scheduler.observe(metric)` after each evaluation (ignored unless name="plateau"); both kinds
    have `get_last_lr()`, `state_dict()` and `load_state_dict()`.

    constant, linear, cosine, wsd: a LambdaLR that sets each param group's lr to
    `lr_at(k, base_lr=group's lr, ...)` after k `step()` calls: the schedule transformers' get_scheduler
    builds (also a LambdaLR), written here because transformers is an optional dependency and has no
    linear decay to a floor. The multiplier is a plain function
    (not a callable object), so `state_dict()` holds only the step count and resumes exactly;
    restore the optimizer's state too, which carries the current lr.
    plateau: a `PlateauScheduler` with the `plateau_*` settings (`total_steps` is not used)."""
    _check(name, warmup_steps, min_lr_ratio, decay_steps, decay_shape)  # fail here, not at the first step
    if name == "wsd":  # and on a decay that does not fit the run
        lr_at(0, base_lr=1.0, total_steps=total_steps, name=name, warmup_steps=warmup_steps, decay_steps=decay_steps)
    if name == "plateau":
        return PlateauScheduler(optimizer, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio, mode=plateau_mode,
                                factor=plateau_factor, patience=plateau_patience, threshold=plateau_threshold)

    def multiplier(step: int) -> float:  # lr_at is linear in base_lr, so base_lr=1 gives the factor
        return lr_at(step, base_lr=1.0, total_steps=total_steps, name=name, warmup_steps=warmup_steps,
                     min_lr_ratio=min_lr_ratio, decay_steps=decay_steps, decay_shape=decay_shape)

    return StepScheduler(optimizer, multiplier)
