"""What launching work costs on a GPU, as measured: the figures `lmrl plan` estimates step times with
and that the HF policy's learner pass decides by.

Eager PyTorch pays each aten operation's dispatch and launch on the host, so a small model's step on a
GPU takes (operations x that cost), whatever the GPU could do. The operation counts per decoder layer
come from benchmarks/launch_count.py, the cost per operation from the H100 machine's device check
(docs/results.md): 16-19 us over its GRPO rollouts and updates.
"""

from __future__ import annotations

OP_SECONDS = 17e-6  # one eager aten operation on a GPU's host
GRAPH_OP_SECONDS = 1e-6  # the same operation replayed in a CUDA graph: assumed, not measured yet
# aten operations per Llama-style decoder layer, as (no LoRA, LoRA on all 7 projections): a decode step;
# an update's micro-batch by the learner's pass (shared prompts: 3 passes, common prefix / distinct
# prompts / completions; a common start: 2; one pass; checkpointed: one pass, recomputed). Plus the
# fixed operations of a decode step (sampling) and of a micro-batch (the loss).
DECODE_OPS = (61.5, 97.6)
UPDATE_OPS = {"shared prompts": (923.4, 1426.2), "common start": (666.4, 1023.1), "one pass": (284.4, 453.2),
              "checkpointed": (411.4, 668.2)}
DECODE_FIXED_OPS, UPDATE_FIXED_OPS = 63, 500
# a training pass's matrix products on an H100 in bf16: 798 TFLOP/s measured, at the 40% a real pass reaches
GPU_PASS_FLOPS = 0.4 * 798e12


def layer_ops(counts: tuple[float, float], adapted_share: float) -> float:
    """Operations per layer for a model whose `adapted_share` of the 7 projections carry LoRA adapters."""
    return counts[0] + (counts[1] - counts[0]) * adapted_share


def prompt_sharing_pays(*, parameters: int, layers: int, rows: int, prompt_tokens: int, adapted_share: float,
                        pass_flops: float = GPU_PASS_FLOPS, op_seconds: float = OP_SECONDS) -> bool:
    """Whether, on a GPU, the learner's shared-prompt pass is worth its extra operations against one
    plain pass: the forward and backward work of the rows' prompt tokens (which it saves, at most)
    takes longer than launching them. On a CPU sharing always pays: there the work is the bound."""
    extra = layer_ops(UPDATE_OPS["shared prompts"], adapted_share) - layer_ops(UPDATE_OPS["one pass"], adapted_share)
    launches = extra * layers * op_seconds
    per_token = (2 + (2 if adapted_share else 4)) * parameters  # forward; backward (LoRA: no frozen-weight gradients)
    work = per_token * rows * prompt_tokens / pass_flops
    return work > launches
