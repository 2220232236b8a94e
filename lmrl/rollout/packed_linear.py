"""Linear layers that run from prepacked weights while a model samples on a CPU.

On a CPU, `F.linear` hands the weight to the BLAS in its stored layout at every call. oneDNN can
instead reorder ("prepack") a weight once into the blocked layout its kernels read fastest, which is
what `torch.compile`'s freezing pass does for inference, without compiling anything. Decoding calls
every linear layer once per new token on a few dozen rows, where a layer runs at the speed its weight
streams from memory, and the packed layout streams faster. Measured on the 2-core CPU this project
is developed on (fp32, 32 rows, `benchmarks/hf_rollout.py` has the whole-rollout figures):

    layer (in -> out)      F.linear    packed
    576 -> 49152 (head)    24.0 ms     10.0 ms
    576 -> 1536            0.40 ms     0.28 ms
    1536 -> 576            0.39 ms     0.30 ms
    576 -> 576             0.15 ms     0.13 ms
    576 -> 192             0.052 ms    0.063 ms   (narrow layers got slower: they keep F.linear)

Results equal `F.linear`'s up to float rounding (another summation order; bf16 ones were identical).
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

# Both sides of a layer must be at least this wide to be packed (see the table above).
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


@contextlib.contextmanager
def packed_linears(model: nn.Module, rows: int):
    """Inside, every plain `nn.Linear` of `model` that lives on a CPU and is at least
    `MIN_FEATURES` wide on both sides runs from a copy of its weight packed for batches of about
    `rows` rows (any batch works). For inference only: the copies are made on entry and do not
    follow later changes to the weights, and a call made with autograd on (or with an input of
    another dtype) falls back to `F.linear` on the live weight. Entered under CPU autocast
    (`run.mixed_precision`), the copies are made in autocast's dtype (once, rather than autocast
    casting each weight at every call) and inputs are cast to it; a call made under autocast
    returns that dtype, as autocast's own `F.linear` would, one made with autocast switched off
    returns the input's dtype (`hf_generate` runs the rest of the model so). A no-op where packing is
    unavailable (GPU models, builds without oneDNN). The copies take as much memory as the packed weights."""
    layers = [m for m in model.modules() if _packable(m)] if packing_available() else []
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    try:
        for layer in layers:
            weight = layer.weight.detach()
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype or weight.dtype), max(rows, 1))
            layer.forward = _packed_forward(layer, packed, cast=dtype is not None)
        yield model
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)


def _packed_forward(layer: nn.Linear, packed: torch.Tensor, cast: bool):
    weight = layer.weight
    bias = None if layer.bias is None else layer.bias.detach().to(packed.dtype)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or (x.dtype != packed.dtype and not cast):
            return F.linear(x, weight, layer.bias)
        y = torch.ops.mkldnn._linear_pointwise(x.to(packed.dtype), packed, bias, "none", [], "")
        return y if torch.is_autocast_enabled("cpu") else y.to(x.dtype)

    return forward
