"""Shared fixtures: a tiny arithmetic config that trains in a second or two on a CPU; torch at one thread."""

from __future__ import annotations

import pytest
import torch

from lmrl.config import load_config

# 2-digit addition on a 1-layer, 32-dim GPT: every stage runs in seconds. Per-digit token rewards, so
# advantages and losses are non-zero even though the model learns little.
TINY = [
    "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.n_position=16",
    "task.ndigit=2", "task.heldout_size=100", "task.reward=per_digit",
    "sft.steps=4", "sft.examples=40", "sft.batch_size=16", "sft.warmup_steps=1",
    "train.steps=6", "train.rollout_size=16", "train.log_every=1", "train.eval_every=3", "train.ckpt_every=2",
    "train.stopping_threshold=null",  # the preset's 99% stop is for the full job; tests set their own
    "run.mixed_precision=",  # fp32, so tests compare floats tightly; tests/test_mixed_precision.py runs bf16
    "eval.size=50", "eval.batch_size=50",
    "run.progress=false", "run.tensorboard=false", "run.threads=1",
]
# TINY without its warm-up keys, for runs with sft.steps=0 (the config refuses keys a run does not read)
TINY_NO_WARMUP = [o for o in TINY if not o.startswith("sft.")] + ["sft.steps=0"]


@pytest.fixture
def tiny_config(tmp_path):
    """`tiny_config(*overrides, dir=...)`: the adder preset shrunk by TINY (TINY_NO_WARMUP where the
    overrides skip the warm-up with sft.steps=0), in its own run dir."""

    def make(*overrides: str, dir=None):
        tiny = TINY_NO_WARMUP if "sft.steps=0" in overrides else TINY
        return load_config("adder", tiny + [f"run.dir={dir or tmp_path / 'run'}", *overrides])

    return make


@pytest.fixture
def one_thread():
    """torch at one thread for the test (tests comparing two computations' floats to a tight tolerance)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
