"""benchmarks/hf_rollout.py's roofline: the bytes a decode step reads and the bandwidth it is read at."""

import torch

from benchmarks.hf_rollout import memory_bandwidth, weight_bytes
from lmrl.models.gpt import GPT, GPTConfig


def test_weight_bytes_counts_a_tied_embedding_once_and_uses_each_tensors_dtype():
    model = GPT(GPTConfig(vocab_size=10, n_position=8, n_layer=1, n_head=2, n_embd=8))
    distinct = sum(p.numel() for p in model.parameters())  # parameters() yields the tied matrix once
    assert model.lm_head.weight is model.wte.weight
    assert weight_bytes(model) == 4 * distinct
    assert weight_bytes(model.to(torch.bfloat16)) == 2 * distinct


def test_memory_bandwidth_is_bytes_over_seconds_of_a_real_pass():
    read, copy = memory_bandwidth(repeats=2, gib=1 / 64)
    assert 1e8 < read < 1e13 and 1e8 < copy < 1e13  # 16 MiB read in between 1.6 us and 0.16 s


def test_matmul_rate_is_flops_over_seconds_of_a_real_product():
    from benchmarks.hf_rollout import matmul_rate

    assert 1e8 < matmul_rate(n=128, repeats=2) < 1e14  # 4.2 MFLOP in between 42 ns and 42 ms
