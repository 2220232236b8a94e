"""`lmrl.common.launch_costs`: the learner shares prompts on a GPU only where the prompt work it saves
outweighs launching its extra operations over one pass (hand-computed cases), and always on a CPU."""

from types import SimpleNamespace

import pytest
import torch

from lmrl.common.launch_costs import layer_ops, prompt_sharing_pays


def test_layer_operations_lie_between_the_counts_without_and_with_lora_by_the_share_adapted():
    assert layer_ops((61.5, 97.6), 0.0) == 61.5
    assert layer_ops((61.5, 97.6), 1.0) == 97.6
    assert layer_ops((61.5, 97.6), 4 / 7) == pytest.approx(82.1286, abs=1e-4)  # q, k, v, o adapted


def test_a_small_model_on_a_gpu_does_not_share_prompts_and_a_large_one_does():
    """Sharing's extra operations over one pass, LoRA layers: 1426.2 - 453.2 = 973 a layer at 17 us.
    SmolLM2 (134.5M, 30 layers), 8 rows of 90 prompt tokens: 0.496 s of launches against
    4 x 134.5M x 720 / 319.2 TFLOP/s = 1.2 ms of work (a LoRA pass: 2 forward, 2 backward). A 7B
    model (32 layers), 32 rows of 500: 0.529 s against 1.404 s."""
    smol = dict(parameters=134_500_000, layers=30, rows=8, prompt_tokens=90, adapted_share=1.0)
    big = dict(parameters=7_000_000_000, layers=32, rows=32, prompt_tokens=500, adapted_share=1.0)
    assert not prompt_sharing_pays(**smol)
    assert prompt_sharing_pays(**big)
    # the boundary: 0.496 s of work is 0.4962 x 319.2e12 / (4 x 134.5M x 90) = 3,271 rows of 90 tokens;
    # training every weight (6 x parameters a token) moves it to 2,181
    assert not prompt_sharing_pays(**{**smol, "rows": 3240})
    assert prompt_sharing_pays(**{**smol, "rows": 3300})
    full = {**smol, "adapted_share": 0.0}  # without LoRA: (923.4 - 284.4) x 30 x 17 us = 0.326 s
    assert not prompt_sharing_pays(**{**full, "rows": 1400})  # 1,433 rows of 90 tokens at 6 x parameters
    assert prompt_sharing_pays(**{**full, "rows": 1460})


def test_the_hf_policy_always_shares_on_a_cpu():
    from lmrl.models.hf import HFPolicy

    stub = SimpleNamespace(_parameters_count=None, model=torch.nn.Linear(4, 4),
                           config=SimpleNamespace(num_hidden_layers=30))
    assert HFPolicy._sharing_pays(stub, torch.zeros(8, 218, dtype=torch.long), 128)
    assert stub._parameters_count is None  # nothing counted where nothing is decided
