"""Policies: the built-in GPT (and, later, Hugging Face causal LMs)."""

from .gpt import GPT, CharTokenizer, GPTConfig


def build_model(cfg, vocab_size: int) -> GPT:
    """The policy described by the `model` config section."""
    if cfg.type != "gpt":
        raise ValueError(f"model.type={cfg.type!r} is not supported yet (available: gpt)")
    return GPT(GPTConfig(vocab_size=vocab_size, n_position=cfg.n_position, n_layer=cfg.n_layer,
                         n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout))


__all__ = ["GPT", "GPTConfig", "CharTokenizer", "build_model"]
