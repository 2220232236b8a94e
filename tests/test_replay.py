"""Replay of failed prompts in RL (`train.replay_fraction`): part of each batch is drawn again from
the training problems the policy recently got wrong, never from held-out ones, and the buffer is
part of the trainer state. `ReplayBuffer` (lmrl/train/replay.py) on its own first, then in a run."""

import pytest
import torch

from lmrl.config import ConfigError
from lmrl.train.prompt_order import PromptDraws
from lmrl.train.replay import ReplayBuffer
from lmrl.train.rl_trainer import RLTrainer


def _uniform(n: int, generator: torch.Generator) -> torch.Tensor:
    """A stand-in for task.sample_train_ids: ids 100, 101, ... (n of them), drawing nothing."""
    return torch.arange(100, 100 + n)


def test_the_buffer_keeps_each_failed_problem_once_in_batch_order_up_to_its_capacity():
    replay = ReplayBuffer(capacity=4, fraction=0.5)
    assert replay.ids == []
    replay.add(torch.tensor([7, 7, 3, 3, 9, 9]), torch.tensor([1, 0, 1, 1, 0, 0]))  # groups of two completions
    assert replay.ids == [7, 9]  # 7 and 9 failed once or twice, each kept once; 3 was right both times
    replay.add(torch.tensor([9, 5]), torch.tensor([0, 1]))
    assert replay.ids == [7, 9, 9]  # a problem failed again in a later batch is appended again
    replay.add(torch.tensor([5, 6, 8]), torch.tensor([False, False, False]))
    assert replay.ids == [9, 5, 6, 8]  # [7, 9, 9, 5, 6, 8]: the last 4 (capacity) kept
    replay.add(torch.tensor([1, 2]), torch.ones(2))
    assert replay.ids == [9, 5, 6, 8]  # nothing failed: unchanged


def test_a_draw_takes_its_fraction_from_the_buffer_and_the_rest_uniformly():
    replay = ReplayBuffer(capacity=8, fraction=0.5)
    gen = torch.Generator().manual_seed(0)
    assert replay.draw(6, _uniform, gen).tolist() == [100, 101, 102, 103, 104, 105]  # empty: all uniform
    replay.ids = [7, 9, 4]
    ids = replay.draw(6, _uniform, torch.Generator().manual_seed(0))
    pick = torch.randint(3, (3,), generator=torch.Generator().manual_seed(0))  # the same generator's draw
    assert ids.tolist() == [100, 101, 102] + [[7, 9, 4][i] for i in pick.tolist()]  # 3 uniform, then 3 replayed
    replay.ids = [7, 9]  # fewer failed than the fraction asks: as many picks as it holds, the rest uniform
    assert replay.draw(6, _uniform, gen).tolist()[:4] == [100, 101, 102, 103]
    assert ReplayBuffer(8, 0.5, [7]).draw(6, _uniform, gen).tolist() == [100, 101, 102, 103, 104, 7]
    assert ReplayBuffer(8, 0.25, [7, 9]).draw(3, _uniform, gen).tolist() == [100, 101, 102]  # ⌊3 · 0.25⌋ = 0


def test_a_trainer_draws_its_batches_through_the_buffer(tiny_config):
    trainer = RLTrainer(tiny_config("train.replay_fraction=0.5"))
    failed = trainer.task.sample_train_ids(5, torch.Generator().manual_seed(0)).tolist()
    trainer.replay = ReplayBuffer(1024, 0.5, failed)  # what reinforce() builds from the trainer state
    trainer.prompt_draws = PromptDraws("random", n_train=0, seed=0, sample=trainer.task.sample_train_ids)
    ids = trainer.draw_prompts(8)
    assert len(ids) == 8 and set(ids[4:].tolist()) <= set(trainer.replay.ids)  # half from the buffer


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
