"""ReMax (Li et al. 2023): REINFORCE whose baseline is the reward of the policy's own greedy
completion of the same prompt, with PPO's clipped surrogate and no value model.

    r_t = the completion's reward on its last sampled token − β·KL_t on every token (with `kl_in_reward`)
    R_t = Σ_k γ^k r_{t_k} over the sampled tokens from t on
    b   = the reward of one greedy completion of the prompt (no KL); for per-token rewards, b_t is
          the greedy completion's return from position t on (`advantages.greedy_baseline_advantages`)
    A_t = R_t − b (b_t) on every sampled token

Each prompt is decoded greedily once per step (`Learner.greedy_rewards`), however many completions
`algo.group_size` samples of it: all G share the one baseline. No group statistics and no whitening
(unless `algo.normalize_advantages=true`). verl's `algorithm.adv_estimator=remax`.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from .advantages import discounted_returns, greedy_baseline_advantages, masked_mean, token_level_rewards
from .base import PreparedBatch, register_algorithm
from .grpo import GRPO

# GRPO's keys for its group advantage, which ReMax (a greedy baseline, no group statistics) has no use for.
GROUP_ADVANTAGE_KEYS = ("adv_mode", "adv_eps", "scale_rewards")


@register_algorithm("remax")
class ReMax(GRPO):
    discounts = True
    greedy_baseline = True

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        defaults = {f.name: f.default for f in fields(cfg)}
        problems = [f"algo.{key}={getattr(cfg, key)} is for grpo's group advantage; algo.name={cfg.name} measures "
                    f"each completion against its prompt's greedy completion (leave it at {defaults[key]})"
                    for key in GROUP_ADVANTAGE_KEYS if getattr(cfg, key) != defaults[key]]
        if cfg.dynamic_sampling:
            problems.append(f"algo.dynamic_sampling=true drops groups whose rewards tie, which teach nothing against "
                            f"a group's mean; algo.name={cfg.name} measures them against the greedy completion, so "
                            f"they do (set algo.dynamic_sampling=false)")
        return super(GRPO, cls).check_config(cfg) + problems  # GRPO's own checks are of its group advantage

    def prepare(self, learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        mask = rollout.mask
        old, ref, behaviour = self.old_and_reference_logprobs(learner, rollout)
        token_rewards = self.kl_shaped_rewards(token_level_rewards(rewards.float().to(mask.device), mask),
                                               behaviour, ref, mask)
        returns = discounted_returns(token_rewards, mask, self.cfg.gamma)
        baseline = learner.greedy_rewards().to(mask.device)
        advantages = greedy_baseline_advantages(returns, mask, baseline, self.cfg.gamma)
        if self.normalizes:  # over every rank's tokens that have a baseline
            unscored = baseline.isnan() if baseline.dim() == 1 else baseline.isnan().any(1)
            advantages = self.whiten(learner, advantages, mask * ~unscored[:, None])
        batch = PreparedBatch(rollout.sequences, mask, advantages, old_logprobs=old, ref_logprobs=ref,
                              attention_mask=rollout.attention_mask)
        return batch, {"train/advantage_mean": advantages.mean().item(),
                       "train/return_mean": masked_mean(returns, mask).item(),
                       **self.shaped_reward_metrics(token_rewards), **self.rollout_kl(behaviour, ref, mask)}
