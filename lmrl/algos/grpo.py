"""Group baselines: GRPO and RLOO. Each prompt is sampled G times (`algo.group_size`); a
completion's advantage is its reward measured against its own group's, so no value model and no
moving average are needed, and a hard prompt's rare success counts as fully as an easy one's.

    GRPO  A_i = (r_i − mean_g r) / (std_g r + eps)   (`adv_mode`: grpo | grpo_no_std | raw; the std is the
                                                      group's, the batch's or none by `scale_rewards`; and
                                                      verl's passk, opo and gpg: `advantages.group_advantages`)
    RLOO  A_i = r_i − mean_{j≠i} r_j                  (leave-one-out)

Both optimise the clipped surrogate with asymmetric clipping, aggregated per `loss_level`, for
`ppo_epochs` passes in `minibatch_size` chunks; old log-probs are computed once per rollout, and
only when the policy moves before the batch is used up (otherwise the ratio is exactly 1 and the
step is the plain policy gradient). The ratio is per token or per completion (`ratio_level`: GSPO's
length-normalised one, or TRL's RLOOTrainer's ratio of the completion's probabilities), optionally
capped (`clip_ratio_max`: INTELLECT-2), and the policy term may leave out low-entropy tokens
(`top_entropy_quantile`) and drifted negative-advantage completions (`off_policy_mask_threshold`).
"""

from __future__ import annotations

import torch

from .advantages import gpg_alpha, group_advantages, informative_count, leave_one_out_advantages
from .base import Algorithm, PreparedBatch, register_algorithm, score_sequences
from .losses import clipped_surrogate_loss


@register_algorithm("grpo")
class GRPO(Algorithm):
    advantage_weighted = True
    clips_ratio = True

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        # A group of one has no mean to compare with; only the raw advantage (A = r) works without one.
        alone = cfg.group_size < 2 and not (cls is GRPO and cfg.adv_mode == "raw")
        # scale_rewards=batch divides grpo's centred rewards; nothing else has a divisor to replace
        unscaled = cfg.scale_rewards == "batch" and not (cls is GRPO and cfg.adv_mode == "grpo")
        return super().check_config(cfg) + ([] if not alone else [
            f"algo.name={cfg.name} compares each completion with its group: algo.group_size must be >= 2, "
            f"got {cfg.group_size}"]) + ([] if not unscaled else [
            f"algo.scale_rewards=batch divides grpo's advantages (algo.name=grpo, algo.adv_mode=grpo), not those of "
            f"algo.name={cfg.name} with adv_mode={cfg.adv_mode}; for batch whitening set algo.normalize_advantages"])

    def group_advantages(self, learner, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`advantages.group_advantages` by `algo.adv_mode`; gpg's α counts every process's batch."""
        mode, alpha = self.cfg.adv_mode, None
        if mode == "gpg":
            counts = torch.tensor(informative_count(rewards, self.group_size), dtype=torch.float64, device=mask.device)
            alpha = gpg_alpha(*learner.all_reduce_sum(counts).tolist())
        return group_advantages(rewards, self.group_size, mode, self.cfg.adv_eps, self.cfg.scale_rewards,
                                lengths=mask.sum(1), alpha=alpha)

    def old_and_reference_logprobs(self, learner, rollout) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                                                    torch.Tensor]:
        """(old, reference, behaviour) log-probs: old for the ratio (None: the policy does not move before
        the batch is used up, so the ratio is 1), the reference's for the KL (None without one), and those
        of the weights that sampled the rollout, which the KL shaping reads."""
        old = None
        if self.needs_old_logprobs(len(rollout)):
            old, _ = score_sequences(learner.module, rollout.sequences, rollout.completions.size(1),
                                     self.temperature, self.ga_steps, rollout.attention_mask)
        ref = self.reference_logprobs(learner, rollout)
        if old is None and rollout.staleness:  # sampled by older weights: the ratio is against them
            old = rollout.logprobs
        return old, ref, old if old is not None else rollout.logprobs

    def prepare(self, learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        old, ref, behaviour = self.old_and_reference_logprobs(learner, rollout)
        rewards = self.kl_shaped_rewards(rewards.to(rollout.mask.device), behaviour, ref, rollout.mask)
        advantages = self.group_advantages(learner, rewards.float(), rollout.mask)
        if self.normalizes:  # over every rank's batch
            advantages = self.whiten(learner, advantages, rollout.mask if advantages.dim() == 2 else None)
        batch = PreparedBatch(rollout.sequences, rollout.mask, advantages, old_logprobs=old, ref_logprobs=ref,
                              attention_mask=rollout.attention_mask)
        return batch, {"train/advantage_mean": advantages.mean().item(), **self.shaped_reward_metrics(rewards),
                       **self.rollout_kl(behaviour, ref, rollout.mask)}

    def policy_loss(self, batch, logprobs, entropy, values):
        old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
        return clipped_surrogate_loss(logprobs, old, batch.advantages, batch.mask, self.cfg.clip_range_left,
                                      self.cfg.clip_range_right, self.cfg.loss_level, self.loss_constant,
                                      **self.surrogate_options(batch, logprobs, old, entropy))


@register_algorithm("rloo")
class RLOO(GRPO):
    """GRPO's clipped surrogate with leave-one-out advantages, per token by default. TRL's
    RLOOTrainer clips one ratio per completion, π(y_i)/π_old(y_i), averaged over completions, with
    β times the k1 KL summed over the completion taken off its reward: algo.ratio_level=sequence_sum,
    loss_level=sequence, kl_in_reward=true, kl_estimator=k1 (what lmrl.trl.RLOOConfig sets;
    tests/test_trl_parity.py). The two clip differently once the policy has moved (ppo_epochs > 1 or
    minibatches); on-policy (ratio 1) TRL's gradient is −mean_i A_i·∇log π(y_i), which is the
    per-token one's with loss_level=constant times loss_constant."""

    def group_advantages(self, learner, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return leave_one_out_advantages(rewards, self.group_size)
