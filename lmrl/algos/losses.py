"""Policy-gradient losses as pure functions. Shapes: B sequences, T completion tokens."""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    return x.sum(dim) if mask is None else (x * mask).sum(dim)


def reinforce_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE: L = −(1/B) Σ_i A_i · Σ_t m_it · log π(y_it | y_i<t, x_i).

    logprobs (B, T) of the sampled tokens, with gradients; advantages (B,), constants;
    mask (B, T) is 1 on tokens the policy chose and 0 on padding (None = all ones).
    Minimising L raises the log-probability of completions with A > 0 and lowers it for A < 0."""
    seq_logprob = masked_sum(logprobs, mask)  # (B,)
    return -(seq_logprob * advantages.detach()).mean()
