"""Linear layers that run from prepacked weights while a model samples on a CPU.

On a CPU, `F.linear` hands the weight to the BLAS in its stored layout at every call. oneDNN can
instead reorder ("prepack") a weight once into the blocked layout its kernels read fastest, which is
what `torch.compile`'s freezing pass does for inference, without compiling anything. Decoding calls
every linear layer once per new token on a few dozen rows, where a layer runs at the speed its weight
streams from memory, and the packed layout streams faster for wide layers; narrow ones (either side
under `MIN_FEATURES`) keep `F.linear` (`benchmarks/hf_rollout.py` times the whole rollout).

Results equal `F.linear`'s up to float rounding (another summation order).

A peft LoRA layer (plain LoRA on a linear layer, as `lmrl.models.lora` adds) runs the same way from
one weight, its base weight plus the adapters' B·A·scale, merged once on entry: the adapters' own two
products, dropout and sum (six more ops per adapted layer and token) drop out of each decode step.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

# Both sides of a layer must be at least this wide to be packed.
MIN_FEATURES = 512


@functools.cache
def packing_available() -> bool:
    """Whether this torch build packs linear weights with oneDNN (x86 and most ARM CPU builds do)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        w, x = torch.randn(8, 4), torch.randn(3, 4)
        with torch.autocast("cpu", enabled=False):  # the answer is cached: never a bf16 F.linear to compare with
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 3)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            return torch.allclose(y, F.linear(x, w), atol=1e-5)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _packable(module: nn.Module) -> bool:
    if type(module) is not nn.Linear:  # not a subclass: quantized or otherwise special layers keep their forward
        return False
    w = module.weight
    return (w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) and type(w.data) is torch.Tensor
            and min(module.in_features, module.out_features) >= MIN_FEATURES and "forward" not in vars(module))


@functools.cache
def _lora_linear_class():
    try:
        from peft.tuners.lora import Linear
    except ImportError:  # peft is the `hf` extra's; without it there is no LoRA layer to merge
        return None
    return Linear


def _active_lora(module: nn.Module) -> list[str] | None:
    """The active adapters of a peft LoRA linear layer on a CPU whose output is its base layer's with
    their delta weights added (plain LoRA: no variant such as DoRA, no LoRA bias, not merged into the
    base already, adapters enabled, dropout off), or None for any other module."""
    lora_linear = _lora_linear_class()
    if lora_linear is None or type(module) is not lora_linear or "forward" in vars(module):
        return None
    base = module.get_base_layer()
    if module.merged or module.disable_adapters or type(base) is not nn.Linear or base.weight.device.type != "cpu":
        return None
    if base.weight.dtype not in (torch.float32, torch.bfloat16) or type(base.weight.data) is not torch.Tensor:
        return None
    active = [a for a in module.active_adapters if a in module.lora_A]
    plain = all(a not in module.lora_variant and not module.lora_bias.get(a, False)
                and (not module.training or isinstance(module.lora_dropout[a], nn.Identity)) for a in active)
    return active if plain else None


def _merged_weight(module: nn.Module, adapters: list[str]) -> torch.Tensor:
    base = module.get_base_layer().weight.detach()
    delta = sum(module.get_delta_weight(a).detach().to(base.dtype) for a in adapters)
    return base + delta if adapters else base


@contextlib.contextmanager
def packed_linears(model: nn.Module, rows: int):
    """Inside, every plain `nn.Linear` of `model` that lives on a CPU and is at least
    `MIN_FEATURES` wide on both sides runs from a copy of its weight packed for batches of about
    `rows` rows (any batch works). For inference only: the copies are made on entry and do not
    follow later changes to the weights, and a call made with autograd on (or with an input of
    another dtype) falls back to the layer's own forward on the live weights. LoRA layers (see the
    module's docstring) run from their merged weight, packed where their base layer would be.
    Entered under CPU autocast (`run.mixed_precision`), the copies are made in autocast's dtype
    (once, rather than autocast casting each weight at every call) and inputs are cast to it; a call
    made under autocast returns that dtype, as autocast's own `F.linear` would, one made with
    autocast switched off returns the input's dtype (`hf_generate` runs the rest of the model so). A no-op where packing is
    unavailable (GPU models, builds without oneDNN). The copies take as much memory as the packed weights."""
    if not packing_available():
        yield model
        return
    loras = {m: adapters for m in model.modules() if (adapters := _active_lora(m)) is not None}
    bases = {id(m.get_base_layer()) for m in loras}
    layers = [m for m in model.modules() if _packable(m) and id(m) not in bases]
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    replaced = []
    try:
        for layer in layers:
            layer.forward = _packed_forward(layer, layer.weight.detach(), rows, dtype)
            replaced.append(layer)
        for layer, adapters in loras.items():
            layer.forward = _packed_forward(layer, _merged_weight(layer, adapters), rows, dtype)
            replaced.append(layer)
        yield model
    finally:
        for layer in replaced:
            vars(layer).pop("forward", None)


def _packed_forward(layer: nn.Module, weight: torch.Tensor, rows: int, dtype: torch.dtype | None):
    """`layer`'s forward from `weight` (its own, or a LoRA layer's merged one): packed where `_packable`
    would pack the layer, else `F.linear`. Calls with autograd on, with an input of another dtype
    (outside autocast) or with more arguments run the layer's own forward."""
    base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer
    own_forward = type(layer).forward.__get__(layer)
    packing = _packable(base)
    if packing:
        weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype or weight.dtype), max(rows, 1))
    bias = None if base.bias is None else base.bias.detach().to(weight.dtype)

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs or torch.is_grad_enabled() or (x.dtype != weight.dtype and dtype is None):
            return own_forward(x, *args, **kwargs)
        if not packing:
            return F.linear(x, weight, bias)
        y = torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), weight, bias, "none", [], "")
        return y if torch.is_autocast_enabled("cpu") else y.to(x.dtype)

    return forward
