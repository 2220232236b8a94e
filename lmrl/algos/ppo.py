"""PPO with a learned value function (Schulman et al. 2017; the RLHF recipe of Ziegler et al. 2019).

Per rollout: the completion's reward becomes token rewards (a sequence reward on its last token,
or the task's own per-token rewards), minus β·KL(π‖π_ref) per token when `kl_in_reward`; GAE(γ, λ)
over those and the rollout-time values gives advantages (whitened over the batch unless
`normalize_advantages` is false) and returns. Then `ppo_epochs` passes of minibatch updates of

    L = L_clip(ratio, A) + vf_coef · L_V(V, V_old, R) − ent_coef · H

with the clipped surrogate (asymmetric clip range, and GRPO's ratio options: `ratio_level`,
`clip_ratio_max`, `top_entropy_quantile`, `off_policy_mask_threshold`) and the clipped value loss.
"""

from __future__ import annotations

import math

import torch

from .advantages import gae, masked_mean, token_level_rewards
from .base import Algorithm, PreparedBatch, register_algorithm, score_sequences
from .losses import clipped_surrogate_loss, explained_variance, value_loss


@register_algorithm("ppo")
class PPO(Algorithm):
    uses_values = True
    clips_ratio = True
    whitens = True  # as verl's, OpenRLHF's and TRL's PPO

    def prepare(self, learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        n, mask = rollout.completions.size(1), rollout.mask
        old, values = score_sequences(learner.module, rollout.sequences, n, self.temperature, self.ga_steps,
                                      rollout.attention_mask)
        ref = self.reference_logprobs(learner, rollout)
        token_rewards = token_level_rewards(rewards.float().to(mask.device), mask)
        token_rewards = self.kl_shaped_rewards(token_rewards, old, ref, mask)
        advantages, returns = gae(token_rewards, values, mask, self.cfg.gamma, self.cfg.lam)
        if self.normalizes:  # over every rank's tokens
            advantages = self.whiten(learner, advantages, mask)
        batch = PreparedBatch(rollout.sequences, mask, advantages, old_logprobs=old, ref_logprobs=ref,
                              old_values=values, returns=returns, attention_mask=rollout.attention_mask)
        metrics = {"train/advantage_mean": advantages.mean().item(),
                   "train/value_mean": masked_mean(values, mask).item(),
                   "train/return_mean": masked_mean(returns, mask).item(),
                   **self.shaped_reward_metrics(token_rewards), **self.rollout_kl(old, ref, mask)}
        ev = explained_variance(values, returns, mask)
        if math.isfinite(ev):  # undefined when every return is the same
            metrics["train/explained_variance"] = ev
        return batch, metrics

    def policy_loss(self, batch, logprobs, entropy, values):
        pg, stats = clipped_surrogate_loss(logprobs, batch.old_logprobs, batch.advantages, batch.mask,
                                           self.cfg.clip_range_left, self.cfg.clip_range_right,
                                           self.cfg.loss_level, self.loss_constant,
                                           **self.surrogate_options(batch, logprobs, batch.old_logprobs, entropy))
        vf, vstats = value_loss(values, batch.old_values, batch.returns, batch.mask,
                                self.cfg.value_clip or None, self.cfg.loss_level, self.loss_constant)
        return pg + self.cfg.vf_coef * vf, {"policy_loss": pg.item(), "value_loss": vf.item(), **stats, **vstats}
