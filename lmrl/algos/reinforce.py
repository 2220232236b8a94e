"""REINFORCE with a moving-average baseline: A = r − b, b ← decay·b + (1 − decay)·mean(r),
L = −mean_i Σ_t A_it · log π(y_it | ·). One on-policy pass per rollout."""

from __future__ import annotations

import torch

from .advantages import baseline_advantages, update_moving_baseline
from .base import Algorithm, PreparedBatch, register_algorithm
from .losses import reinforce_loss


@register_algorithm("reinforce")
class Reinforce(Algorithm):
    advantage_weighted = True

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        one_pass = cfg.ppo_epochs == 1 and cfg.minibatch_size == 0
        return super().check_config(cfg) + ([] if one_pass else [
            f"algo.name={cfg.name} makes one on-policy update per rollout: algo.ppo_epochs must be 1 and "
            "algo.minibatch_size 0 (use rloo, grpo or ppo for several updates per rollout)"]) + (
            [] if not cfg.normalize_advantages else [
                f"algo.normalize_advantages=true: algo.name={cfg.name}'s advantages are r minus its moving baseline, "
                f"not whitened (leave it at null; reinforce_plus_plus whitens its returns over the batch)"])

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        # One average per completion position for token rewards (B, N), else one value; a list,
        # so it lives in the JSON trainer state. None until the first batch.
        self.baseline: list[float] | None = None

    def state_dict(self) -> dict:
        return {**super().state_dict(), "baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.baseline = state.get("baseline")

    def prepare(self, learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        ref = self.reference_logprobs(learner, rollout)
        rewards = self.kl_shaped_rewards(rewards.to(rollout.logprobs.device), rollout.logprobs, ref, rollout.mask)
        # The batch mean over every rank, per position (1 or N values), so all ranks share one baseline.
        stats = learner.all_reduce_sum(torch.cat([rewards.double().sum(0).reshape(-1),
                                                  torch.tensor([len(rewards)], dtype=torch.float64,
                                                               device=rewards.device)])).cpu()
        batch_mean = stats[:-1] / stats[-1]
        old = None if self.baseline is None else torch.tensor(self.baseline, dtype=torch.float64)
        advantages = baseline_advantages(rewards.double().cpu(), old if old is not None else batch_mean)
        self.baseline = update_moving_baseline(old, batch_mean, self.cfg.baseline_decay).tolist()
        batch = PreparedBatch(rollout.sequences, rollout.mask, advantages.float().to(rollout.mask.device),
                              ref_logprobs=ref, attention_mask=rollout.attention_mask)
        metrics = {"train/baseline": sum(self.baseline) / len(self.baseline),
                   "train/advantage_mean": advantages.mean().item(), **self.shaped_reward_metrics(rewards),
                   **self.rollout_kl(rollout.logprobs, ref, rollout.mask)}
        return batch, metrics

    def policy_loss(self, batch, logprobs, entropy, values):
        return reinforce_loss(logprobs, batch.advantages, batch.mask), {}
