"""The KL reference as a view, not a copy: a LoRA policy with its adapter switched off is exactly
its frozen base model, so the reference costs no memory (the trainer deep-copies only policies
without an adapter)."""

from __future__ import annotations

import copy

import torch.nn as nn


class AdapterDisabledView(nn.Module):
    """Calls the policy with its LoRA adapter disabled, in eval mode and without gradients to the
    adapter. The policy is held outside the module tree, so the view has no parameters: nothing to
    save, nothing an optimizer could see."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        object.__setattr__(self, "_policy", policy)  # not a submodule

    @property
    def takes_pair_rows(self) -> bool:
        return bool(getattr(self._policy, "takes_pair_rows", False))

    def forward(self, *args, **kwargs):
        from .lora import adapter_disabled

        policy = self._policy
        was_training = policy.training
        policy.eval()
        try:
            with adapter_disabled(policy):
                return policy(*args, **kwargs)
        finally:
            policy.train(was_training)


def has_lora_adapter(model: nn.Module) -> bool:
    """An HFPolicy carrying a LoRA adapter (checked without importing peft for other models)."""
    if not any(c.__name__ == "HFPolicy" for c in type(model).__mro__):  # FSDP makes it an FSDPHFPolicy
        return False
    from .lora import has_adapter

    return has_adapter(model)


def reference_view(policy: nn.Module) -> AdapterDisabledView | None:
    """A view of `policy`'s base model when it carries a LoRA adapter, else None."""
    return AdapterDisabledView(policy) if has_lora_adapter(policy) else None


def is_reference_view(module: nn.Module) -> bool:
    return isinstance(module, AdapterDisabledView)


def build_reference(policy: nn.Module) -> nn.Module:
    """The KL reference of `policy` as it is now (RL as it starts, DPO): the view with the adapter
    switched off for a LoRA policy, else a frozen copy (eval mode, no gradients)."""
    return reference_view(policy) or copy.deepcopy(policy).eval().requires_grad_(False)
