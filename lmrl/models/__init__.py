"""Policies: the built-in GPT, and Hugging Face causal LMs (optionally with a LoRA adapter)."""

import torch.nn as nn

from .gpt import GPT, CharTokenizer, GPTConfig


def build_model(cfg, vocab_size: int | None = None, *, lora=None):
    """The policy described by the `model` config section (and `lora`, for an hf model)."""
    if cfg.type == "hf":
        from .hf import load_hf_policy

        policy, _ = load_hf_policy(cfg.path, gguf_file=cfg.gguf_file, dtype=cfg.dtype,
                                   gradient_checkpointing=cfg.gradient_checkpointing)
        if lora is not None and lora.r > 0:
            from .lora import add_lora, lora_config

            add_lora(policy, config=lora_config(lora))
        return policy
    if cfg.type != "gpt":
        raise ValueError(f"model.type={cfg.type!r} is not supported (available: gpt, hf)")
    return GPT(GPTConfig(vocab_size=vocab_size, n_position=cfg.n_position, n_layer=cfg.n_layer,
                         n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout))


def disable_dropout(model: nn.Module) -> None:
    """Sets every dropout layer of `model` to p = 0 (what TRL's `disable_dropout_in_model` does)."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


__all__ = ["GPT", "GPTConfig", "CharTokenizer", "build_model", "disable_dropout"]
