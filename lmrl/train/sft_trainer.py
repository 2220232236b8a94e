"""Supervised fine-tuning on JSONL rows, with the loss on response tokens only.

    SFTTrainer(load_config("sft-smollm2")).train()                # an HF model, optionally with LoRA
    SFTTrainer(config, model=my_policy, tokenizer=tok).train()    # your own model

Rows are {"prompt", "response" | "completion"} (the prompt goes through the chat template when the
tokenizer has one and data.chat is on) or conversations ({"messages"} / {"conversations"}: the loss
covers every assistant turn). The built-in GPT trains on plain prompt/response rows with a
character tokenizer over the data's alphabet. Metrics: sft/loss (mean cross-entropy per response
token), sft/token_accuracy (the share of response tokens that are the argmax of their logits, a mean
over micro-batches weighted by rows), and TRL SFTTrainer's names as TRL computes them: loss,
entropy (the mean entropy of the next-token distribution over the response tokens),
mean_token_accuracy (sft/token_accuracy over all the step's response tokens at once: the same with one
micro-batch), num_tokens (every token of the rows trained on so far), grad_norm, learning_rate.
Evaluation reports them as eval/... (eval/token_accuracy = eval/accuracy; eval/num_tokens the
training tokens so far, as TRL logs it); the best model is the one with the lowest eval/loss unless
train.best_metric says otherwise.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..generation.token_logprobs import token_logprobs
from ..tasks.preference_data import read_sft
from ..tasks.text_batches import encode_sft, pad_sequences, response_logits
from .offline import OfflineTrainer, TokenMean
from .offline_setup import export_policy


def sft_loss(logits: torch.Tensor, targets: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SFT's loss, which RL's supervised warm-up trains with too: (the mean cross-entropy, in float32,
    over the response tokens `mask` marks, every position when it is None; whether the argmax is
    the target at each of those tokens, flat in row order). logits (B, K, V); targets, mask (B, K).
    With no response token the loss is 0, still attached to the graph."""
    if mask is None:
        picked, wanted = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    else:
        mask = mask.bool()
        picked, wanted = logits[mask], targets[mask]
    picked = picked.float()
    loss = F.cross_entropy(picked, wanted) if picked.numel() else logits.sum() * 0.0
    with torch.no_grad():
        correct = picked.argmax(-1) == wanted
    return loss, correct


class SFTTrainer(OfflineTrainer):
    name = "sft"
    trainer_key = "sft"
    accuracy_key = "sft/token_accuracy"
    default_best_metric = "eval/loss"

    encoder = staticmethod(encode_sft)

    def read(self, source) -> list:
        return read_sft(source)

    def collate(self, rows):
        return pad_sequences([r.ids for r in rows], [r.mask for r in rows], self.pad_id, self.device)

    def row_tokens(self, row) -> int:
        return len(row.ids)

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        ids, attention, loss_mask = batch
        logits, targets, mask = response_logits(self.model, ids, attention, loss_mask, call=self._call())
        keep = mask.bool()
        picked, wanted = logits[keep], targets[keep]  # (n, V), (n,): the response tokens
        loss, correct = sft_loss(picked, wanted)
        with torch.no_grad():  # the loss is one cross_entropy call: the entropy takes a pass of its own
            entropy = token_logprobs(picked, wanted)[1]
        n = correct.numel()
        right, entropy_sum = torch.stack([correct.sum().float(), entropy.sum()]).tolist()
        return loss, {"sft/loss": loss.item(), "sft/token_accuracy": right / n if n else 0.0,
                      "entropy": TokenMean(entropy_sum, n), "mean_token_accuracy": TokenMean(right, n)}

    def export(self, out_dir: Path, model) -> Path:
        return export_policy(model, self.tokenizer, out_dir / "model")
