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
GROUP_MODES = ("raw", "grpo", "grpo_no_std", "passk", "opo", "gpg")
# Modes that need one reward per completion: they compare whole completions (the best, their lengths).
SEQUENCE_MODES = ("passk", "opo")
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
                     scale: str = "group", lengths: torch.Tensor | None = None,
                     alpha: float | None = None) -> torch.Tensor:
    """Advantages against each prompt's own group of G samples (GRPO, Shao et al. 2024).

    raw:          A_i = r_i
    grpo:         A_i = (r_i − mean_g) / (s + eps), s by `scale`:
                    group  std_g, the std of prompt g's own G rewards (GRPO)
                    batch  the std of all B rewards (PPO Lite: one scale for every prompt)
                    none   no division: A_i = r_i − mean_g (Dr. GRPO)
    grpo_no_std:  A_i = r_i − mean_g      (the same as grpo with scale "none"; kept as a name)
    passk:        the group's best completion (the first of equals) gets A = (r_max − r_second) / (std_g + eps),
                  the others 0: the pass@k objective (Chen et al. 2025, verl's grpo_passk); scale "none":
                  no division
    opo:          A_i = r_i − Σ_j l_j r_j / Σ_j l_j over the group, l the completions' `lengths` in tokens:
                  the optimal baseline of OPO (Hao et al. 2025) for a sequence-level reward
    gpg:          A_i = α·(r_i − mean_g), α = B / (the completions in groups whose rewards differ): GPG's
                  correction (Chu et al. 2025), so the update is as large as if every group had taught
                  something; `alpha` given: that α (the count over every process's batch)

    Both stds have Bessel's correction. These are TRL's GRPOTrainer numbers (`scale_rewards`, and the
    1e-4 in its denominator; tests/test_trl_parity.py checks them against TRL's trainer). `scale`
    changes modes "grpo" and "passk"; the other modes refuse "batch" rather than ignore it.

    rewards (B,) or (B, T) with B = n_prompts·G, a group's rows contiguous; for (B, T) every
    statistic, the batch std included, is taken per position t. passk and opo take (B,) only."""
    if mode not in GROUP_MODES:
        raise ValueError(f"advantage mode must be one of {', '.join(GROUP_MODES)}, got {mode!r}")
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale!r}")
    if scale == "batch" and mode != "grpo":
        raise ValueError(f"scale_rewards 'batch' divides grpo's advantages; advantage mode {mode!r} has no division")
    if mode in SEQUENCE_MODES and rewards.dim() != 1:
        raise ValueError(f"advantage mode {mode!r} compares whole completions: it needs one reward per completion, "
                         f"got rewards of shape {tuple(rewards.shape)} (a reward per token)")
    g = _groups(rewards, group_size)
    if mode == "raw":
        return rewards.clone()
    if group_size < 2:
        raise ValueError(f"advantage mode {mode!r} compares samples of one prompt: group_size must be >= 2")
    if mode == "passk":
        return _best_of_group(g, eps if scale == "group" else None).reshape(rewards.shape)
    if mode == "opo":
        if lengths is None:
            raise ValueError("advantage mode 'opo' weighs each reward by its completion's length: pass lengths")
        weights = _groups(lengths.to(rewards.dtype), group_size)
        total = weights.sum(1, keepdim=True)
        baseline = torch.where(total > 0, (weights * g).sum(1, keepdim=True) / total.clamp(min=1e-12),
                               g.mean(1, keepdim=True))  # a group without tokens: its plain mean
        return (g - baseline).reshape(rewards.shape)
    centred = g - g.mean(1, keepdim=True)  # (B/G, G, ...)
    if mode == "grpo" and scale == "group":
        centred = centred / (g.std(1, keepdim=True) + eps)
    elif mode == "grpo" and scale == "batch":
        centred = centred / (rewards.std(0) + eps)  # () or (T,): broadcast over groups and rows
    elif mode == "gpg":
        centred = centred * (gpg_alpha(*informative_count(rewards, group_size)) if alpha is None else alpha)
    return centred.reshape(rewards.shape)


def _best_of_group(g: torch.Tensor, eps: float | None) -> torch.Tensor:
    """passk on grouped rewards (n, G): r_max − r_second on each group's first best, over std_g + eps
    (eps None: undivided), 0 elsewhere."""
    top = g.topk(2, dim=1).values
    gap = top[:, 0] - top[:, 1]
    if eps is not None:  # a gap of 0 stays 0, a tied group's 0 / 0 included
        gap = torch.where(gap == 0, gap, gap / (g.std(1) + eps))
    out = torch.zeros_like(g)
    out[torch.arange(g.size(0)), g.argmax(1)] = gap  # argmax: the first of equals
    return out


def informative_count(rewards: torch.Tensor, group_size: int) -> tuple[int, int]:
    """(B, the completions in groups whose rewards are not all equal): GPG's counts, which add up
    across processes. For (B, T) rewards a group differs where any position does."""
    g = _groups(rewards, group_size)
    differs = (g != g[:, :1]).reshape(g.size(0), -1).any(1)
    return rewards.size(0), int(differs.sum().item()) * group_size


def gpg_alpha(total: int, informative: int) -> float:
    """GPG's α = B / B_informative (1 when no group differs: every advantage is 0 then)."""
    return total / informative if informative else 1.0


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
                         moments: torch.Tensor | None = None, divide: bool = True) -> torch.Tensor:
    """Batch whitening: (A − mean) / (std + eps) over valid entries (population std); masked
    entries come out 0. Works for (B,) and (B, T). `moments` (`masked_moments`, summed over the
    processes) gives the mean and std of the whole batch; None: those of `advantages` itself.
    `divide=False`: A − mean only (OpenRLHF's --no_advantage_std_norm).
    Not TRL's RLOO `normalize_advantages`, which divides by the sample std (Bessel) + 1e-4: the two
    differ by the factor sqrt((B − 1)/B) and eps."""
    total, squares, n = masked_moments(advantages, mask) if moments is None else moments
    n = n.clamp(min=1)
    mean = total / n
    std = (squares / n - mean * mean).clamp(min=0).sqrt()
    centred = advantages.double() - mean
    out = (centred / (std + eps) if divide else centred).to(advantages.dtype)
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


def greedy_baseline_advantages(returns: torch.Tensor, mask: torch.Tensor, baseline: torch.Tensor,
                               gamma: float = 1.0) -> torch.Tensor:
    """ReMax (Li et al. 2023): A_t = R_t − b_t on every valid token, b from a greedy completion of the
    row's prompt: its reward, one number per row (B,), or, for per-token rewards, its token rewards
    (B, T') whose return from each position (discounted by `gamma` over its T' positions) is b_t, so a
    token is measured against what the greedy completion earned from the same position on (positions
    line up where answers do, as an arithmetic answer's digits). A row with a NaN in its baseline (its
    greedy completion went unscored: a reward function out of time, a failed environment) has A = 0:
    no baseline, no gradient. returns, mask (B, T); 0 where mask is 0."""
    baseline = baseline.to(returns.device, returns.dtype)
    if baseline.dim() == 1:
        b = baseline[:, None].expand_as(returns)
    else:
        to_go = discounted_returns(baseline.nan_to_num(), torch.ones_like(baseline), gamma)
        width = returns.size(1)
        b = torch.nn.functional.pad(to_go[:, :width], (0, max(0, width - to_go.size(1))))
    advantages = torch.where(unscored_rows(baseline)[:, None], torch.zeros_like(returns), returns - b)
    return advantages * mask


def unscored_rows(baseline: torch.Tensor) -> torch.Tensor:
    """(B,) True for the rows of a greedy baseline, (B,) or (B, T'), that hold a NaN: no baseline."""
    return baseline.isnan() if baseline.dim() == 1 else baseline.isnan().any(1)


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
