"""Rollout engines: the in-process engine is exactly the old direct call; the overlap engine samples
with a copy of the policy, one update behind, and the run records that staleness."""

from __future__ import annotations

import json

import pytest
import torch

from lmrl.algos import build_algorithm
from lmrl.config import ConfigError, load_config
from lmrl.generation.agent import AgentRollout
from lmrl.engines.local import LocalEngine, ThreadEngine, draw_seed, load_state_into, rollout_to, trainable_state
from lmrl.train.rl_trainer import RLTrainer
from lmrl.generation.sampling import Sampling

from .conftest import TINY


def _trainer(tiny_config, *overrides):
    trainer = RLTrainer(tiny_config("sft.steps=0", *overrides))
    return trainer, trainer.task.sample_train_ids(8, torch.Generator().manual_seed(0))


def test_local_engine_is_the_direct_rollout(tiny_config):
    trainer, ids = _trainer(tiny_config)
    engine = LocalEngine(trainer.task, trainer.model)
    got = engine.submit(ids, sampling=Sampling(), generator=torch.Generator().manual_seed(5)).result()
    want = trainer.task.rollout(trainer.model, ids, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got.rollout.completions, want.completions)
    assert torch.equal(got.rollout.logprobs, want.logprobs)
    assert torch.equal(got.ids, ids) and got.version == 0


def test_thread_engine_samples_with_its_own_seeded_copy_and_follows_sync(tiny_config):
    trainer, ids = _trainer(tiny_config)
    engine = ThreadEngine(trainer.task, trainer.model)
    try:
        gen = torch.Generator().manual_seed(3)
        seed = draw_seed(torch.Generator().manual_seed(3))  # the draw the engine makes from `gen`
        got = engine.submit(ids, sampling=Sampling(), generator=gen).result()
        want = trainer.task.rollout(trainer.model, ids, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got.rollout.completions, want.completions)
        assert torch.allclose(got.rollout.logprobs, want.logprobs)

        with torch.no_grad():  # the learner moves; the copy only follows on sync
            for p in trainer.model.parameters():
                p.add_(0.1)
        copy_param, learner_param = next(engine.model.parameters()), next(trainer.model.parameters())
        assert not torch.equal(copy_param, learner_param)
        engine.sync(trainer.model, version=1)
        assert torch.equal(copy_param, learner_param) and engine.version == 1
        assert engine.submit(ids, sampling=Sampling(), generator=gen).result().version == 1
    finally:
        engine.close()


def test_weight_state_round_trip_and_mismatch_message(tiny_config):
    trainer, _ = _trainer(tiny_config)
    other = RLTrainer(tiny_config("sft.steps=0", "run.seed=9", dir=trainer.run_dir.parent / "other")).model
    assert not torch.equal(next(other.parameters()), next(trainer.model.parameters()))
    load_state_into(other, trainable_state(trainer.model))
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), trainer.model.parameters()))
    with pytest.raises(KeyError, match="no parameter"):
        load_state_into(other, {"not.a.param": torch.zeros(1)})


def test_rollout_to_moves_tensors_and_keeps_episode_records():
    ro = AgentRollout(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), torch.zeros(2, 4),
                      torch.ones(2, 4), rewards=torch.tensor([1.0, -0.1]), infos=[{"a": 1}, {}],
                      transcripts=[[], []])
    moved = rollout_to(ro, "cpu")
    assert isinstance(moved, AgentRollout) and moved.infos == [{"a": 1}, {}]
    assert torch.equal(moved.rewards, ro.rewards)


def test_overlap_run_trains_one_step_off_policy_and_records_staleness(tiny_config, tmp_path):
    summary = RLTrainer(tiny_config("rollout.overlap=true")).train()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    staleness = [r["rollout/staleness"] for r in rows if "rollout/staleness" in r]
    # the first RL batch is sampled before any update; every later one while the previous trains
    assert staleness == [0.0] + [1.0] * (len(staleness) - 1) and len(staleness) == 6
    assert summary["steps_done"] == 6


def test_overlap_run_resumes(tiny_config, tmp_path):
    RLTrainer(tiny_config("rollout.overlap=true", "train.steps=4")).train()
    summary = RLTrainer(tiny_config("rollout.overlap=true", "run.resume=auto")).train()
    assert summary["steps_done"] == 6  # the batch in flight at the stop is sampled again, not lost steps
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows][-6:] == list(range(5, 11))


def test_stale_grpo_batch_takes_its_ratio_against_the_sampling_log_probs(tiny_config):
    trainer, ids = _trainer(tiny_config, "algo.name=grpo", "algo.group_size=2")
    cfg = trainer.config
    algo = build_algorithm(cfg.algo, temperature=1.0, ga_steps=1, max_new_tokens=trainer.task.max_new_tokens)
    trainer.module, trainer.reference = trainer.model, None
    ro = trainer.task.rollout(trainer.model, ids.repeat_interleave(2), generator=torch.Generator().manual_seed(0))
    rewards = torch.rand(len(ro))
    fresh, _ = algo.prepare(trainer, ro, rewards)
    assert fresh.old_logprobs is None  # on-policy, one pass: the ratio is 1 by construction
    ro.staleness = 1
    stale, _ = algo.prepare(trainer, ro, rewards)
    assert stale.old_logprobs is ro.logprobs


def test_scale_out_config_errors():
    with pytest.raises(ConfigError, match="distributed.backend=ray"):
        load_config("adder", TINY + ["rollout.workers=2"])
    with pytest.raises(ConfigError, match="rollout.workers >= 1"):
        load_config("adder", TINY + ["distributed.backend=ray"])
    with pytest.raises(ConfigError, match="model.type=hf"):
        load_config("adder", TINY + ["rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="fsdp"):
        load_config("adder", TINY + ["distributed.strategy=fsdp"])
    with pytest.raises(ConfigError, match="rollout.engine"):
        load_config("adder", TINY + ["rollout.engine=vlm"])
