"""The sampling loop's decode step over a static KV cache, replayed as a CUDA graph on a GPU.

A decode step of a small model on a GPU is bound by the CPU launching its operations (about 60 per
Llama layer in eager mode, nearer 100 with LoRA adapters, each ~16 us of Python, dispatch and launch
on an H100's host: benchmarks/launch_count.py, docs/results.md), not by the GPU running them. A CUDA
graph records the step's kernels once and replays them with one launch. That needs every tensor the
step reads or writes at a fixed address with a fixed shape, so the step's
inputs live in buffers sized for the whole rollout: token ids (B, 1), position ids (B, 1), the 2-D
attention mask over every cache column (B, L), and transformers' `StaticCache`, which writes each
step's keys and values in place at a position it keeps on the device. The batch keeps its size
(no compaction: finished rows run on, masked off by the caller).

`StaticDecodeStep` runs the first step eagerly (on a side stream, which also warms up the kernels'
workspaces), then captures the step and replays it for the others. Where capture fails (a model whose
forward synchronises with the host, say) it warns once per model class and stays eager on the same
buffers; on a CPU it is always eager, which is how the test suite checks its buffers and masks.
"""

from __future__ import annotations

import logging

import torch

from .kv_cache import with_cache

try:
    from transformers.cache_utils import StaticLayer
except ImportError as e:  # the core of lmrl runs without transformers
    raise ImportError(f"lmrl.generation.decode_graph needs the `hf` extra ({e}): pip install -e '.[hf]'") from None

log = logging.getLogger(__name__)
_capture_failed: set[type] = set()  # model classes whose forward could not be captured: warned once


def graphable(past) -> bool:
    """Whether a decode step over the transformers cache `past` can be replayed: every layer a plain
    `StaticLayer`, which keeps its write position in a device tensor. Sliding-window and other
    special layers keep theirs in Python, which a graph would freeze at its capture."""
    return bool(past.layers) and all(type(layer) is StaticLayer for layer in past.layers)


class StaticDecodeStep:
    """`step(tokens (B,), positions (B, 1))` feeds one token per row to `model` and returns the next
    logits (B, V). `past` is a `StaticCache` of `capacity` positions holding the prefill, whose 2-D
    mask `mask` (B, K) describes its first K columns; each step uses the next column. With `graph`
    (CUDA only) the second step is captured and later steps replay it: the returned logits are then
    the graph's output buffer, overwritten by the next step."""

    def __init__(self, model, past, mask: torch.Tensor, capacity: int, graph: bool):
        B, K = mask.shape
        if K >= capacity:
            raise ValueError(f"the cache has {capacity} positions and the prefill fills {K}: no room to decode")
        self.model, self.past = model, past
        self.ids = mask.new_zeros(B, 1)
        self.positions = mask.new_zeros(B, 1)
        self.mask = mask.new_zeros(B, capacity)
        self.mask[:, :K] = mask
        self.column = K  # the cache column the next token goes to
        self.graph = None
        self.logits = None
        self._capture = graph and mask.is_cuda and type(model) not in _capture_failed
        self._stream = torch.cuda.Stream(mask.device) if self._capture else None

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.positions,
                         **with_cache(self.model, self.past), use_cache=True)
        return out.logits[:, -1]

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.column >= self.mask.size(1):
            raise RuntimeError(f"the static cache's {self.mask.size(1)} positions are all used")
        self.ids.copy_(tokens[:, None])
        self.positions.copy_(positions)
        self.mask[:, self.column] = 1
        self.column += 1
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if self._stream is None:
            return self._forward()
        # First step: eager on a side stream (kernel workspaces are made outside the capture), then capture.
        self._stream.wait_stream(torch.cuda.current_stream(self.mask.device))
        with torch.cuda.stream(self._stream):
            logits = self._forward()
        torch.cuda.current_stream(self.mask.device).wait_stream(self._stream)
        self._capture_next_step()
        return logits

    def _capture_next_step(self) -> None:
        """Records the step as it will run next (nothing runs now: the cache and buffers are unchanged)."""
        self._stream = None
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                logits = self._forward()
        except Exception as e:  # noqa: BLE001 - any capture failure leaves the eager step, which works
            _capture_failed.add(type(self.model))
            log.warning("sampling without CUDA graphs: %s's decode step could not be captured (%s: %s)",
                        type(self.model).__name__, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return
        self.graph, self.logits = graph, logits
