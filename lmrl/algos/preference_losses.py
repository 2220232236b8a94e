"""Preference losses as pure functions: DPO and its variants, the Bradley–Terry reward-model loss,
over each side's summed sequence log-probabilities (computed by `tasks.text_batches.pair_logps`); B pairs.

Names follow TRL's DPOTrainer, so a TRL user reads the same numbers: `rewards/chosen` is the implicit
reward β·(log π(y_c|x) − log π_ref(y_c|x)), averaged over the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust")
SMOOTHED_DPO_LOSSES = ("sigmoid", "robust")  # the losses that take label_smoothing


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float = 0.1,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0, chosen_lengths: torch.Tensor | None = None,
             rejected_lengths: torch.Tensor | None = None,
             ipo_length_normalize: bool = True) -> tuple[torch.Tensor, dict]:
    """Direct preference losses on summed sequence log-probs (B,), with the log-ratio margin

        h = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r))

    sigmoid  DPO (Rafailov et al. 2023):      L = −log σ(β·h)
             with label smoothing ε (cDPO):   L = −(1 − ε)·log σ(β·h) − ε·log σ(−β·h)
                                              (ε = the probability that a label is flipped)
    robust   rDPO (Chowdhury et al. 2024):    L = (−(1 − ε)·log σ(β·h) + ε·log σ(−β·h)) / (1 − 2ε)
    ipo      IPO (Azar et al. 2023, eq. 17):  L = (h̄ − 1/(2β))²,  h̄ = the same margin with each response's
                                              log-ratio divided by its length (`chosen_lengths`,
                                              `rejected_lengths`: response tokens, (B,)); with
                                              ipo_length_normalize=False, h̄ = h (summed log-ratios)
    hinge    SLiC / RSO:                      L = max(0, 1 − β·h)     (1/β is the margin)

    averaged over the batch. The reference log-probs are constants. These are TRL's DPOTrainer numbers
    (tests/test_trl_parity.py), with these differences, each an option:
    - sigmoid with ε > 0 is conservative DPO, as TRL's sigmoid was before it moved smoothing to its
      `robust` loss; TRL 1.16's sigmoid ignores `label_smoothing`. ε = 0 (the default) is the same in both.
    - ipo_length_normalize=False sums the log-ratios (the paper's formula as written); TRL always
      averages, as the default here does.
    Stats (floats), TRL's names: rewards/chosen = mean β·(log π(y_c) − log π_ref(y_c)), rewards/rejected
    likewise, rewards/margins = mean (chosen − rejected reward), rewards/accuracies = the fraction of
    pairs whose chosen reward is strictly higher; all from the summed log-ratios, whatever the loss."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"DPO loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {loss_type!r}")
    if not beta > 0:
        raise ValueError(f"DPO beta must be > 0 (it scales the implicit reward; 0.1 is usual), got {beta}")
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"DPO label_smoothing must be in [0, 0.5) (the chance a label is flipped), "
                         f"got {label_smoothing}")
    if label_smoothing > 0 and loss_type not in SMOOTHED_DPO_LOSSES:
        raise ValueError(f"DPO label_smoothing applies to loss_type {' or '.join(map(repr, SMOOTHED_DPO_LOSSES))} "
                         f"only, not {loss_type!r}; set it to 0 (got {label_smoothing})")
    shapes = {"policy_chosen_logps": policy_chosen_logps, "policy_rejected_logps": policy_rejected_logps,
              "ref_chosen_logps": ref_chosen_logps, "ref_rejected_logps": ref_rejected_logps}
    if len({tuple(t.shape) for t in shapes.values()}) > 1:
        got = ", ".join(f"{name} {tuple(t.shape)}" for name, t in shapes.items())
        raise ValueError(f"dpo_loss needs four log-prob tensors of one shape (B,), got {got}")
    if loss_type == "ipo" and ipo_length_normalize and (chosen_lengths is None or rejected_lengths is None):
        raise ValueError("IPO averages each response's log-ratio over its tokens: pass chosen_lengths and "
                         "rejected_lengths (response tokens per pair), or ipo_length_normalize=False for sums")

    chosen_logratios = policy_chosen_logps - ref_chosen_logps.detach()  # (B,)
    rejected_logratios = policy_rejected_logps - ref_rejected_logps.detach()
    h = chosen_logratios - rejected_logratios
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "robust":
        losses = (-(1 - label_smoothing) * F.logsigmoid(beta * h) + label_smoothing * F.logsigmoid(-beta * h)) \
            / (1 - 2 * label_smoothing)
    elif loss_type == "ipo":
        if ipo_length_normalize:  # an empty response (0 tokens) counts as 1, as in TRL
            h = chosen_logratios / chosen_lengths.clamp(min=1) - rejected_logratios / rejected_lengths.clamp(min=1)
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * h)

    with torch.no_grad():
        chosen_rewards, rejected_rewards = beta * chosen_logratios, beta * rejected_logratios
        stats = {"rewards/chosen": chosen_rewards.mean().item(),
                 "rewards/rejected": rejected_rewards.mean().item(),
                 "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
                 "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item()}
    return losses.mean(), stats


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                       margin: torch.Tensor | float | None = None) -> tuple[torch.Tensor, dict]:
    """Reward-model loss under the Bradley–Terry model P(y_c ≻ y_r) = σ(r_c − r_r):

        L = −(1/B) Σ_i log σ(r_c,i − r_r,i − m_i)

    with an optional margin m (a number, or one per pair (B,)) that the chosen reward must beat the
    rejected one by (Llama 2's reward models; TRL's `margin` column): TRL's RewardTrainer loss
    (tests/test_trl_parity.py). TRL's `center_rewards_coefficient` (an added c·mean (r_c + r_r)²,
    off by default) has no counterpart here. Stats, TRL's `accuracy` and `margin` under the rm/
    prefix: rm/accuracy = fraction of pairs with r_c > r_r, rm/margin_mean = mean (r_c − r_r), margin
    not subtracted."""
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(f"bradley_terry_loss needs rewards of one shape, got chosen {tuple(chosen_rewards.shape)} "
                         f"and rejected {tuple(rejected_rewards.shape)}")
    diff = chosen_rewards - rejected_rewards
    loss = -F.logsigmoid(diff if margin is None else diff - margin).mean()
    with torch.no_grad():
        stats = {"rm/accuracy": (diff > 0).float().mean().item(), "rm/margin_mean": diff.mean().item()}
    return loss, stats
