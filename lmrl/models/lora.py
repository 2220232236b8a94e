"""LoRA adapters on an `HFPolicy`, with peft: only the adapter trains, the base weights stay frozen,
and the base model with the adapter switched off is the KL reference (no second copy in memory).

    add_lora(policy, r=16, alpha=32)         # policy.model becomes a peft model; outputs unchanged at start
    with adapter_disabled(policy): ...       # the base model's outputs
    save_adapter(policy, "adapter/")         # adapter_config.json + adapter_model.safetensors
    export_merged(policy, tokenizer, "out/") # a plain transformers model, adapter merged in
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

from ..common.errors import ConfigError
from .hf import HFPolicy
from .hf_loading import loadable_base

try:
    from peft import LoraConfig, PeftModel, get_peft_model
except ImportError as e:
    raise ImportError(f"lmrl.models.lora needs the `hf` extra ({e}): pip install -e '.[hf]'") from None


def has_adapter(policy: HFPolicy) -> bool:
    return isinstance(policy.model, PeftModel)


def lora_config(section, task_type: str = "CAUSAL_LM") -> LoraConfig:
    """peft's LoraConfig for a `lora` config section: r, alpha, dropout, target_modules, and `section.peft`'s
    further LoraConfig arguments as given."""
    targets = list(section.target_modules)
    return LoraConfig(r=section.r, lora_alpha=section.alpha, lora_dropout=section.dropout,
                      target_modules="all-linear" if targets == ["all-linear"] else targets, task_type=task_type,
                      **dict(getattr(section, "peft", None) or {}))


def add_lora(policy: HFPolicy, r: int = 16, alpha: float = 32, dropout: float = 0.0,
             target_modules: str | list[str] = "all-linear", config: LoraConfig | None = None) -> HFPolicy:
    """Wraps `policy.model` with a LoRA adapter (W + (alpha / r) B A on each target linear layer)
    and freezes everything else. peft starts B at 0, so the policy's outputs are unchanged.
    `target_modules`: "all-linear" (every linear layer but the output head) or module names; `config`, a
    whole peft LoraConfig, replaces r, alpha, dropout and target_modules."""
    if has_adapter(policy):
        raise ValueError("the policy already has a LoRA adapter")
    if config is None:
        config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                            task_type="CAUSAL_LM")
    loadable_base(policy.model, policy.tokenizer)  # a GGUF's folder is no base from_pretrained can load
    policy.model = with_adapter(policy.model, config)
    return policy


def with_adapter(model: torch.nn.Module, config: LoraConfig) -> PeftModel:
    """peft's `get_peft_model(model, config)`; target modules that match none of `model`'s are a
    ConfigError naming them and some of the linear layers there are."""
    try:
        return get_peft_model(model, config)
    except ValueError as e:  # peft's NoMatchingPeftModuleError (a ValueError since peft 0.14), or its older message
        if "not found in the base model" not in str(e) and type(e).__name__ != "NoMatchingPeftModuleError":
            raise
        linear = dict.fromkeys(name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                               if isinstance(module, torch.nn.Linear))
        targets = sorted(config.target_modules) if isinstance(config.target_modules, (set, list)) \
            else config.target_modules
        raise ConfigError(f"lora.target_modules={targets} matches no module of {type(model).__name__}; its linear "
                          f"layers are named {', '.join(list(linear)[:8])} (or use all-linear)") from None


@contextlib.contextmanager
def adapter_disabled(policy: HFPolicy):
    """Inside, the policy computes as its base model (the adapter is bypassed, not removed)."""
    if not has_adapter(policy):
        raise ValueError("the policy has no LoRA adapter to disable; a reference model without LoRA "
                         "needs a frozen copy of the policy")
    with policy.model.disable_adapter():
        yield policy


@torch.no_grad()
def reference_logprobs(policy: HFPolicy, ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                       temperature: float = 1.0) -> torch.Tensor:
    """Log-probs (B, N) of the last `n_completion` tokens under the base model (adapter off, eval mode)."""
    was_training = policy.training
    policy.eval()
    try:
        with adapter_disabled(policy):
            return policy.sequence_logprobs(ids, attention_mask, n_completion, temperature)[0]
    finally:
        policy.train(was_training)


def save_adapter(policy: HFPolicy, directory) -> Path:
    """Writes the adapter only (adapter_config.json + adapter_model.safetensors): megabytes, not the model."""
    if not has_adapter(policy):
        raise ValueError("the policy has no LoRA adapter to save")
    policy.model.save_pretrained(str(directory))
    return Path(directory)


def load_adapter(policy: HFPolicy, directory, *, trainable: bool = True) -> HFPolicy:
    """Puts the adapter saved in `directory` on a policy loaded from the same base model."""
    if has_adapter(policy):
        raise ValueError("the policy already has a LoRA adapter")
    if not (Path(directory) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"no adapter_config.json in {str(directory)!r} (written by save_adapter)")
    policy.model = PeftModel.from_pretrained(policy.model, str(directory), is_trainable=trainable)
    return policy


def export_merged(policy: HFPolicy, tokenizer, out_dir) -> Path:
    """Writes a plain transformers model (adapter merged into the weights) + tokenizer, which
    `AutoModelForCausalLM.from_pretrained(out_dir)` loads without peft. The merge is done on a
    temporary copy, so the policy keeps its adapter and can go on training."""
    model = copy.deepcopy(policy.model)
    merged = model.merge_and_unload() if isinstance(model, PeftModel) else model
    merged.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return Path(out_dir)
