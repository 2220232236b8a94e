"""Direct Preference Optimization on {prompt, chosen, rejected} pairs (Rafailov et al., 2023), with
the IPO, hinge and robust variants and conservative-DPO label smoothing (see `algos/preference_losses.py`).

    DPOTrainer(load_config("dpo-smollm2")).train()

The reference is the policy as training starts: with a LoRA adapter, the same model with the
adapter switched off (no second copy in memory); otherwise a frozen copy. Both sides of every pair
go through one forward pass, one row per pair with its prompt run once (`pair_rows`). Metrics
follow TRL's names: loss (also dpo/loss), rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies (the fraction of pairs whose implicit reward β·log(π/π_ref) prefers the chosen
response), logps/chosen, logps/rejected, grad_norm, learning_rate (also dpo/lr); evaluation
reports them as eval/... with eval/accuracy = the held-out preference accuracy. TRL's
logits/chosen, logits/rejected, entropy, mean_token_accuracy and num_tokens are not logged.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..algos.preference_losses import dpo_loss
from ..config import Config
from ..models.reference import build_reference, is_reference_view
from ..tasks.text_batches import pair_logps
from .offline import PairTrainer
from .offline_setup import export_policy


class DPOTrainer(PairTrainer):
    name = "dpo"
    trainer_key = "dpo"
    accuracy_key = "rewards/accuracies"
    default_best_metric = "eval/accuracy"

    def __init__(self, config: Config, *, reference=None, **kwargs):
        """`reference`: the frozen model of the KL term (default: the policy as training starts);
        other keywords as `OfflineTrainer`'s (model, tokenizer, train_dataset, eval_dataset, callbacks)."""
        super().__init__(config, **kwargs)
        # the reference is the starting policy: a view with the adapter off, or a frozen copy made now
        self.reference = reference if reference is not None else build_reference(self.model)
        self.reference.to(self.device)

    def scorers(self) -> list:
        return [self.model, self.reference]

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        logps, lengths = pair_logps(self.model, batch, call=self._call())  # lengths: response tokens (IPO's averages)
        n = logps.size(0) // 2
        with torch.no_grad():
            ref = pair_logps(self.reference, batch)[0]
        d = self.config.dpo
        loss, stats = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], beta=d.beta, loss_type=d.loss_type,
                               label_smoothing=d.label_smoothing, chosen_lengths=lengths[:n],
                               rejected_lengths=lengths[n:], ipo_length_normalize=d.ipo_length_normalize)
        stats = {"dpo/loss": loss.item(), **stats, "logps/chosen": logps[:n].mean().item(),
                 "logps/rejected": logps[n:].mean().item()}
        return loss, stats

    def export(self, out_dir: Path, model) -> Path:
        return export_policy(model, self.tokenizer, out_dir / "model")

    def frozen_modules(self) -> list:
        return [] if is_reference_view(self.reference) else [self.reference]
