"""The optimizer step every trainer takes: clip, then step — or skip the update when the loss or
the gradient is not finite, counted in the trainer's state, and stop the run after
`max_nonfinite` skips in a row (the last checkpoint, written before them, stays a good one)."""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from ..distributed.ddp import all_reduce_sum


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); the last checkpoint is intact."""


def guarded_step(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], loss: torch.Tensor, state: dict, *,
                 grad_clip: float, max_nonfinite: int, device, ckpt_dir, info: Callable[[str], None]) -> dict:
    """Gradients are already accumulated. `state` holds "step", "nonfinite_total" and
    "nonfinite_run"; every rank takes the same decision (the flag is all-reduced)."""
    clip = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(list(params), clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor over sharded gradients, made one number
        grad_norm = grad_norm.full_tensor()
    bad = torch.tensor([float(not (torch.isfinite(loss) and torch.isfinite(grad_norm)))], device=device)
    if all_reduce_sum(bad).item() > 0:
        state["nonfinite_total"] += 1
        state["nonfinite_run"] += 1
        info(f"step {state['step'] + 1}: non-finite loss or gradient, update skipped ({state['nonfinite_run']} in a row)")
        if state["nonfinite_run"] >= max_nonfinite:
            raise TrainingError(f"{state['nonfinite_run']} non-finite losses in a row at step {state['step'] + 1}; "
                                f"stopped. The last good checkpoint is in {ckpt_dir}")
    else:
        optimizer.step()
        state["nonfinite_run"] = 0
    optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": grad_norm.item(), "nonfinite_skipped": state["nonfinite_total"]}
