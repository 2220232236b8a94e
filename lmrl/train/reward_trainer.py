"""Reward-model training on preference pairs: the Bradley–Terry loss −log σ(r(x, y_c) − r(x, y_r) − m),
with m a row's `margin` (TRL's column) where the data has one, else 0.

    RewardTrainer(load_config("rm-smollm2")).train()   # writes <run dir>/reward_model

The model is a sequence-classification head (one number) on the trunk of `model.path` (see
`lmrl.models.reward_model`), the whole model trained or, with `lora.r > 0`, an adapter plus the
head. Both sides of a pair are scored in one forward pass, one row per pair with its prompt run
once (`pair_rows`). Metrics: rm/loss, rm/accuracy (pairs ranked right), rm/margin_mean,
rm/chosen_mean, rm/rejected_mean, and TRL's rm/margin, rm/mean_reward, rm/min_reward, rm/max_reward
(the step's lowest and highest score); evaluation: eval/... with eval/accuracy the held-out preference
accuracy. The exported reward model (the best one by train.best_metric) is what
`reward.model: <run dir>/reward_model` scores RL completions with.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..algos.preference_losses import bradley_terry_loss
from ..tasks.text_batches import pair_scores
from .offline import Extreme, PairTrainer


class RewardTrainer(PairTrainer):
    name = "rm"
    trainer_key = "reward"
    accuracy_key = "rm/accuracy"
    default_best_metric = "eval/accuracy"

    def encode(self, rows: list, name: str) -> list:
        """Each pair's tokens with its row's margin (None when the row has none)."""
        return list(zip(super().encode(rows, name), (row.margin for row in rows)))

    @staticmethod
    def pair(row):
        return row[0]

    def collate(self, rows):
        """(the pairs' batch, margins (B,) or None): a row without a margin counts as margin 0."""
        margins = [m for _, m in rows]
        margin = None if all(m is None for m in margins) else \
            torch.tensor([m or 0.0 for m in margins], dtype=torch.float32, device=self.device)
        return super().collate(rows), margin

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        pairs, margin = batch
        scores = pair_scores(self.model, pairs, call=self._call())  # (2B,): chosen, then rejected
        n = scores.size(0) // 2
        loss, stats = bradley_terry_loss(scores[:n], scores[n:], margin)
        # TRL's RewardTrainer names beside lmrl's: margin (= margin_mean), and the scores of both sides' mean,
        # min and max (over the whole step)
        return loss, {"rm/loss": loss.item(), **stats, "rm/chosen_mean": scores[:n].mean().item(),
                      "rm/rejected_mean": scores[n:].mean().item(), "rm/margin": stats["rm/margin_mean"],
                      "rm/mean_reward": scores.mean().item(), "rm/min_reward": Extreme(scores.min().item()),
                      "rm/max_reward": Extreme(scores.max().item(), largest=True)}

    def export(self, out_dir: Path, model) -> Path:
        return model.save(out_dir / "reward_model")
