"""What the offline trainers build before training: their data files (written when `data.generate`
asks and they are missing) and the policy with its tokenizer (an HF model, with LoRA when
`lora.r > 0`, or the built-in GPT with a character tokenizer over the data's alphabet)."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Config, ConfigError
from ..models import build_model
from ..models.gpt import CharTokenizer
from ..tasks.preference_data import iter_rows
from ..tasks.registry import ensure_files


def ensure_data(cfg: Config) -> None:
    """`data.generate` writes DIR/train.jsonl and DIR/test.jsonl when either is missing (see
    `lmrl.tasks.registry.GENERATORS`; sql-demos plays the SQL agent's episodes in this config's `sql`)."""
    d = cfg.data
    ensure_files(d.train_file, d.eval_file, d.generate, key="data", config=cfg, n_train=d.generate_train,
                 n_test=d.generate_test)


def data_texts(path: str | None) -> str:
    """Every string value in a JSONL file (for the GPT's alphabet); '' when there is no file."""
    if not path:
        return ""
    out = []

    def walk(v):
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for _, row in iter_rows(path):
        walk(row)
    return "".join(out)


def build_policy(cfg: Config, tokenizer_dir: Path | None = None):
    """(policy, tokenizer). An hf policy comes from `model.path` (+ LoRA); the built-in GPT gets a
    character tokenizer over the characters of data.train_file and data.eval_file (or the one saved
    in `tokenizer_dir`, when resuming or evaluating a run)."""
    import torch

    torch.manual_seed(cfg.run.seed)  # the same initial weights (GPT, LoRA adapter) for a seed
    if cfg.model.type == "hf":
        policy = build_model(cfg.model, lora=cfg.lora)
        return policy, policy.tokenizer
    saved = tokenizer_dir / "tokenizer.json" if tokenizer_dir is not None else None
    if saved is not None and saved.exists():
        tokenizer = CharTokenizer.load(saved)
    else:
        chars = set(data_texts(cfg.data.train_file) + data_texts(cfg.data.eval_file))
        tokenizer = CharTokenizer("".join(sorted(chars)) or " ")
    if cfg.model.n_position < cfg.data.max_length:
        raise ConfigError(f"data.max_length={cfg.data.max_length} is longer than model.n_position="
                          f"{cfg.model.n_position}; raise model.n_position or lower data.max_length")
    return build_model(cfg.model, tokenizer.vocab_size), tokenizer


def export_policy(policy, tokenizer, out_dir: Path) -> Path:
    """An hf policy as a plain transformers model (LoRA merged); the GPT as model.safetensors +
    tokenizer.json + its architecture."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if type(policy).__name__ == "HFPolicy":
        from ..models.lora import export_merged

        return export_merged(policy, tokenizer, out_dir)
    from dataclasses import asdict

    from safetensors.torch import save_model

    save_model(policy, str(out_dir / "model.safetensors"))
    tokenizer.save(out_dir / "tokenizer.json")
    (out_dir / "gpt_config.json").write_text(json.dumps(asdict(policy.config)))
    return out_dir
