"""KV caches for the lean sampling loop (`lmrl.generation.hf_generate`).

transformers' `DynamicCache` grows each layer's keys and values by concatenation, so every decode
step copies the whole cache of every layer to add one position. `InPlaceLayer` writes each step's
keys and values into buffers sized for the whole rollout (prompt plus `max_new_tokens`) and hands
attention views of the filled part: a step copies only its new positions. `new_cache` builds the
loop's caches (benchmarks/hf_rollout.py times them against each other).
"""

from __future__ import annotations

import functools
import inspect

import torch

try:
    from transformers import DynamicCache, StaticCache
    from transformers.cache_utils import DynamicLayer
except ImportError as e:  # the core of lmrl runs without transformers
    raise ImportError(f"lmrl.generation.kv_cache needs the `hf` extra ({e}): pip install -e '.[hf]'") from None

CACHES = ("dynamic", "concat", "static")


class InPlaceLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values live in buffers of `capacity` positions, written in
    place; `keys` / `values` are views of the first `length` positions. A write past the capacity
    grows the buffers (by at least doubling), so the capacity is a size hint, not a limit."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k = self._v = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> None:
        self.device = key_states.device
        self._k = key_states.new_empty(*key_states.shape[:2], self.capacity, key_states.size(3))
        self._v = value_states.new_empty(*value_states.shape[:2], self.capacity, value_states.size(3))
        self.length = 0
        self.is_initialized = True
        self._expose()

    def _expose(self) -> None:
        self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.size(2)
        if end > self._k.size(2):
            more = max(end, 2 * self._k.size(2)) - self._k.size(2)
            self._k = torch.cat([self._k, self._k.new_empty(*self._k.shape[:2], more, self._k.size(3))], 2)
            self._v = torch.cat([self._v, self._v.new_empty(*self._v.shape[:2], more, self._v.size(3))], 2)
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self, *args, **kwargs) -> int:
        return self.length if self.is_initialized else 0

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row i becomes row `beam_idx[i]` (index_select on the batch dim; rows may repeat or drop)."""
        if self.is_initialized:
            self._k = self._k.index_select(0, beam_idx.to(self._k.device))
            self._v = self._v.index_select(0, beam_idx.to(self._v.device))
            self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._expose()

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last `-tokens_to_remove` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of positions to remove, got {tokens_to_remove}")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()


def new_cache(model, kind: str, max_len: int):
    """An empty KV cache for `model` (a peft wrapper forwards `.config` to its base): "dynamic"
    (transformers' `DynamicCache` with its full-attention layers written in place, `InPlaceLayer`s
    of `max_len` positions; attention sees the filled part), "concat" (`DynamicCache` as it comes,
    growing by concatenation: `model.generate`'s default) or "static" (transformers' `StaticCache`
    of `max_len` positions; attention spans all of them, the unwritten ones masked)."""
    if kind in ("dynamic", "concat"):
        cache = DynamicCache(config=model.config)
        if kind == "dynamic":  # sliding-window and other special layers stay as they are
            cache.layers = [InPlaceLayer(max_len) if type(layer) is DynamicLayer else layer for layer in cache.layers]
        return cache
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=max_len)
    raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {kind!r}")


def with_cache(model, past) -> dict:
    """The keyword that hands the KV cache `past` to `model`'s forward: transformers 5.2x renamed
    `past_key_values` to `cache` (the old name warns on every call), and older releases (vLLM's
    environment pins one) know only the old name. A peft wrapper is looked through to its base."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(base)): past}


@functools.cache
def _cache_keyword(model_class) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"
