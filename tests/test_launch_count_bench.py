"""benchmarks/launch_count.py counts what it says: every aten call and the host syncs among them, and
its per-layer split is the difference between two depths."""

import argparse
import collections

import pytest
import torch

from benchmarks.launch_count import SYNC_OPS, OpCount, count_step, per_layer


def test_every_aten_call_and_each_host_sync_is_counted_in_and_out_of_inference_mode():
    with OpCount() as mode:
        x = torch.ones(4)
        y = (x * 2).sum()
        int(y)
        with torch.inference_mode():
            z = torch.ones(3)
            int(z.sum())
            bool((z > 0).any())
    ops = mode.ops
    assert ops["aten.ones"] == 2 and ops["aten.mul"] == 1 and ops["aten.sum"] == 2
    assert sum(ops[name] for name in SYNC_OPS) == 3  # int(y), int(z.sum()), bool(...)


def test_per_layer_is_the_slope_between_two_depths_and_fixed_what_remains():
    """2 layers: 10 fixed + 2 x 30 per layer = 70 ops over 5 steps; 6 layers: 10 + 6 x 30 = 190."""
    small = collections.Counter({"aten.mm": 5 * 60, "aten.add": 5 * 10, "aten._local_scalar_dense": 5})
    large = collections.Counter({"aten.mm": 5 * 180, "aten.add": 5 * 10, "aten._local_scalar_dense": 5})
    layer, fixed, syncs = per_layer(small, large, (2, 6), 5)
    assert layer == 30 and fixed == 11 and syncs == 1  # the sync is an op too: 10 + 1


@pytest.mark.slow  # four one-step GRPO runs
def test_unmerged_lora_adapters_add_operations_to_every_decode_step_and_update(tmp_path):
    args = argparse.Namespace(rows=16, group=4, ga_steps=2, new_tokens=8)
    counts = {r: {n: count_step(tmp_path, n, args, lora_r=r, checkpointing=False, static=False) for n in (2, 6)}
              for r in (0, 8)}
    for phase, per in (("rollout", args.new_tokens), ("update", args.ga_steps)):
        full = per_layer(counts[0][2][phase], counts[0][6][phase], (2, 6), per)[0]
        lora = per_layer(counts[8][2][phase], counts[8][6][phase], (2, 6), per)[0]
        assert lora > full + 7 * 3, (phase, lora, full)  # seven adapted projections, a few ops each at least
