"""Policy-gradient losses as pure functions. Shapes: B sequences, T completion tokens."""

from __future__ import annotations

import torch

from .advantages import masked_mean, masked_var


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


LOSS_LEVELS = ("token", "sequence", "constant")
KL_ESTIMATORS = ("k1", "k2", "k3")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor | None = None, level: str = "token",
              constant: float | None = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a number.

    token:     Σ_it m·x / Σ_it m                  every valid token in the batch weighs the same
    sequence:  (1/B) Σ_i (Σ_t m·x / Σ_t m)        every sequence weighs the same (original GRPO)
    constant:  Σ_it m·x / (B · constant)          a fixed normaliser, e.g. the max completion
                                                  length (Dr. GRPO): no length bias either way
    A row with no valid token counts as 0 under `sequence`. TRL's GRPO loss_type in these terms:
    grpo = sequence, bnpo and dapo = token (over the whole minibatch, which the update's token-weighted
    micro-batches reproduce), dr_grpo = constant with its max_completion_length (tests/test_trl_parity.py)."""
    if mask is None:
        mask = torch.ones_like(per_token)
    if level == "token":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if level == "sequence":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    if level == "constant":
        if not constant:
            raise ValueError("loss level 'constant' needs a positive normaliser (e.g. the max completion length)")
        return (per_token * mask).sum() / (per_token.size(0) * constant)
    raise ValueError(f"loss level must be one of {', '.join(LOSS_LEVELS)}, got {level!r}")


# What one importance ratio covers: a token, or a whole completion (GSPO; GSPO-token: the
# completion's ratio with each token's gradient; TRL's RLOO: the ratio of the completion's probabilities).
RATIO_LEVELS = ("token", "sequence", "sequence_token", "sequence_sum")
# the levels with one ratio per completion, (B, 1)
SEQUENCE_RATIO_LEVELS = ("sequence", "sequence_sum")


def importance_ratio(log_ratio: torch.Tensor, mask: torch.Tensor | None = None,
                     level: str = "token") -> torch.Tensor:
    """The importance ratio of new to old policy from the per-token log-ratios (B, T)
    log ρ_it = log π(y_it) − log π_old(y_it) (gradients through log π; 0 on padding, as
    `clipped_surrogate_loss` sets it), `mask` (B, T) marking the valid tokens (None: all):

        token:           ρ_it = exp(log ρ_it)                                  (B, T)
        sequence:        s_i = exp((1/|y_i|) Σ_t m_it·log ρ_it)                (B, 1)
                         GSPO (Zheng et al. 2025): the length-normalised ratio of the
                         completion's probabilities
        sequence_token:  ρ_it = sg[s_i] · π(y_it) / sg[π(y_it)]                (B, T)
                         GSPO-token: s_i in value at every token, gradient s_i·∇log π(y_it)
        sequence_sum:    s_i = exp(Σ_t m_it·log ρ_it) = π(y_i) / π_old(y_i)     (B, 1)
                         TRL's RLOOTrainer: the ratio of the whole completion's probabilities,
                         not normalised by its length

    A row without a valid token has s = 1. The first three are TRL's GRPO `importance_sampling_level`
    values (the third as trl.experimental.gspo_token computes it), the last TRL's RLOO ratio
    (tests/test_trl_parity.py)."""
    if level == "token":
        return log_ratio.exp()
    if level not in RATIO_LEVELS:
        raise ValueError(f"ratio level must be one of {', '.join(RATIO_LEVELS)}, got {level!r}")
    valid = torch.ones_like(log_ratio) if mask is None else mask.to(log_ratio.dtype)
    total = (log_ratio * valid).sum(1, keepdim=True)  # (B, 1)
    if level == "sequence_sum":
        return total.exp()
    sequence = total / valid.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
    if level == "sequence":
        return sequence.exp()
    own = log_ratio - log_ratio.detach()  # 0 in value, the token's own gradient
    return (own + sequence.detach()).exp()


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor | None, quantile: float) -> torch.Tensor:
    """(B, T) bool: the valid tokens whose entropy is in the batch's top `quantile` ("Beyond the
    80/20 rule", Wang et al. 2025; TRL's `top_entropy_quantile`, `get_high_entropy_mask`):

        τ = the (1 − quantile)-quantile of {H_it : m_it = 1}   (torch.quantile: linear interpolation)
        keep_it = m_it · [H_it ≥ τ]

    over the valid tokens of the tensors given (padding never counts, nor is kept); quantile 1 keeps
    every valid token, 0 those at the maximum; no valid token: none kept. A constant (no gradient)."""
    entropy = entropy.detach()
    valid = torch.ones_like(entropy, dtype=torch.bool) if mask is None else mask.bool()
    values = entropy[valid].float()
    if values.numel() == 0:
        return torch.zeros_like(valid)
    return (entropy >= torch.quantile(values, 1 - quantile)) & valid


def off_policy_mask(advantages: torch.Tensor, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                    mask: torch.Tensor | None, threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's `off_policy_mask_threshold`): a completion
    with a negative advantage that the policy has moved far from is left out of the policy loss.

        D_i = (1/|y_i|) Σ_t m_it·(log π_old(y_it) − log π(y_it))   (a KL(π_old ‖ π) estimate)
        keep_i = [A_i ≥ 0] ∨ [D_i ≤ threshold]

    advantages (B,) or (B, T) (then kept per token, by that token's sign); returns a float (B, 1)
    or (B, T) constant. A NaN log-prob is no evidence (0), as in TRL; padding is never read."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    gap = (old_logprobs.detach() - logprobs.detach()).nan_to_num(nan=0.0)
    valid = torch.ones_like(gap, dtype=torch.bool) if mask is None else mask.bool()
    gap = torch.where(valid, gap, torch.zeros_like(gap))
    drift = gap.sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
    return ((advantages.detach() >= 0) | (drift <= threshold)).to(logprobs.dtype)


def clipped_surrogate_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                           mask: torch.Tensor | None = None, clip_left: float = 0.2, clip_right: float = 0.2,
                           level: str = "token", constant: float | None = None, ratio_level: str = "token",
                           ratio_max: float | None = None,
                           token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate with asymmetric clipping (DAPO's clip-higher):

        ρ_t = exp(log π(y_t) − log π_old(y_t))            (per `ratio_level`: `importance_ratio`)
        L = aggregate_t −w_t·min(min(ρ_t, δ)·A_t, clip(ρ_t, 1 − clip_left, 1 + clip_right)·A_t)

    δ = `ratio_max` (INTELLECT-2's two-sided clipping, TRL's `delta`; None = no cap) bounds the
    unclipped term, so a token with A < 0 whose ratio exploded adds at most −δ·A; w = `token_weights`
    (B, T) or (B, 1), constants that leave tokens out (`high_entropy_mask`, `off_policy_mask`;
    None = all in), applied before aggregation, whose normaliser still counts every valid token.
    advantages (B,) (shared by a sequence's tokens) or (B, T); old log-probs and advantages are
    constants. Padding is set to ρ = 1 before anything else, so a masked token contributes nothing,
    not even a nan from an extreme log-prob there. Stats: clip_frac (valid tokens where the clip
    bites: ρ > 1 + right with A > 0, or ρ < 1 − left with A < 0), approx_kl (k3 between old and new,
    (ρ − 1) − log ρ, mean over valid tokens), ratio_mean, and TRL GRPOTrainer's clip_ratio/*:
    low_mean, high_mean and region_mean (valid tokens clipped at the lower end, the upper end,
    either: region_mean = clip_frac), low_min and high_max (the smallest row share of tokens
    clipped low, the largest clipped high; rows without a valid token left out, 0 if none has one),
    and with δ, clip_frac_capped (valid tokens with A < 0 whose ratio passed δ: verl's pg_clipfrac_lower).
    With one ratio per sequence (ratio_level sequence or sequence_sum, advantages (B,)) these count
    sequences, every row included, as TRL's GRPO (GSPO) and RLOO trainers do; the ratio they test is
    the capped one, as TRL's. TRL's RLOO loss is this one with ratio_level=sequence_sum and
    level=sequence: −mean_i min(s_i·A_i, clip(s_i)·A_i)."""
    old_logprobs, advantages = old_logprobs.detach(), advantages.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    log_ratio = logprobs - old_logprobs
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    ratio = importance_ratio(log_ratio, mask, ratio_level)  # (B, T), or (B, 1) at a sequence level
    clipped = ratio.clamp(1 - clip_left, 1 + clip_right) * advantages
    capped = None
    if ratio_max is not None:
        capped = ((ratio > ratio_max) & (advantages < 0)).float().detach()  # where the cap binds
        ratio = ratio.clamp(max=ratio_max)
    unclipped = ratio * advantages
    per_token = -torch.min(unclipped, clipped)
    if token_weights is not None:
        per_token = per_token * token_weights
    loss = aggregate(per_token.expand_as(logprobs), mask, level, constant)
    with torch.no_grad():
        low = ((ratio < 1 - clip_left) & (advantages < 0)).float()
        high = ((ratio > 1 + clip_right) & (advantages > 0)).float()
        ratio = ratio.expand_as(low)
        names = ["clip_frac", "approx_kl", "ratio_mean", "clip_ratio/low_mean", "clip_ratio/high_mean",
                 "clip_ratio/low_min", "clip_ratio/high_max"]
        if ratio_level in SEQUENCE_RATIO_LEVELS and low.size(1) == 1:  # one value per sequence: each row once
            values = [torch.max(low, high).mean(), masked_mean((log_ratio.exp() - 1) - log_ratio, mask),
                      ratio.mean(), low.mean(), high.mean(), low.min(), high.max()]
            values += [] if capped is None else [capped.mean()]
        else:
            valid = torch.ones_like(ratio) if mask is None else mask.float()
            # NaN for a row without a valid token
            row_low, row_high = (low * valid).sum(1) / valid.sum(1), (high * valid).sum(1) / valid.sum(1)
            values = [masked_mean(torch.max(low, high), mask), masked_mean((log_ratio.exp() - 1) - log_ratio, mask),
                      masked_mean(ratio, mask), masked_mean(low, mask), masked_mean(high, mask),
                      _nan_extreme(row_low, torch.min), _nan_extreme(row_high, torch.max)]
            values += [] if capped is None else [masked_mean(capped.expand_as(low), mask)]
        names += [] if capped is None else ["clip_frac_capped"]
        stats = dict(zip(names, torch.stack(values).tolist()))
        stats["clip_ratio/region_mean"] = stats["clip_frac"]
    return loss, stats


def _nan_extreme(x: torch.Tensor, extreme) -> torch.Tensor:
    """`extreme` (torch.min or torch.max) of x's entries that are not NaN; 0 when none is (no row
    with a valid token has none clipped; TRL's NaN there would reach the step's mean)."""
    kept = x[~x.isnan()]
    return extreme(kept) if kept.numel() else x.new_zeros(())


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3",
                clamp: float | None = None) -> torch.Tensor:
    """Per-token estimates of KL(π ‖ π_ref) from tokens sampled from π (Schulman, "Approximating
    KL divergence", 2020), with log r = log π − log π_ref:

        k1 = log r                 unbiased, can be negative
        k2 = ½ (log r)²            biased, low variance, ≥ 0
        k3 = exp(−log r) − 1 + log r   unbiased, ≥ 0 (GRPO's choice)

    `clamp` bounds each estimate to [−clamp, clamp] (no gradient where it binds), and k3's log r to
    [−20, 20] first so its exp cannot overflow: verl's low_var_kl with clamp 10. Gradients flow
    through `logprobs`; the reference is a constant."""
    log_ratio = logprobs - ref_logprobs.detach()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio**2
    elif estimator == "k3":
        if clamp is not None:
            log_ratio = log_ratio.clamp(-20.0, 20.0)
        kl = torch.exp(-log_ratio) - 1 + log_ratio
    else:
        raise ValueError(f"KL estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None = None,
               clip_range: float | None = None, level: str = "token",
               constant: float | None = None) -> tuple[torch.Tensor, dict]:
    """L_V = aggregate ½·(V − R)², or with clipping (PPO2)
    ½·max((V − R)², (V_old + clip(V − V_old, −c, c) − R)²), so one update cannot move a value
    estimate far from its rollout-time value. Stats: value_clip_frac (valid tokens where the
    clipped term is the larger)."""
    old_values, returns = old_values.detach(), returns.detach()
    err = (values - returns) ** 2
    if not clip_range:
        return aggregate(0.5 * err, mask, level, constant), {"value_clip_frac": 0.0}
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    err_clipped = (clipped - returns) ** 2
    loss = aggregate(0.5 * torch.max(err, err_clipped), mask, level, constant)
    with torch.no_grad():
        m = torch.ones_like(err) if mask is None else mask
        frac = ((err_clipped > err).float() * m).sum() / m.sum().clamp(min=1)
    return loss, {"value_clip_frac": frac.item()}


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """1 − Var(R − V) / Var(R) over valid entries: 1 for perfect values, ≤ 0 for useless ones;
    nan when the returns do not vary."""
    var_r = masked_var(returns, mask)
    return float("nan") if var_r == 0 else (1 - masked_var(returns - values, mask) / var_r).item()
