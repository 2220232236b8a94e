"""The decode step a GPU captures as a CUDA graph (`lmrl.generation.decode_graph`), checked on the CPU
where capture itself cannot run: on the code path transformers takes while a CUDA stream is capturing,
one step's forward makes no host sync (which capture forbids) and builds no tensor from Python data
(a host-to-device copy there), and writes the cache only in place."""

from __future__ import annotations

import pytest
import torch

from benchmarks.launch_count import OpCount
from lmrl.generation.decode_graph import StaticDecodeStep
from lmrl.generation.hf_generate import prefill
from lmrl.generation.kv_cache import new_cache
from tests.test_hf_generate import VOCAB, peaked_llama

FORBIDDEN = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.lift_fresh", "aten._to_copy")


@pytest.mark.parametrize("lora", [False, True])
def test_a_decode_step_on_the_capture_path_neither_syncs_nor_copies_from_the_host(monkeypatch, lora):
    import transformers.utils.import_utils as import_utils

    model = peaked_llama()
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (4, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row: the mask matters
    with torch.inference_mode():
        past = new_cache(model, "static", 6 + 8)
        with OpCount() as prefill_ops:  # the prefill does sync (it sizes the shared prefix): the check sees it
            logits, cache_mask = prefill(model, past, ids, mask, True)
        step = StaticDecodeStep(model, past, cache_mask, 14, graph=True)  # on a CPU: never captured
        positions = mask.sum(-1, keepdim=True)
        step(logits.argmax(-1), positions)  # the eager first step
        step.ids.copy_(logits.argmax(-1)[:, None])
        step.positions.copy_(positions + 1)
        step.mask[:, step.column] = 1
        step.column += 1
        eager = step._forward().clone()
        for layer in past.layers:  # the same step again (its write position back one), as run under capture
            layer.cumulative_length.sub_(1)
        monkeypatch.setattr(import_utils, "is_cuda_stream_capturing", lambda: True)
        with OpCount() as ops:
            captured = step._forward()
    assert step.graph is None and step._capture is False
    assert any(name in FORBIDDEN for name in prefill_ops.ops)
    assert not {name: n for name, n in ops.ops.items() if name in FORBIDDEN}, ops.ops
    assert ops.ops["aten.index_copy_"] == 2 * model.config.num_hidden_layers  # keys and values, in place
    torch.testing.assert_close(captured, eager)  # the capture path computes the same step
