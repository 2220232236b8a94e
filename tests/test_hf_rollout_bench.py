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


def test_products_seconds_times_every_linear_layer_once_a_pass_at_the_batch_and_restores_them():
    from benchmarks.hf_rollout import products_seconds

    model = torch.nn.Sequential(torch.nn.Linear(512, 640), torch.nn.Linear(640, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 512))
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    calls = {i: [] for i in range(len(linears))}
    for i, layer in enumerate(linears):
        layer.register_forward_hook(lambda m, args, out, i=i: calls[i].append((tuple(args[0].shape), out.dtype)))
    for bf16 in (False, True):
        seconds = products_seconds(model, batch=5, bf16=bf16, repeats=3)
        assert 0 < seconds < 10
        for i, layer in enumerate(linears):  # one untimed pass, then 3 timed ones; fp32 in and out
            assert calls[i] == [((5, layer.in_features), torch.float32)] * 4
            calls[i].clear()
            assert "forward" not in vars(layer)  # the packed forwards are gone again
