"""Supervised fine-tuning on JSONL rows, with the loss on response tokens only.

    SFTTrainer(load_config("sft-smollm2")).train()                # an HF model, optionally with LoRA
    SFTTrainer(config, model=my_policy, tokenizer=tok).train()    # your own model

Rows are {"prompt", "response" | "completion"} (the prompt goes through the chat template when the
tokenizer has one and data.chat is on) or conversations ({"messages"} / {"conversations"}: the loss
covers every assistant turn). The built-in GPT trains on plain prompt/response rows with a
character tokenizer over the data's alphabet. Metrics: sft/loss (mean cross-entropy per response
token), sft/token_accuracy; evaluation: eval/loss, eval/token_accuracy (= eval/accuracy); the best
model is the one with the lowest eval/loss unless train.best_metric says otherwise.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..tasks.preference_data import read_sft
from ..tasks.text_batches import encode_sft, pad_sequences, response_logps
from .offline import OfflineTrainer
from .offline_setup import build_policy, export_policy


class SFTTrainer(OfflineTrainer):
    name = "sft"
    trainer_key = "sft"
    accuracy_key = "sft/token_accuracy"
    default_best_metric = "eval/loss"

    encoder = staticmethod(encode_sft)

    def build_model(self):
        return build_policy(self.config)

    def read(self, source) -> list:
        return read_sft(source)

    def collate(self, rows):
        return pad_sequences([r.ids for r in rows], [r.mask for r in rows], self.pad_id, self.device)

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        ids, attention, loss_mask = batch
        _, logits, targets, mask = response_logps(self.model, ids, attention, loss_mask, call=self._call())
        mask = mask.bool()
        picked = logits[mask].float()  # (N, V): the response positions only
        loss = F.cross_entropy(picked, targets[mask]) if picked.numel() else logits.sum() * 0.0
        with torch.no_grad():
            acc = (picked.argmax(-1) == targets[mask]).float().mean().item() if picked.numel() else 0.0
        return loss, {"sft/loss": loss.item(), "sft/token_accuracy": acc}

    def export(self, out_dir: Path, model) -> Path:
        return export_policy(model, self.tokenizer, out_dir / "model")

    def fresh_model(self):
        return build_policy(self.config)[0]
