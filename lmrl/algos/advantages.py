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


# -- masked statistics -----------------------------------------------------------------------------
def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of x over entries where mask is 1 (all entries when mask is None)."""
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Population variance of x over entries where mask is 1."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


# -- group baselines -------------------------------------------------------------------------------
GROUP_MODES = ("raw", "grpo", "grpo_no_std")
# What divides GRPO's centred rewards (TRL's `scale_rewards`): each group's own std, the whole batch's, or nothing.
SCALE_REWARDS = ("group", "batch", "none")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B, ...) → (B/G, G, ...): rows i·G .. i·G+G−1 are the G completions of prompt i."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.size(0) % group_size:
        raise ValueError(f"{rewards.size(0)} rewards do not split into groups of {group_size}")
    return rewards.view(rewards.size(0) // group_size, group_size, *rewards.shape[1:])


def group_advantages(rewards: torch.Tensor, group_size: int, mode: str = "grpo", eps: float = 1e-4,
                     scale: str = "group") -> torch.Tensor:
    """Advantages against each prompt's own group of G samples (GRPO, Shao et al. 2024).

    raw:          A_i = r_i
    grpo:         A_i = (r_i − mean_g) / (s + eps), s by `scale`:
                    group  std_g, the std of prompt g's own G rewards (GRPO)
                    batch  the std of all B rewards (PPO Lite: one scale for every prompt)
                    none   no division: A_i = r_i − mean_g (Dr. GRPO)
    grpo_no_std:  A_i = r_i − mean_g      (the same as grpo with scale "none"; kept as a name)

    Both stds have Bessel's correction. These are TRL's GRPOTrainer numbers (`scale_rewards`, and the
    1e-4 in its denominator; tests/test_trl_parity.py checks them against TRL's trainer). `scale`
    only changes mode "grpo": the other modes refuse "batch" rather than ignore it.

    rewards (B,) or (B, T) with B = n_prompts·G, a group's rows contiguous; for (B, T) every
    statistic, the batch std included, is taken per position t."""
    if mode not in GROUP_MODES:
        raise ValueError(f"advantage mode must be one of {', '.join(GROUP_MODES)}, got {mode!r}")
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale!r}")
    if scale == "batch" and mode != "grpo":
        raise ValueError(f"scale_rewards 'batch' divides grpo's advantages; advantage mode {mode!r} has no division")
    g = _groups(rewards, group_size)
    if mode == "raw":
        return rewards.clone()
    if group_size < 2:
        raise ValueError(f"advantage mode {mode!r} compares samples of one prompt: group_size must be >= 2")
    centred = g - g.mean(1, keepdim=True)  # (B/G, G, ...)
    if mode == "grpo" and scale == "group":
        centred = centred / (g.std(1, keepdim=True) + eps)
    elif mode == "grpo" and scale == "batch":
        centred = centred / (rewards.std(0) + eps)  # () or (T,): broadcast over groups and rows
    return centred.reshape(rewards.shape)


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean_g).
    Same shapes and layout as `group_advantages`."""
    if group_size < 2:
        raise ValueError(f"leave-one-out needs group_size >= 2, got {group_size}")
    g = _groups(rewards, group_size)
    others = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(rewards.shape)


def masked_moments(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(Σ x, Σ x², n) over the entries where mask is 1, in float64: sums that add up across
    processes, so `normalize_advantages` can whiten with the statistics of every rank's batch."""
    x = x.detach().double()
    m = torch.ones_like(x) if mask is None else mask.to(x.device, torch.float64).expand_as(x)
    return torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()])


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8,
                         moments: torch.Tensor | None = None) -> torch.Tensor:
    """Batch whitening: (A − mean) / (std + eps) over valid entries (population std); masked
    entries come out 0. Works for (B,) and (B, T). `moments` (`masked_moments`, summed over the
    processes) gives the mean and std of the whole batch; None: those of `advantages` itself.
    Not TRL's RLOO `normalize_advantages`, which divides by the sample std (Bessel) + 1e-4: the two
    differ by the factor sqrt((B − 1)/B) and eps."""
    total, squares, n = masked_moments(advantages, mask) if moments is None else moments
    n = n.clamp(min=1)
    mean = total / n
    std = (squares / n - mean * mean).clamp(min=0).sqrt()
    out = ((advantages.double() - mean) / (std + eps)).to(advantages.dtype)
    return out if mask is None else out * mask


# -- token-level returns ---------------------------------------------------------------------------
def token_level_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A sequence reward (B,) placed on the last valid token of each row of mask (B, T), zeros
    elsewhere (a row may have holes: an agent episode's observation tokens); token rewards (B, T)
    pass through (masked)."""
    if rewards.dim() == 2:
        return rewards * mask
    last = mask.size(1) - 1 - (mask > 0).long().flip(1).argmax(1)  # index of the last valid token
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    out[torch.arange(len(rewards)), last] = rewards * (mask.sum(1) > 0)
    return out


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """R_t = Σ_k γ^k r_{t_k} over the valid tokens t_k from t on (REINFORCE++'s returns), 0 where
    mask is 0; tokens between an agent's turns are stepped over, as in `gae`, which this is with
    V = 0 and λ = 1. rewards, mask (B, T)."""
    returns, _ = gae(rewards, torch.zeros_like(rewards, dtype=torch.float32), mask, gamma, 1.0)
    return returns


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over completion tokens.

    δ_t = r_t + γ·V_{t'} − V_t        (t' the next valid token; V after the last valid token is 0)
    A_t = δ_t + γλ·A_{t'}             (A after the last valid token is 0)
    returns R_t = A_t + V_t, the value targets. rewards, values, mask (B, T); tokens where mask is 0
    (right padding, an agent episode's observation tokens between its turns) are stepped over, as
    verl's GAE does, so a later turn's reward reaches an earlier turn; outputs are 0 there.
    With λ = 1, A_t = Σ_k γ^k r_{t_k} − V_t over the valid tokens t_k from t on."""
    rewards, values, mask = rewards.float() * mask, values.float() * mask, mask.float()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = torch.where(valid > 0, delta + gamma * lam * next_adv, next_adv)
        next_value = torch.where(valid > 0, values[:, t], next_value)
        advantages[:, t] = next_adv * valid
    return advantages, (advantages + values) * mask
