"""Policy-gradient losses as pure functions. Shapes: B sequences, T completion tokens."""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    return x.sum(dim) if mask is None else (x * mask).sum(dim)


def reinforce_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE: L = −(1/B) Σ_i Σ_t m_it · A_it · log π(y_it | y_i<t, x_i).

    logprobs (B, T) of the sampled tokens, with gradients; advantages, constants, either (B,) — one
    per sequence, A_it = A_i, so L = −mean_i A_i · log π(y_i | x_i) — or (B, T), one per token;
    mask (B, T) is 1 on tokens the policy chose and 0 on padding (None = all ones).
    Minimising L raises the log-probability of tokens with A > 0 and lowers it where A < 0."""
    advantages = advantages.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1): every token of a sequence shares its advantage
    return -masked_sum(logprobs * advantages, mask).mean()
