"""Value functions for PPO: a scalar V(s_t) at every position, computed on the policy's own trunk
(a head) or on a separate copy of its network (a critic)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

VALUE_MODELS = ("head", "separate")


def hidden_size(model: nn.Module) -> int:
    cfg = model.config
    return getattr(cfg, "n_embd", None) or cfg.hidden_size


class ValueHead(nn.Module):
    """A linear map from hidden states (B, T, C) to values (B, T). Zero-initialised, so the first
    values are 0 and the value loss starts by fitting the returns instead of undoing noise."""

    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h.float()).squeeze(-1)


class ActorCritic(nn.Module):
    """The policy and its value function as one module, so one optimizer (the value function's
    parameters its own group) and one DDP wrapper see both: `forward(ids) -> (logits (B, T, V), values (B, T))`.

    kind="head": a value head on the policy's final hidden states (shared trunk: cheap, and the
    value loss also shapes the policy's features, weighted by `vf_coef`); kind="separate": a copy of
    the policy's network, initialised from its current weights, with its own head (twice the
    compute, no interference). `value` holds exactly the value function's own parameters (saved as
    `value.safetensors` in checkpoints); `policy` stays the bare policy."""

    def __init__(self, policy: nn.Module, kind: str = "head"):
        super().__init__()
        if kind not in VALUE_MODELS:
            raise ValueError(f"algo.value_model must be one of {', '.join(VALUE_MODELS)}, got {kind!r}")
        self.policy = policy
        self.value = nn.ModuleDict({"head": ValueHead(hidden_size(policy))})
        if kind == "separate":
            self.value["critic"] = copy.deepcopy(policy)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, logits_to_keep: int = 0):
        kw = {} if attention_mask is None else {"attention_mask": attention_mask}  # left-padded text prompts
        logits, hidden = self.policy(ids, return_hidden=True, logits_to_keep=logits_to_keep, **kw)
        if "critic" in self.value:
            _, hidden = self.value["critic"](ids, return_hidden=True, **kw)
        return logits, self.value["head"](hidden)

    def init_value_from(self, reward_model: nn.Module) -> None:
        """Start the value function as the reward model (RLHF's usual critic initialisation): the
        critic's trunk takes the reward model's trunk weights and the head its score weights, so
        V(s_T) at a completion's last token is the reward model's score of it. Needs a separate
        critic of the reward model's architecture (same base model)."""
        if "critic" not in self.value:
            raise ValueError("initialising the value function from a reward model needs algo.value_model=separate")
        critic, rm = self.value["critic"].hf_model, reward_model.hf_model
        target = getattr(critic, critic.base_model_prefix)
        source = getattr(rm, rm.base_model_prefix).state_dict()
        names = dict(target.named_parameters())
        loaded = {}
        for key, value in source.items():
            # a LoRA-wrapped critic keeps its base weights under `<module>.base_layer.<name>`
            module, _, leaf = key.rpartition(".")
            name = key if key in names else f"{module}.base_layer.{leaf}"
            if name not in names or names[name].shape != value.shape:
                raise ValueError(f"the reward model's {key} {tuple(value.shape)} has no counterpart in the value "
                                 f"model: reward.model must be trained from the policy's base model")
            loaded[name] = value
        with torch.no_grad():
            for name, value in loaded.items():
                names[name].copy_(value)
            score = rm.score.weight  # (1, C), no bias
            self.value["head"].proj.weight.copy_(score.float())
            self.value["head"].proj.bias.zero_()

