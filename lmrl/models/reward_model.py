"""Reward models: a transformer with a one-number sequence-classification head, scoring a prompt +
response by the head's output at its last token (transformers' `*ForSequenceClassification`,
num_labels=1, so a trained one loads back with `AutoModelForSequenceClassification`).

    rm, tokenizer = build_reward_model("smollm2-135m-instruct")   # trunk from a causal LM, new head
    rm, tokenizer = load_reward_model("runs/rm-smollm2/reward_model")
    scores = rm(ids, attention_mask)                               # (B,)

    reward = RewardModelScorer("runs/rm-smollm2/reward_model")    # a reward function for RL
    reward(["What is 2+2?"], ["4"])                                # -> [1.73]

Rows are right-padded; the score is read at the rightmost token that is not the pad token (what
transformers does), so a model loaded from disk scores exactly as it did in training.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch
from torch import nn

from ..common.errors import ConfigError

logger = logging.getLogger("lmrl")


class RewardModel(nn.Module):
    """`forward(ids, attention_mask) -> scores (B,)` over a sequence-classification model (optionally
    wrapped by peft)."""

    def __init__(self, model: nn.Module, tokenizer):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer

    @property
    def hf_model(self) -> nn.Module:
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def takes_pair_rows(self) -> bool:
        """Whether it scores `tasks.text_batches.pair_rows` batches: a trunk with a `score` head (transformers'
        sequence classifiers on decoder LMs) whose attention takes a custom 4-D mask."""
        from .hf import takes_custom_mask

        hf = self.hf_model
        return takes_custom_mask(hf) and isinstance(getattr(hf, "score", None), nn.Module) and \
            isinstance(getattr(hf, hf.base_model_prefix, None), nn.Module)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, score_at: torch.Tensor | None = None) -> torch.Tensor:
        """Scores (B,): each row's at its last token that is not the pad token (transformers' rule).

        A custom layout (`pair_rows`: a pair's two replies after its prompt in one row) passes a 4-D
        `attention_mask` (B, 1, T, T), True where a query may attend a key, its `position_ids`, and
        `score_at` (N,), the flat positions (row * T + column) to score: scores (N,). The trunk runs
        once and the score head reads only those positions, as the sequence classifier's own
        forward does at its one position per row."""
        if score_at is None:
            return self.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False).logits[:, 0].float()
        from .hf import custom_attention_mask

        hf = self.hf_model
        trunk = getattr(hf, hf.base_model_prefix)  # peft's LoRA layers sit inside it; `score` is its trained copy
        hidden = trunk(input_ids=ids, attention_mask=custom_attention_mask(hf, attention_mask),
                       position_ids=position_ids, use_cache=False).last_hidden_state  # (B, T, C)
        return hf.score(hidden.flatten(0, 1)[score_at])[:, 0].float()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save(self, out_dir: Path) -> Path:
        """A plain transformers model (LoRA merged) + tokenizer in `out_dir`."""
        model = copy.deepcopy(self.model)
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model.save_pretrained(str(out_dir))
        self.tokenizer.save_pretrained(str(out_dir))
        return Path(out_dir)


def is_reward_model_dir(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    archs = json.loads(config.read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in archs)


def is_reward_adapter_dir(path: str | Path) -> bool:
    """A PEFT adapter of a sequence classifier without the model it goes on (what TRL's
    RewardTrainer.save_model writes with LoRA: adapter_config.json naming its base model)."""
    path = Path(path)
    adapter = path / "adapter_config.json"
    if not adapter.is_file() or (path / "config.json").is_file():
        return False
    return json.loads(adapter.read_text()).get("task_type") == "SEQ_CLS"


def build_reward_model(path: str, *, gguf_file: str | None = None, dtype: str = "fp32", lora=None,
                       device="cpu") -> tuple[RewardModel, object]:
    """A reward model on the trunk of the causal LM at `path` (a directory, GGUF, or a packaged name;
    see `load_hf_policy`) with a fresh score head; or, when `path` already holds a sequence-
    classification model, that model. `lora` (a LoraConfig section with r > 0) puts an adapter on
    the trunk and trains the head in full."""
    from transformers import AutoModelForSequenceClassification

    if is_reward_model_dir(path):
        rm, tokenizer = load_reward_model(path, device=device)
    else:
        from .hf import load_hf_policy

        policy, tokenizer = load_hf_policy(path, gguf_file=gguf_file, dtype=dtype)
        causal = policy.model
        config = copy.deepcopy(causal.config)
        config.num_labels = 1
        config.pad_token_id = tokenizer.pad_token_id
        config.architectures = None
        seq = AutoModelForSequenceClassification.from_config(config, dtype=causal.dtype)
        trunk = getattr(causal, causal.base_model_prefix)
        getattr(seq, seq.base_model_prefix).load_state_dict(trunk.state_dict())
        # what transformers says when a classifier loads from a causal LM, said once in lmrl's log
        logger.warning(f"reward model: {path} holds a causal LM ({', '.join(causal.config.architectures or [])}); its "
                       f"trunk gets a newly initialized score head ({type(seq).__name__}), which training learns")
        del policy, causal, trunk
        rm = RewardModel(seq, tokenizer)
    if lora is not None and lora.r > 0:
        from .lora import lora_config, with_adapter

        rm.model = with_adapter(rm.model, lora_config(lora, task_type="SEQ_CLS"))
    return rm.to(device), tokenizer


def load_reward_model(path: str | Path, device="cpu") -> tuple[RewardModel, object]:
    """A saved reward model (what the reward trainer exports, or any local
    `AutoModelForSequenceClassification` with num_labels=1), or a PEFT adapter of one, loaded as TRL
    loads it: its base model (adapter_config.json's) with the adapter and its trained score head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    adapter = is_reward_adapter_dir(path)
    if not (adapter or is_reward_model_dir(path)):
        raise FileNotFoundError(f"reward model {path}: no sequence-classification model there (expected config.json "
                                f"naming a *ForSequenceClassification architecture, as the reward trainer writes, or "
                                f"a SEQ_CLS adapter_config.json, as TRL's RewardTrainer writes with LoRA)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if adapter:
        model, loading = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1,
                                                                            local_files_only=True), {}
    else:
        model, loading = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True,
                                                                            output_loading_info=True)
    missing = sorted(loading.get("missing_keys") or [])
    if missing:  # transformers initializes them at random: a reward model whose scores mean nothing
        raise ConfigError(f"reward model {path}: its weights lack {', '.join(missing[:3])}"
                          f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''} (a causal LM's weights under "
                          f"a sequence-classification config?); transformers would initialize them at random. Train a "
                          f"reward model from the causal LM with `lmrl train rm-smollm2 model.path=...`")
    if model.config.num_labels != 1:
        raise ValueError(f"reward model {path} has {model.config.num_labels} labels; a reward model has one")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return RewardModel(model, tokenizer).to(device).eval(), tokenizer


def same_vocabulary(a, b) -> bool:
    """Two tokenizers that map every token to the same id (what scoring one model's ids with another needs)."""
    return a.get_vocab() == b.get_vocab()
