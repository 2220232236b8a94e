"""Replay of failed prompts in RL (`train.replay_fraction`): part of each batch is drawn again from
the training problems the policy recently got wrong, never from held-out ones, and the buffer is
part of the trainer state."""

import pytest
import torch

from lmrl.config import ConfigError
from lmrl.train.rl_trainer import RLTrainer


def test_a_batch_draws_its_replay_share_from_the_failed_prompts(tiny_config):
    trainer = RLTrainer(tiny_config("train.replay_fraction=0.5"))
    assert len(trainer.draw_prompts(8)) == 8  # nothing failed yet: all uniform
    failed = trainer.task.sample_train_ids(5, torch.Generator().manual_seed(0)).tolist()
    trainer.state["replay"] = failed
    ids = trainer.draw_prompts(8)
    assert len(ids) == 8 and set(ids[4:].tolist()) <= set(failed)  # half from the buffer (with repeats)


def test_failures_are_kept_once_each_in_order_and_the_buffer_is_bounded(tiny_config):
    trainer = RLTrainer(tiny_config("train.replay_fraction=0.5", "train.replay_size=4"))
    ids = torch.tensor([7, 7, 3, 3, 9, 9])  # groups of two completions
    trainer.remember_failures(ids, torch.tensor([1, 0, 1, 1, 0, 0]))
    assert trainer.state["replay"] == [7, 9]  # 3 was right both times
    trainer.remember_failures(torch.tensor([5, 6, 8]), torch.zeros(3))
    assert trainer.state["replay"] == [9, 5, 6, 8]  # the last replay_size


def test_training_replays_failed_training_prompts_only(tiny_config, monkeypatch):
    trainer = RLTrainer(tiny_config("train.replay_fraction=0.5", "train.steps=3"))
    uniform = []
    draw = trainer.task.sample_train_ids
    monkeypatch.setattr(trainer.task, "sample_train_ids", lambda n, g: uniform.append(n) or draw(n, g))
    trainer.train()
    replay = trainer.state["replay"]
    assert replay and not set(replay) & set(trainer.task.heldout_ids.tolist())
    rl_draws = uniform[-3:]  # the three RL batches of 16 (the warm-up drew its labels first)
    assert rl_draws[0] == 16 and rl_draws[1:] == [8, 8]  # once something failed, half the batch is replayed


def test_replay_fraction_out_of_range_is_refused(tiny_config):
    with pytest.raises(ConfigError, match="train.replay_fraction"):
        tiny_config("train.replay_fraction=1")
