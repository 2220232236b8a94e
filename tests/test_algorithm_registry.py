"""A new policy-gradient algorithm is one class and one registry line: defined here, registered with
`@register_algorithm`, it is a valid `algo.name` at once and trains through the unchanged RLTrainer."""

import json
import math

import pytest
import torch

import lmrl
from lmrl.algos import ALGORITHMS, Algorithm, register_algorithm
from lmrl.algos.base import PreparedBatch
from lmrl.algos.losses import reinforce_loss
from lmrl.config import ConfigError, load_config


class BatchMeanReinforce(Algorithm):
    """REINFORCE with this batch's mean reward as the baseline: A = r − mean(r) (per position for
    token rewards), L = −mean_i Σ_t A_it · log π. No state, one on-policy pass per rollout."""

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        return [] if cfg.ppo_epochs == 1 else [f"algo.name={cfg.name} makes one pass: algo.ppo_epochs must be 1"]

    batches_prepared = 0  # counted, so a test sees the trainer ran this algorithm

    def prepare(self, learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        BatchMeanReinforce.batches_prepared += 1
        rewards = rewards.float().to(rollout.mask.device)
        advantages = rewards - rewards.mean(0)
        batch = PreparedBatch(rollout.sequences, rollout.mask, advantages, attention_mask=rollout.attention_mask)
        return batch, {"train/advantage_mean": advantages.mean().item()}

    def policy_loss(self, batch, logprobs, entropy, values):
        return reinforce_loss(logprobs, batch.advantages, batch.mask), {}


@pytest.fixture
def batch_mean_pg():
    """Registers the algorithm for one test (the registry is global: later tests see the built-ins only)."""
    register_algorithm("batch_mean_pg")(BatchMeanReinforce)
    yield "batch_mean_pg"
    del ALGORITHMS["batch_mean_pg"]


SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.n_position=16", "task.ndigit=2",
         "task.heldout_size=100", "task.reward=per_digit", "sft.steps=0", "train.steps=4", "train.rollout_size=32",
         "train.log_every=1", "train.eval_every=4", "train.ckpt_every=4", "eval.size=50", "eval.batch_size=50",
         "optim.lr=3e-3", "run.progress=false", "run.tensorboard=false", "run.threads=1"]


def test_a_registered_algorithm_trains_the_adder_through_rltrainer(batch_mean_pg, tmp_path):
    cfg = load_config("adder", SMALL + [f"algo.name={batch_mean_pg}", f"run.dir={tmp_path / 'run'}"])
    trainer = lmrl.RLTrainer(cfg)
    BatchMeanReinforce.batches_prepared = 0
    before = [p.detach().clone() for p in trainer.model.parameters()]
    summary = trainer.train()
    assert summary["steps_done"] == 4 and BatchMeanReinforce.batches_prepared == 4
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))


def test_a_registered_algorithm_is_a_config_choice_with_its_own_checks(batch_mean_pg):
    with pytest.raises(ConfigError, match=r"algo.name='batch_mean_p' is not one of .*batch_mean_pg; "
                                          r"did you mean 'batch_mean_pg'\?"):
        load_config("adder", ["algo.name=batch_mean_p"])
    with pytest.raises(ConfigError, match="algo.name=batch_mean_pg makes one pass: algo.ppo_epochs must be 1"):
        load_config("adder", [f"algo.name={batch_mean_pg}", "algo.ppo_epochs=2"])


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="algorithm 'grpo' is already registered"):
        register_algorithm("grpo")(BatchMeanReinforce)
