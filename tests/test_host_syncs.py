"""How often one RL step reads tensor values back into Python: on a GPU each such read (`item`,
`tolist`, `cpu`, `numpy`, a tensor in `if`, `float()`, `int()` or as a list index) waits for the
device to finish its queued work (a host-device sync). Counted here on the CPU with the methods
wrapped, over one RL step of the adder preset (no evaluation or checkpoint due), and pinned: a change
that adds a read to the step's hot path fails this test until the number below (and its line in
docs/architecture.md, "Host-device syncs") is updated on purpose.

Reads of host copies are not counted: a counted `.cpu()` returns a fresh copy here, as it does from a
GPU, and reading it (or a row of it) later costs nothing."""

from __future__ import annotations

import collections
import traceback

import pytest
import torch

from lmrl.config import load_config
from lmrl.train.rl_trainer import RLTrainer

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")

# One RL step of the adder preset (REINFORCE, per-digit rewards, one micro-batch, weight average on):
# where the step reads tensor values, by the function that reads (see docs/architecture.md).
EXPECTED = {
    "batch": 2,  # the prompts' operands from the prompt ids (host tensors in a GPU run too: no sync there)
    "score_rollout": 2,  # the verifier's host copy of prompts and completions (arithmetic is checked on the host)
    "rollout_metrics": 14,  # the logged rollout statistics: 6 sums, then 3 all-reduced vectors (sums, squared
                            # deviations, length extremes) of which 5 values are read one by one
    "prepare": 4,  # REINFORCE: the all-reduced batch mean, the advantages (the moving baseline is a host list),
                   # the new baseline, the mean advantage for the log
    "update": 1,  # the update loop: which rows run (`algo.skip_zero_advantage`), once per minibatch
    "loss": 3,  # per micro-batch: policy loss, entropy and token entropy for the log
    "guarded_step": 4,  # per optimizer step: loss and gradient finite (2), every rank's verdict, the norm
    "optimizer_step": 1,  # per optimizer step: the loss for the log
}


class ReadCounter:
    """Counts reads of tensor values while `active`, by the lmrl function that made them."""

    def __init__(self):
        self.active, self.by_function, self.host = False, collections.Counter(), set()
        self.keep: list[torch.Tensor] = []  # host copies, kept alive so their ids stay theirs

    def wrap(self, name):
        original = getattr(torch.Tensor, name)

        def read(tensor, *args, **kwargs):
            base = tensor._base
            if not self.active or id(tensor) in self.host or (base is not None and id(base) in self.host):
                return original(tensor, *args, **kwargs)
            caller = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/lmrl/" in f.filename)
            self.by_function[caller.name] += 1
            out = original(tensor, *args, **kwargs)
            if name == "cpu":  # from a GPU this is a new tensor on the host: reading it later costs nothing
                out = out.clone()
                self.host.add(id(out))
                self.keep.append(out)
            return out

        return read


@pytest.fixture
def counter(monkeypatch):
    found = ReadCounter()
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, found.wrap(name))
    return found


@pytest.mark.parametrize("sampling", [[], ["train.min_p=0.05", "train.repetition_penalty=1.2", "train.top_p=0.9"]],
                         ids=["plain", "min_p-penalty-top_p"])
def test_one_rl_step_of_the_adder_reads_tensor_values_a_pinned_number_of_times(tmp_path, counter, sampling):
    """The sampling options (the penalty's seen-token mask included) read nothing back."""
    cfg = load_config("adder", ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "sft.steps=2",
                                "sft.examples=64", "train.steps=3", "train.rollout_size=16", "train.log_every=1",
                                "train.eval_every=1000", "train.ckpt_every=1000", "eval.size=16",
                                "run.progress=false", "run.tensorboard=false", "run.threads=1", f"run.dir={tmp_path}",
                                *sampling])
    trainer = RLTrainer(cfg)
    rl_step, calls = trainer.rl_step, []

    def counted_step(stage):
        calls.append(stage)
        counter.active = len(calls) == 2  # the second RL step: nothing of the first one's set-up
        try:
            rl_step(stage)
        finally:
            counter.active = False

    trainer.rl_step = counted_step
    trainer.train()
    assert len(calls) == 3
    assert dict(counter.by_function) == EXPECTED, sorted(counter.by_function.items())
    assert sum(counter.by_function.values()) == 31
