"""Supervised fine-tuning on JSONL or parquet rows, with the loss on response tokens only.

    SFTTrainer(load_config("sft-smollm2")).train()                # an HF model, optionally with LoRA
    SFTTrainer(config, model=my_policy, tokenizer=tok).train()    # your own model

Rows are {"prompt", "response" | "completion"} (the prompt goes through the chat template when the
tokenizer has one and data.chat is on) or conversations ({"messages"} / {"conversations"}: the loss
covers every assistant turn) or {"text"}, under the columns data.prompt_key, data.response_key,
data.messages_key and data.text_field name. sft.completion_only_loss and sft.assistant_only_loss
false widen the loss to the prompt and to every token of a conversation (TRL's defaults for
conversations). The built-in GPT trains on plain prompt/response rows with a
character tokenizer over the data's alphabet. Metrics: sft/loss (mean loss per response token),
sft/token_accuracy (the share of response tokens that are the argmax of their logits, a mean
over micro-batches weighted by rows), and TRL SFTTrainer's names as TRL computes them: loss,
entropy (the mean entropy of the next-token distribution over the response tokens),
mean_token_accuracy (sft/token_accuracy over all the step's response tokens at once: the same with one
micro-batch), num_tokens (every token of the rows trained on so far), grad_norm, learning_rate.
Evaluation reports them as eval/... (eval/token_accuracy = eval/accuracy; eval/num_tokens the
training tokens so far, as TRL logs it); the best model is the one with the lowest eval/loss unless
train.best_metric says otherwise.

The loss per token is cross-entropy (`sft_loss`), or with sft.loss_type=dft Dynamic Fine-Tuning's
(`dft_loss`), or label-smoothed (`label_smoothed_loss`); sft.neftune_noise_alpha adds NEFTune's noise
to the input embeddings while training (`neftune_noise`). data.packing packs rows into sequences of
data.max_length (`lmrl.tasks.text_batches.pack_examples`), each row's positions restarting at 0 so no
row attends to another: each token's loss is what it is in its row alone.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..common.errors import ConfigError
from ..generation.token_logprobs import token_logprobs
from ..tasks.preference_data import Columns, TruncationCounter, read_sft
from ..tasks.text_batches import PackedBatch, encode_sft, pack_examples, packed_batch, pad_sequences, response_logits
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


def dft_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Dynamic Fine-Tuning (Wu et al. 2025, arXiv 2508.05629), as TRL's SFTTrainer computes it: each
    token's cross-entropy weighted by its own probability, the weight without gradient,

        L = −(1/n) Σ_t sg(p_t) · log p_t,    p_t = softmax(z_t)[y_t],

    over the n tokens' logits z (n, V) in float32 and targets y (n,); 0 (attached) with no token."""
    if not targets.numel():
        return logits.sum() * 0.0
    logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None])[:, 0]  # (n,)
    return -(logp * logp.exp().detach()).mean()


def label_smoothed_loss(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Cross-entropy with label smoothing, as transformers' `LabelSmoother` computes it over the tokens
    that are not ignored: with ℓ_t = −log softmax(z_t) (V,),

        L = (1 − ε) · (1/n) Σ_t ℓ_t[y_t] + ε · (1/(n·V)) Σ_t Σ_v ℓ_t[v],

    over logits z (n, V) in float32 and targets y (n,); 0 (attached) with no token."""
    if not targets.numel():
        return logits.sum() * 0.0
    nll = -torch.log_softmax(logits.float(), -1)  # (n, V)
    return (1 - epsilon) * nll.gather(-1, targets[:, None]).mean() + epsilon * nll.sum(-1).mean() / nll.size(-1)


@dataclass(frozen=True)
class TokenLoss:
    """SFT's loss over the response tokens' logits (n, V) and targets (n,): sft.loss_type and
    sft.label_smoothing. Returns (loss, whether each token is its logits' argmax)."""
    loss_type: str = "nll"
    label_smoothing: float = 0.0

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loss_type == "nll" and not self.label_smoothing:
            return sft_loss(logits, targets)
        if self.loss_type == "dft":
            loss = dft_loss(logits, targets)
        elif self.loss_type == "nll":
            loss = label_smoothed_loss(logits, targets, self.label_smoothing)
        else:
            raise ValueError(f"sft.loss_type={self.loss_type!r} is not one of nll, dft")
        with torch.no_grad():
            correct = logits.argmax(-1) == targets
        return loss, correct


def neftune_noise(embeddings: torch.Tensor, alpha: float) -> torch.Tensor:
    """NEFTune (Jain et al. 2023, arXiv 2310.05914) as transformers' `neftune_post_forward_hook` adds it:
    embeddings (B, T, d) + U(−m, m) elementwise, m = alpha / sqrt(T·d), T the batch's sequence length."""
    magnitude = alpha / torch.sqrt(torch.tensor(embeddings.size(1) * embeddings.size(2)))
    return embeddings + torch.zeros_like(embeddings).uniform_(-magnitude, magnitude)


def input_embeddings(model: torch.nn.Module) -> torch.nn.Module:
    """The token-embedding layer of an HF policy (LoRA or not) or of the built-in GPT."""
    inner = getattr(model, "hf_model", model)
    return inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else inner.wte


@contextlib.contextmanager
def noisy_embeddings(model: torch.nn.Module, alpha: float):
    """NEFTune's noise on `model`'s input embeddings for the block, while the embedding layer is in
    training mode (none in evaluation); nothing with alpha 0."""
    if not alpha:
        yield
        return
    hook = input_embeddings(model).register_forward_hook(
        lambda module, args, out: neftune_noise(out, alpha) if module.training else out)
    try:
        yield
    finally:
        hook.remove()


class SFTTrainer(OfflineTrainer):
    name = "sft"
    trainer_key = "sft"
    accuracy_key = "sft/token_accuracy"
    default_best_metric = "eval/loss"

    token_loss = TokenLoss()
    neftune_noise_alpha = 0.0
    packed_layout = False  # rows run with position ids and no attention mask (`packed_batch`)

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        s, d = self.config.sft, self.config.data
        self.token_loss = TokenLoss(s.loss_type, s.label_smoothing)
        self.neftune_noise_alpha = s.neftune_noise_alpha
        # rows whose positions restart inside a batch row (packed by bfd, or padding-free) run with position ids
        # and no attention mask; they share one batch row where the attention is not sdpa or eager (flash
        # attention finds packed rows only so)
        self.packed_layout = d.padding_free or (d.packing and d.packing_strategy != "wrapped")
        if self.packed_layout:
            from ..models.hf import takes_custom_mask

            hf = getattr(self.model, "hf_model", None)
            if hf is None:
                raise ConfigError(f"data.{'padding_free' if d.padding_free else 'packing'}=true restarts positions "
                                  f"inside a row, which {type(self.model).__name__} does not take (an hf model does): "
                                  f"use data.packing_strategy=wrapped or an hf model")
            self.flatten = d.padding_free or not takes_custom_mask(hf)

    def read(self, source) -> list:
        return read_sft(source, columns=Columns.of(self.config.data))

    def encode(self, rows: list, name: str) -> list:
        """`read`'s rows as token ids and loss masks, cut as data.truncation_mode says (bfd_split and
        wrapped packing cut nothing: they split), then packed with data.packing."""
        d, s = self.config.data, self.config.sft
        splits = d.packing and d.packing_strategy != "bfd"
        counter = TruncationCounter()
        examples = encode_sft(rows, self.codec, sys.maxsize if splits else d.max_length, counter,
                              completion_only_loss=s.completion_only_loss, assistant_only_loss=s.assistant_only_loss,
                              truncation_mode=d.truncation_mode)
        note = f"{name}: {counter}"
        if d.packing:
            tokens = sum(len(e.ids) for e in examples)
            examples = pack_examples(examples, d.max_length, d.packing_strategy)
            note += (f"; packed ({d.packing_strategy}) into {len(examples)} sequences of up to {d.max_length} "
                     f"tokens, {tokens / (len(examples) * d.max_length):.0%} full")
        self.data_notes.append(note)
        return examples

    def collate(self, rows):
        if self.packed_layout:
            return packed_batch(rows, self.pad_id, self.device, flatten=self.flatten)
        return pad_sequences([r.ids for r in rows], [r.mask for r in rows], self.pad_id, self.device)

    def row_tokens(self, row) -> int:
        return len(row.ids)

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        # a stand-in for the trainer may hold only `model` and `_call`: the plain cross-entropy then
        token_loss, alpha = getattr(self, "token_loss", TokenLoss()), getattr(self, "neftune_noise_alpha", 0.0)
        with noisy_embeddings(self.model, alpha):
            if isinstance(batch, PackedBatch):  # no attention mask: transformers reads the rows from the positions
                scored = batch.loss_mask[:, 1:].bool()  # the logits at t predict token t + 1
                picked = self._call()(batch.ids, position_ids=batch.positions, logits_to_keep=F.pad(scored, (0, 1)))
                wanted = batch.ids[:, 1:][scored]  # (n, V), (n,): the response tokens, row by row
            else:
                ids, attention, loss_mask = batch
                logits, targets, mask = response_logits(self.model, ids, attention, loss_mask, call=self._call())
                keep = mask.bool()
                picked, wanted = logits[keep], targets[keep]  # (n, V), (n,): the response tokens
        loss, correct = token_loss(picked, wanted)
        with torch.no_grad():  # the loss is one cross_entropy call: the entropy takes a pass of its own
            entropy = token_logprobs(picked, wanted)[1]
        n = correct.numel()
        right, entropy_sum = torch.stack([correct.sum().float(), entropy.sum()]).tolist()
        return loss, {"sft/loss": loss.item(), "sft/token_accuracy": right / n if n else 0.0,
                      "entropy": TokenMean(entropy_sum, n), "mean_token_accuracy": TokenMean(right, n)}

    def export(self, out_dir: Path, model) -> Path:
        return export_policy(model, self.tokenizer, out_dir / "model")
