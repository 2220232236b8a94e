"""Linear layers on prepacked weights (`lmrl.generation.packed_linear`): same outputs as `F.linear`,
only wide plain layers packed, everything restored on exit, autograd never goes through a packed
copy, and sampling with packing draws the same tokens as without."""

from __future__ import annotations

import contextlib
import platform

import pytest
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

from lmrl.generation import hf_generate
from lmrl.generation.hf_generate import generate
from lmrl.generation.packed_linear import MIN_FEATURES, packed_linears, packing_available

needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN weight packing")


def _replaced(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if "forward" in vars(m)]


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(MIN_FEATURES, 768), nn.GELU(), nn.Linear(768, MIN_FEATURES, bias=False),
                         nn.Linear(MIN_FEATURES, 64)).eval()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checked on x86 builds only")
def test_x86_cpu_builds_of_torch_pack_weights():
    assert packing_available()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checked on x86 builds only")
def test_packing_is_found_available_when_first_asked_under_autocast():
    packing_available.cache_clear()  # the answer is cached: the first question must not see a bf16 F.linear
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert packing_available()
    finally:
        packing_available.cache_clear()


@needs_packing
def test_wide_plain_linears_run_packed_with_the_same_outputs_and_are_restored_on_exit():
    mlp, x = _mlp(), torch.randn(5, 3, MIN_FEATURES)
    with torch.no_grad():
        expected = mlp(x)
        with packed_linears(mlp, rows=5):
            assert _replaced(mlp) == [mlp[0], mlp[2]]  # mlp[3] is 64 wide: F.linear is faster there
            got = mlp(x)
    assert _replaced(mlp) == []
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@needs_packing
def test_layers_are_restored_when_the_block_raises():
    mlp = _mlp()
    with pytest.raises(RuntimeError, match="boom"), packed_linears(mlp, rows=1):
        raise RuntimeError("boom")
    assert _replaced(mlp) == []


@needs_packing
def test_a_call_with_autograd_on_uses_the_live_weight():
    mlp, x = _mlp(), torch.randn(2, MIN_FEATURES)
    with packed_linears(mlp, rows=2):
        with torch.no_grad():
            mlp[0].weight.mul_(2)  # the packed copy is stale now; a training forward must not see it
        y = mlp[0](x)
        assert y.requires_grad
        y.sum().backward()
    torch.testing.assert_close(y, torch.nn.functional.linear(x, mlp[0].weight, mlp[0].bias))
    assert mlp[0].weight.grad is not None


@needs_packing
def test_a_layer_already_replaced_is_left_alone_by_an_inner_block():
    mlp = _mlp()
    with packed_linears(mlp, rows=1):
        outer = [vars(m)["forward"] for m in _replaced(mlp)]
        with packed_linears(mlp, rows=1):
            assert [vars(m)["forward"] for m in _replaced(mlp)] == outer
        assert [vars(m)["forward"] for m in _replaced(mlp)] == outer  # the inner exit kept the outer's
    assert _replaced(mlp) == []


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=600, hidden_size=MIN_FEATURES, intermediate_size=2 * MIN_FEATURES, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()


@needs_packing
def test_sampling_under_autocast_runs_packed_layers_in_bf16_and_attention_in_fp32(monkeypatch):
    model, seen = _llama(), []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.dtype, k.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = torch.randint(3, 600, (4, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    _, _, full = generate(model, ids, mask, 6, eos_token_ids=2, pad_token_id=0, greedy=True)
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, mixed = generate(model, ids, mask, 6, eos_token_ids=2, pad_token_id=0, greedy=True)
    assert seen and set(seen) == {(torch.float32, torch.float32, False)}
    assert mixed.dtype == torch.float32
    # the first token's log-prob, from the same prompt: bf16 products move it by rounding only
    torch.testing.assert_close(mixed[:, 0], full[:, 0], rtol=0, atol=0.05)
    assert not torch.equal(mixed, full)  # the wide layers did run in bf16


@needs_packing
def test_sampling_with_packed_weights_draws_the_same_tokens(monkeypatch):
    model = _llama()
    packed = []

    @contextlib.contextmanager
    def spy(m, rows):
        with packed_linears(m, rows):
            packed.append(len(_replaced(m)))
            yield m

    monkeypatch.setattr(hf_generate, "packed_linears", spy)
    ids = torch.randint(3, 600, (4, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    runs = {pack: generate(model, ids, mask, 12, eos_token_ids=2, pad_token_id=0, pack_weights=pack,
                           generator=torch.Generator().manual_seed(2)) for pack in (False, True)}
    assert packed == [6]  # q, o, gate, up, down and the head; k and v are 256 wide
    (c0, m0, lp0), (c1, m1, lp1) = runs[False], runs[True]
    assert torch.equal(c0, c1) and torch.equal(m0, m1)
    torch.testing.assert_close(lp1, lp0, rtol=1e-4, atol=1e-4)


@needs_packing
def test_under_autocast_layers_run_packed_in_its_dtype_like_autocasts_own_linear():
    mlp, x = _mlp(), torch.randn(5, MIN_FEATURES)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = mlp(x)
        with packed_linears(mlp, rows=5):
            got = mlp(x)
            packed_out = mlp[0](x)
    assert packed_out.dtype == torch.bfloat16  # the first layer ran packed, in bf16, from an fp32 input
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=0.02, atol=0.02)
    with torch.no_grad(), packed_linears(mlp, rows=5):  # packed outside autocast: fp32 in, fp32 out
        assert mlp[0](x).dtype == torch.float32


def _lora_llama(modules=("q_proj", "k_proj", "v_proj", "o_proj")):
    """`_llama` with LoRA adapters whose B is not zero, so that they change the outputs."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(modules)))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model.eval()


@needs_packing
def test_lora_layers_run_from_their_merged_weight_and_train_through_their_adapters():
    from peft.tuners.lora import Linear as LoraLinear

    model = _lora_llama()
    loras = [m for m in model.modules() if isinstance(m, LoraLinear)]
    x = torch.randint(3, 600, (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids=x).logits
        with model.disable_adapter():
            plain = model(input_ids=x).logits
        with packed_linears(model, rows=3):
            replaced = _replaced(model)
            got = model(input_ids=x).logits
            assert all(m in replaced for m in loras)  # q and o packed, k and v (256 wide) by F.linear
            assert not any(m.get_base_layer() in replaced for m in loras)
    assert (expected - plain).abs().max() > 0.01  # the adapters matter
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    with packed_linears(model, rows=3):
        model(input_ids=x).logits.sum().backward()  # autograd on: the adapters' own forward
    assert all(m.lora_B["default"].weight.grad.abs().sum() > 0 for m in loras)
    assert _replaced(model) == []


@needs_packing
def test_disabled_adapters_leave_the_lora_layers_to_their_packed_base_layers():
    from peft.tuners.lora import Linear as LoraLinear

    model = _lora_llama()
    x = torch.randint(3, 600, (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), model.disable_adapter():
        expected = model(input_ids=x).logits
        with packed_linears(model, rows=3):
            replaced = _replaced(model)
            got = model(input_ids=x).logits
    assert not any(isinstance(m, LoraLinear) for m in replaced)
    assert sum(isinstance(m, nn.Linear) and m.in_features >= MIN_FEATURES for m in replaced) == 6
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@needs_packing
def test_sampling_a_lora_model_with_merged_weights_draws_the_same_tokens():
    model = _lora_llama()
    ids = torch.randint(3, 600, (4, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    runs = {pack: generate(model, ids, mask, 12, eos_token_ids=2, pad_token_id=0, pack_weights=pack,
                           generator=torch.Generator().manual_seed(2)) for pack in (False, True)}
    (c0, m0, lp0), (c1, m1, lp1) = runs[False], runs[True]
    assert torch.equal(c0, c1) and torch.equal(m0, m1)
    torch.testing.assert_close(lp1, lp0, rtol=1e-4, atol=1e-4)

