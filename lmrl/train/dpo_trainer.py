"""Direct Preference Optimization on {prompt, chosen, rejected} pairs (Rafailov et al., 2023), with
the IPO, hinge and robust variants and conservative-DPO label smoothing (see `algos/preference_losses.py`).

    DPOTrainer(load_config("dpo-smollm2")).train()

The reference is the policy as training starts: with a LoRA adapter, the same model with the
adapter switched off (no second copy in memory); otherwise a frozen copy. Both sides of every pair
go through one forward pass, one row per pair with its prompt run once (`pair_rows`). Metrics
follow TRL's names and definitions: loss (also dpo/loss), rewards/chosen, rewards/rejected,
rewards/margins, rewards/accuracies (the fraction of pairs whose implicit reward β·log(π/π_ref)
prefers the chosen response), logps/chosen, logps/rejected, grad_norm, learning_rate (also dpo/lr),
and the policy's token diagnostics, means over the reply tokens with loss of the whole step
(`dpo_token_metrics`): entropy (of the next-token distribution, both replies), logits/chosen and
logits/rejected (the logits' mean over the vocabulary, each reply), mean_token_accuracy (the share
of chosen-reply tokens that are the argmax of their logits); num_tokens counts the tokens trained on
so far as TRL lays a pair out (the prompt with each reply). Evaluation reports them as eval/... with
eval/accuracy = the held-out preference accuracy (eval/num_tokens: the training tokens so far).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..algos.preference_losses import dpo_loss
from ..config import Config
from ..models.reference import build_reference, is_reference_view
from ..tasks.text_batches import ReplyTokenSums, pair_logps, pair_logps_and_sums
from .offline import PairTrainer, TokenMean
from .offline_setup import export_policy


def dpo_token_metrics(sums: ReplyTokenSums, tokens: torch.Tensor) -> dict[str, TokenMean]:
    """TRL DPOTrainer's token diagnostics from per-side sums over reply tokens (2B,), chosen sides
    first, and each side's reply tokens with loss (2B,): token-weighted means

        entropy              Σ entropy / Σ tokens, over both replies
        logits/chosen        Σ mean logit / Σ tokens, over the chosen replies (rejected: theirs)
        mean_token_accuracy  Σ top1 / Σ tokens, over the chosen replies"""
    n = tokens.size(0) // 2
    chosen, rejected = slice(None, n), slice(n, None)
    entropy, total, logit_c, tokens_c, logit_r, tokens_r, top1_c = torch.stack([
        sums.entropy.sum(), tokens.sum(), sums.mean_logit[chosen].sum(), tokens[chosen].sum(),
        sums.mean_logit[rejected].sum(), tokens[rejected].sum(), sums.top1[chosen].sum()]).tolist()  # one read
    return {"entropy": TokenMean(entropy, total), "logits/chosen": TokenMean(logit_c, tokens_c),
            "logits/rejected": TokenMean(logit_r, tokens_r), "mean_token_accuracy": TokenMean(top1_c, tokens_c)}


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
        # lengths: response tokens (IPO's averages); sums: the diagnostics, read in the same pass
        logps, lengths, sums = pair_logps_and_sums(self.model, batch, call=self._call())
        n = logps.size(0) // 2
        with torch.no_grad():
            ref = pair_logps(self.reference, batch)[0]
        d = self.config.dpo
        loss, stats = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], beta=d.beta, loss_type=d.loss_type,
                               label_smoothing=d.label_smoothing, chosen_lengths=lengths[:n],
                               rejected_lengths=lengths[n:], ipo_length_normalize=d.ipo_length_normalize)
        stats = {"dpo/loss": loss.item(), **stats, "logps/chosen": logps[:n].mean().item(),
                 "logps/rejected": logps[n:].mean().item(), **dpo_token_metrics(sums, lengths)}
        return loss, stats

    def export(self, out_dir: Path, model) -> Path:
        return export_policy(model, self.tokenizer, out_dir / "model")

    def frozen_modules(self) -> list:
        return [] if is_reference_view(self.reference) else [self.reference]
