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

import torch

from .advantages import greedy_baseline_advantages, unscored_rows
from .base import register_algorithm
from .grpo import GRPO
from .reinforce_pp import DiscountedReturns


@register_algorithm("remax")
class ReMax(DiscountedReturns):
    greedy_baseline = True

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        problems = cls.unused_group_keys(cfg, ("adv_mode", "adv_eps", "scale_rewards"),
                                         "measures each completion against its prompt's greedy completion")
        if cfg.dynamic_sampling:
            problems.append(f"algo.dynamic_sampling=true drops groups whose rewards tie, which teach nothing against "
                            f"a group's mean; algo.name={cfg.name} measures them against the greedy completion, so "
                            f"they do (set algo.dynamic_sampling=false)")
        return super(GRPO, cls).check_config(cfg) + problems  # GRPO's own checks are of its group advantage

    def advantages_from(self, learner, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        baseline = learner.greedy_rewards().to(mask.device)
        advantages = greedy_baseline_advantages(returns, mask, baseline, self.cfg.gamma)
        if self.normalizes:  # over every rank's tokens that have a baseline
            advantages = self.whiten(learner, advantages, mask * ~unscored_rows(baseline)[:, None].to(mask.device))
        return advantages
