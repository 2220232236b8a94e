"""REINFORCE++ (Hu et al. 2025): the clipped surrogate of PPO without a value model, on advantages
that are returns of token rewards whitened over every valid token of the batch (all ranks').

    reinforce_plus_plus            r_t = the completion's reward on its last sampled token
                                         − β·KL_t on every token (with `kl_in_reward`)
                                   R_t = Σ_k γ^k r_{t_k} over the sampled tokens from t on
                                   A_t = (R_t − mean R) / (std R + 1e-8), over the batch's tokens
    reinforce_plus_plus_baseline   the same, the reward first centred on its group's mean
                                   (`algo.group_size` ≥ 2): REINFORCE++-baseline

These are OpenRLHF's `reinforce` and `reinforce_baseline`, and verl's `reinforce_plus_plus` and
`reinforce_plus_plus_baseline`; verl's baseline variant takes the group mean of the KL-shaped
reward's sum and gives every token of a completion one advantage, which is the same unless
the KL is in the reward. The whitening is global: under torchrun the mean and std are those of
every rank's tokens, so the advantages do not depend on how the batch is split.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from .advantages import discounted_returns, group_advantages, masked_mean, token_level_rewards
from .base import PreparedBatch, register_algorithm
from .grpo import GRPO


class DiscountedReturns(GRPO):
    """GRPO's clipped surrogate on advantages made from the returns of the KL-shaped token rewards,
    without a value model: REINFORCE++ and ReMax. A subclass says how the returns become advantages
    (`advantages_from`), and may first reshape the sequence rewards (`centred`)."""

    discounts = True

    @classmethod
    def unused_group_keys(cls, cfg, keys: tuple[str, ...], instead: str) -> list[str]:
        """One line for each of GRPO's group-advantage `keys` set away from its default: the algorithm
        `instead` measures its completions another way."""
        defaults = {f.name: f.default for f in fields(cfg)}
        return [f"algo.{key}={getattr(cfg, key)} is for grpo's group advantage; algo.name={cfg.name} {instead} "
                f"(leave it at {defaults[key]})" for key in keys if getattr(cfg, key) != defaults[key]]

    def centred(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards

    def advantages_from(self, learner, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        mask = rollout.mask
        old, ref, behaviour = self.old_and_reference_logprobs(learner, rollout)
        rewards = self.centred(rewards.float().to(mask.device))
        token_rewards = self.kl_shaped_rewards(token_level_rewards(rewards, mask), behaviour, ref, mask)
        returns = discounted_returns(token_rewards, mask, self.cfg.gamma)
        advantages = self.advantages_from(learner, returns, mask)
        batch = PreparedBatch(rollout.sequences, mask, advantages, old_logprobs=old, ref_logprobs=ref,
                              attention_mask=rollout.attention_mask)
        return batch, {"train/advantage_mean": advantages.mean().item(),
                       "train/return_mean": masked_mean(returns, mask).item(),
                       **self.shaped_reward_metrics(token_rewards), **self.rollout_kl(behaviour, ref, mask)}


@register_algorithm("reinforce_plus_plus")
class ReinforcePlusPlus(DiscountedReturns):
    whitens = True  # always: its returns are whitened over the batch's tokens
    centres_on_group = False

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        problems = cls.unused_group_keys(cfg, ("adv_mode", "adv_eps", "scale_rewards", "normalize_advantages"),
                                         "whitens its returns over the batch's tokens itself")
        if cls.centres_on_group and cfg.group_size < 2:
            problems.append(f"algo.name={cfg.name} centres each reward on its group's mean: algo.group_size must be "
                            f">= 2, got {cfg.group_size} (algo.name=reinforce_plus_plus has no baseline)")
        return super(GRPO, cls).check_config(cfg) + problems  # GRPO's own checks are of its group advantage

    def centred(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_advantages(rewards, self.group_size, "grpo_no_std") if self.centres_on_group else rewards

    def advantages_from(self, learner, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.whiten(learner, returns, mask)


@register_algorithm("reinforce_plus_plus_baseline")
class ReinforcePlusPlusBaseline(ReinforcePlusPlus):
    centres_on_group = True
