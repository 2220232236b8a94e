"""The sampling loop's KV cache (`lmrl.generation.kv_cache`): the in-place layer keeps what
transformers' concatenating layer keeps, and the loop samples the same with either."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer

from lmrl.generation.hf_generate import generate
from lmrl.generation.kv_cache import InPlaceLayer, new_cache

pytestmark = pytest.mark.usefixtures("one_thread")


def _states(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=g), torch.randn(batch, 2, length, 4, generator=g)


def test_in_place_layer_holds_what_the_concatenating_layer_holds_through_growth_reorder_and_crop():
    ours, theirs = InPlaceLayer(capacity=5), DynamicLayer()
    for k, v in [_states(3, 4, 0), _states(3, 1, 1), _states(3, 2, 2)]:  # 7 positions: past the capacity of 5
        got, want = ours.update(k, v), theirs.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert ours.get_seq_length() == theirs.get_seq_length() == 7
    for layer in (ours, theirs):
        layer.reorder_cache(torch.tensor([2, 0, 0]))  # rows move, repeat and drop
        layer.crop(-2)
    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    k, v = _states(3, 1, 3)
    assert torch.equal(ours.update(k, v)[0], theirs.update(k, v)[0])
    assert ours.get_seq_length() == 6


def test_a_step_writes_into_the_buffer_it_was_given_instead_of_copying_the_cache():
    layer = InPlaceLayer(capacity=8)
    layer.update(*_states(2, 3, 0))
    buffer = layer.keys.untyped_storage().data_ptr()
    for seed in range(1, 6):
        layer.update(*_states(2, 1, seed))
        assert layer.keys.untyped_storage().data_ptr() == buffer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, pad_token_id=0)).eval()


def test_the_loop_uses_in_place_layers_and_samples_as_with_transformers_cache(model):
    cache = new_cache(model, "dynamic", 16)
    assert len(cache.layers) == 2 and all(type(layer) is InPlaceLayer for layer in cache.layers)
    ids = torch.randint(3, 64, (4, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    runs = [generate(model, ids, mask, 8, eos_token_ids=[5], pad_token_id=0, cache=kind, compact_at=0.0,
                     generator=torch.Generator().manual_seed(2)) for kind in ("dynamic", "concat")]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.allclose(runs[0][2], runs[1][2], atol=1e-6)
    with pytest.raises(ValueError, match="'paged'"):
        new_cache(model, "paged", 16)
