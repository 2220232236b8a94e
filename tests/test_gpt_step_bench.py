"""benchmarks/gpt_step.py compares like with like: each SDPA baseline computes what lmrl's attention
computes, for every shape the benchmark times (and the trimmed learner pass between them)."""

import pytest
import torch

from benchmarks.gpt_step import ATTENTION


@pytest.mark.parametrize("Q, L", [(12, 12), (8, 8), (1, 12), (5, 12)])
@pytest.mark.parametrize("baseline", ["sdpa", "sdpa math"])
def test_each_baseline_attends_as_lmrl_does(baseline, Q, L):
    g = torch.Generator().manual_seed(Q * L)
    q, k, v = (torch.randn(4, 8, n, 32, generator=g, dtype=torch.bfloat16) for n in (Q, L, L))
    ours, theirs = ATTENTION["lmrl"](q, k, v).float(), ATTENTION[baseline](q, k, v).float()
    assert (ours - theirs).abs().max() < 0.03  # bf16 outputs: 8 bits of mantissa
    assert (ours - ATTENTION["lmrl"](q, k, v.flip(-2)).float()).abs().max() > 0.1  # the check can tell values apart
