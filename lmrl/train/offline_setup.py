"""What the offline trainers read and write around their policy: the characters of their data (the
built-in GPT's alphabet, which `lmrl.train.build.build_run` makes its character tokenizer from) and
the export of the trained policy. Their data files are written by `lmrl.tasks.registry.ensure_data`
when `data.generate` asks."""

from __future__ import annotations

import json
from pathlib import Path

from ..tasks.preference_data import iter_rows


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
