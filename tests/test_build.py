"""A run built in one place (lmrl/train/build.py): no trainer changes the config it is given, a Ray
worker builds the learner's initial policy, RL's warm-up trains with SFT's loss, and the reference
is a frozen copy (or a view, tested with LoRA in test_offline_trainers / test_hf_training)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lmrl.config import load_config
from lmrl.models.reference import build_reference, is_reference_view
from lmrl.train.build import NoScore, build_run, build_worker_parts, own_config
from lmrl.train.dpo_trainer import DPOTrainer
from lmrl.train.reward_trainer import RewardTrainer
from lmrl.train.rl_trainer import RLTrainer
from lmrl.train.sft_trainer import SFTTrainer, sft_loss
from lmrl.train.trainers import GRPOTrainer
from tests.conftest import TINY
from tests.test_offline_trainers import QUIET, data  # noqa: F401  (data: a fixture)


def _rl_config(*overrides):
    """The tiny adder without a run.dir: the trainer picks runs/<name> (under the test's cwd) and sets
    run.dir on its own copy."""
    tiny = [o for o in TINY if not o.startswith(("sft.steps=", "train.steps="))]
    return load_config("adder", tiny + ["run.name=t", "sft.steps=2", "train.steps=2", *overrides])


def _offline_config(data, trainer, *overrides):
    files = {"sft": ("sft.jsonl", "sft.jsonl"), "dpo": ("pairs.jsonl", "pairs_eval.jsonl"),
             "reward": ("pairs.jsonl", "pairs_eval.jsonl")}[trainer]
    return load_config(None, [f"run.trainer={trainer}", f"run.name={trainer}", "model.type=hf",
                              f"model.path={data / 'model'}", *QUIET, f"data.train_file={data / files[0]}",
                              f"data.eval_file={data / files[1]}", "data.batch_size=4", "data.max_length=64",
                              "train.max_steps=1", *overrides])


@pytest.mark.parametrize("kind", ["rl", "grpo", "sft", "dpo", "reward"])
def test_no_trainer_changes_the_config_it_is_given(kind, data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    cfg = {"rl": lambda: _rl_config(), "grpo": lambda: _rl_config("algo.name=reinforce", "algo.group_size=4"),
           "sft": lambda: _offline_config(data, "sft"), "dpo": lambda: _offline_config(data, "dpo"),
           "reward": lambda: _offline_config(data, "reward")}[kind]()
    before = copy.deepcopy(dataclasses.asdict(cfg))
    trainer_class = {"rl": RLTrainer, "grpo": GRPOTrainer, "sft": SFTTrainer, "dpo": DPOTrainer,
                     "reward": RewardTrainer}[kind]
    trainer = trainer_class(cfg)
    trainer.train()
    assert dataclasses.asdict(cfg) == before
    assert cfg.run.dir is None and trainer.config.run.dir == f"runs/{cfg.run.name}"  # set on the trainer's copy
    if kind == "grpo":
        assert trainer.config.algo.name == "grpo" and cfg.algo.name == "reinforce"


def test_own_config_is_a_deep_copy_with_the_trainers_name():
    cfg = load_config("adder", ["run.progress=false"])
    own = own_config(cfg, "sft")
    assert own.run.trainer == "sft" and cfg.run.trainer == "rl"
    own.model.n_layer += 1
    assert cfg.model.n_layer == own.model.n_layer - 1


def test_a_ray_worker_builds_the_learners_initial_policy_and_a_task_that_never_scores(tiny_config):
    cfg = tiny_config()
    learner = RLTrainer(cfg)  # builds after its own seeding, with the task first (the GPT is sized to it)
    worker = build_worker_parts(learner.config, "cpu")
    assert worker.task.heldout_ids.tolist() == learner.task.heldout_ids.tolist()
    mine, theirs = learner.model.state_dict(), worker.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    with pytest.raises(RuntimeError, match="rollout workers do not score"):
        NoScore()(["p"], ["c"])


def test_build_run_gives_the_same_parts_for_the_same_seed_and_others_for_another(tiny_config):
    cfg = own_config(tiny_config(), "rl")
    a, b = build_run(cfg, device="cpu"), build_run(cfg, device="cpu")
    assert a.tokenizer is a.task.tokenizer
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    cfg.run.seed += 1
    c = build_run(cfg, device="cpu")
    assert not torch.equal(next(a.model.parameters()), next(c.model.parameters()))


def test_the_warmups_loss_is_sfts_loss_bit_for_bit():
    """The warm-up's answers are every position of its logits (mask None); SFT picks response tokens by
    a mask. Both are the same token-mean cross-entropy: same value, same gradient, same accuracy."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, 11, generator=gen, requires_grad=True)
    targets = torch.randint(11, (6, 3), generator=gen)
    written_out = F.cross_entropy(logits.reshape(-1, 11).float(), targets.reshape(-1))
    (expected,) = torch.autograd.grad(written_out, logits)
    loss, correct = sft_loss(logits, targets)
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.equal(loss, written_out) and torch.equal(grad, expected)
    assert torch.equal(correct.view(6, 3).all(-1), (logits.argmax(-1) == targets).all(-1))
    masked, masked_correct = sft_loss(logits, targets, torch.ones(6, 3, dtype=torch.long))
    assert torch.equal(masked, loss) and torch.equal(masked_correct, correct)
    mask = torch.tensor([[0, 1, 1]] * 6)  # response tokens only: the mean over those
    part, part_correct = sft_loss(logits, targets, mask)
    assert torch.allclose(part, F.cross_entropy(logits[:, 1:].reshape(-1, 11), targets[:, 1:].reshape(-1)))
    assert part_correct.numel() == 12
    empty, none = sft_loss(logits, targets, torch.zeros(6, 3))
    assert empty.item() == 0.0 and empty.requires_grad and none.numel() == 0


def test_the_reference_of_a_policy_without_an_adapter_is_a_frozen_copy(tiny_config):
    model = build_run(own_config(tiny_config(), "rl"), device="cpu").model.train()
    reference = build_reference(model)
    assert reference is not model and not is_reference_view(reference) and not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in model.parameters()) and model.training  # the policy is untouched
