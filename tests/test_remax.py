"""ReMax: the advantages by hand (KL-shaped token rewards, a row with a hole, an unscored baseline),
the trainer's greedy baseline against greedy decoding done here, the config errors, a run on the
loop and an exact resume."""

import copy
import json
import signal

import pytest
import torch
from torch.testing import assert_close

from lmrl import checkpoint as ckpt
from lmrl.algos import build_algorithm
from lmrl.algos.advantages import discounted_returns, greedy_baseline_advantages, token_level_rewards
from lmrl.algos.base import policy_forward
from lmrl.algos.remax import ReMax
from lmrl.config import ConfigError, load_config
from lmrl.train.rl_trainer import RLTrainer

from .conftest import TINY
from .test_algorithms import Stub
from .test_reinforce_pp import _rollout, _tiny_gpt
from .test_resume import run_child, stable_metrics

T = torch.tensor
NAN = float("nan")


def test_advantages_are_the_kl_shaped_returns_minus_the_greedy_reward_on_every_valid_token():
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # row 1: an observation token; row 2 ended early
    kl = T([[0.1, 0.2, 0.3], [0.4, 9.0, 0.5], [0.2, 0.2, 7.0]])
    token = token_level_rewards(T([1.0, 0.0, 2.0]), mask) - 0.5 * kl * mask  # β = 0.5
    # row 0: r = [-0.05, -0.1, 0.85], R = [0.7, 0.75, 0.85]; row 1: r = [-0.2, 0, -0.25], R = [-0.45, 0, -0.25];
    # row 2: r = [-0.1, 1.9, 0], R = [1.8, 1.9, 0]
    returns = discounted_returns(token, mask)
    assert_close(returns, T([[0.7, 0.75, 0.85], [-0.45, 0.0, -0.25], [1.8, 1.9, 0.0]]))
    advantages = greedy_baseline_advantages(returns, mask, T([0.5, 1.0, 2.0]))
    assert_close(advantages, T([[0.2, 0.25, 0.35], [-1.45, 0.0, -1.25], [-0.2, -0.1, 0.0]]))


def test_a_row_whose_greedy_completion_went_unscored_has_advantage_zero():
    returns, mask = T([[1.0, 1.0], [2.0, 1.0]]), T([[1.0, 1.0], [1.0, 1.0]])
    advantages = greedy_baseline_advantages(returns, mask, T([NAN, 0.5]))
    assert_close(advantages, T([[0.0, 0.0], [1.5, 0.5]]))


def test_with_per_token_rewards_each_token_is_measured_against_the_greedy_return_from_its_position():
    returns, mask = T([[2.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    greedy = T([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])  # a greedy answer one position longer
    # γ = 1: its returns from each position are [3, 2, 2, 1] and [1, 1, 0, 0], the first 3 of them baselines
    assert_close(greedy_baseline_advantages(returns, mask, greedy), T([[-1.0, -1.0, -1.0], [0.0, -1.0, 0.0]]))
    # γ = 0.5: row 0's greedy returns are [1 + 0.5·0.75, 0 + 0.5·1.5, 1 + 0.5·1, 1] = [1.375, 0.75, 1.5, 1]
    assert_close(greedy_baseline_advantages(returns, mask, greedy, 0.5)[0], T([0.625, 0.25, -0.5]))
    # a shorter greedy answer: the positions past its end have baseline 0; an unscored one: advantage 0
    short = T([[1.0], [NAN]])
    assert_close(greedy_baseline_advantages(returns, mask, short), T([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


class Greedy(Stub):
    """A Learner whose greedy baseline is given."""

    def __init__(self, model, baseline, reference=None):
        super().__init__(model, reference)
        self.baseline = baseline

    def greedy_rewards(self):
        return self.baseline


def _algo(*overrides):
    return build_algorithm(load_config("adder", TINY + ["algo.name=remax", *overrides]).algo, max_new_tokens=3)


def test_every_completion_of_a_group_is_measured_against_its_prompts_one_greedy_reward():
    model = _tiny_gpt()
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])  # row 1 ended after two tokens
    baseline = T([0.5, 1.0]).repeat_interleave(4)
    batch, metrics = _algo("algo.group_size=4").prepare(Greedy(model, baseline), ro, rewards)
    assert_close(batch.advantages, (rewards - baseline)[:, None] * ro.mask)  # no whitening, no group statistics
    assert batch.advantages[1].tolist() == [-0.5, -0.5, 0.0]
    assert "train/advantage_mean" in metrics and "train/return_mean" in metrics


def test_with_the_kl_in_the_reward_the_advantages_are_verls_remax():
    model, reference = _tiny_gpt(0), _tiny_gpt(1)
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    baseline = T([0.5, 0.75]).repeat_interleave(4)
    algo = _algo("algo.group_size=4", "algo.kl_coef=0.1", "algo.kl_in_reward=true", "algo.kl_estimator=k1")
    batch, _ = algo.prepare(Greedy(model, baseline, reference), ro, rewards)
    with torch.no_grad():
        ref_logp, _, _ = policy_forward(reference, ro.sequences, 3)
    # verl's compute_remax_outcome_advantage on its KL-shaped token rewards, written out: returns are the
    # reversed cumulative sum of the masked rewards, the baseline comes off every valid token
    mask = ro.mask.float()
    token = -0.1 * (ro.logprobs - ref_logp) * mask
    token[torch.arange(8), mask.sum(1).long() - 1] += rewards
    returns = (token * mask).flip(1).cumsum(1).flip(1)
    assert_close(batch.advantages, (returns - baseline[:, None]) * mask, rtol=1e-5, atol=1e-6)
    assert len(set(batch.advantages[0].tolist())) == 3, "the per-token KL gives each token its own advantage"


def test_rows_without_a_greedy_reward_have_advantage_zero_and_stay_out_of_the_whitening():
    model = _tiny_gpt()
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    baseline = T([NAN, 0.25]).repeat_interleave(4)
    batch, _ = _algo("algo.group_size=4").prepare(Greedy(model, baseline), ro, rewards)
    assert batch.advantages[:4].eq(0).all()
    assert_close(batch.advantages[4:], (rewards[4:] - 0.25)[:, None] * ro.mask[4:])
    whitened, _ = _algo("algo.group_size=4", "algo.normalize_advantages=true").prepare(Greedy(model, baseline), ro,
                                                                                       rewards)
    assert whitened.advantages[:4].eq(0).all()
    valid = whitened.advantages[4:][ro.mask[4:].bool()]  # the rows with a baseline: mean 0, std 1 among themselves
    assert abs(valid.mean().item()) < 1e-6 and abs(valid.std(unbiased=False).item() - 1) < 1e-4


def _recorded_remax_run(tiny_config, monkeypatch, *overrides, **trainer_kwargs):
    """A remax run on the tiny adder, trained; with, for each prepared batch, the greedy baseline the
    learner gave, a copy of the policy as it was then, and whether the trainer's generators had moved
    since the last rollout was asked for; and the prompts each rollout drew."""
    trainer = RLTrainer(tiny_config("sft.steps=0", "algo.name=remax", *overrides), **trainer_kwargs)
    seen = {"drawn": [], "prepared": [], "states": []}
    draw, submit, prepare = trainer.draw_prompts, trainer._submit_rollout, ReMax.prepare

    def states():
        return [g.get_state() for g in trainer.generators.values()]

    def submit_and_note(n):
        pending = submit(n)
        seen["states"].append(states())
        return pending

    def recording_prepare(self, learner, rollout, rewards):
        unmoved = all(torch.equal(a, b) for a, b in zip(states(), seen["states"][-1]))
        seen["prepared"].append((learner.greedy_rewards().clone(), copy.deepcopy(learner.module), unmoved))
        return prepare(self, learner, rollout, rewards)

    monkeypatch.setattr(trainer, "draw_prompts", lambda n: seen["drawn"].append(draw(n)) or seen["drawn"][-1])
    monkeypatch.setattr(trainer, "_submit_rollout", submit_and_note)
    monkeypatch.setattr(ReMax, "prepare", recording_prepare)
    trainer.train()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, seen, rows


def test_with_overlap_the_greedy_decode_comes_before_the_next_batch_is_handed_to_the_sampler(tiny_config,
                                                                                               monkeypatch):
    trainer = RLTrainer(tiny_config("sft.steps=0", "algo.name=remax", "rollout.overlap=true", "train.steps=3"))
    events = []
    submit, greedy = trainer._submit_rollout, trainer.decode_greedy_baseline
    monkeypatch.setattr(trainer, "_submit_rollout", lambda n: events.append("sample") or submit(n))
    monkeypatch.setattr(trainer, "decode_greedy_baseline", lambda ids, stage: events.append("greedy") or
                        greedy(ids, stage))
    trainer.train()
    # the first batch, then each step's greedy decode before the next batch (none after the last step)
    assert events == ["sample", "greedy", "sample", "greedy", "sample", "greedy"]


@pytest.mark.parametrize("group_size, overlap", [(1, False), (4, False), (4, True)])
def test_the_baseline_is_the_reward_of_a_greedy_completion_of_each_prompt(tiny_config, monkeypatch, group_size,
                                                                          overlap):
    trainer, seen, rows = _recorded_remax_run(tiny_config, monkeypatch, f"algo.group_size={group_size}",
                                              f"rollout.overlap={overlap}", "train.steps=2")
    baseline, policy, generators_unmoved = seen["prepared"][0]
    ids = seen["drawn"][0]
    assert len(ids) == 16 // group_size
    ro = trainer.task.rollout(policy, ids, greedy=True)
    rewards, _, _ = trainer.task.score_rollout(ids, ro)
    assert rewards.dim() == 2  # per-digit token rewards: the baseline keeps them, one row per completion
    assert_close(baseline, rewards.repeat_interleave(group_size, 0))
    assert generators_unmoved, "greedy decoding drew from the trainer's generators"
    logged = [r["train/baseline_reward"] for r in rows if "train/baseline_reward" in r]
    assert len(logged) == 2 and logged[0] == pytest.approx(rewards.sum(1).mean().item())  # the sequence reward


def test_the_greedy_completions_reward_function_metrics_stay_out_of_the_steps(tiny_config, monkeypatch):
    def ones(completions, log_metric, **_):
        log_metric("scored", len(completions))
        return [float(c.count("1")) for c in completions]

    _, seen, rows = _recorded_remax_run(tiny_config, monkeypatch, "algo.group_size=4", "train.steps=1",
                                        reward_funcs=ones)
    step = next(r for r in rows if "train/baseline_reward" in r)
    assert step["scored"] == 16  # the sampled batch's 16 completions alone, not averaged with the 4 greedy ones
    assert step["train/baseline_reward"] == pytest.approx(seen["prepared"][0][0].mean().item())


def test_a_remax_run_trains_the_adder_and_changes_the_weights(tiny_config):
    trainer = RLTrainer(tiny_config("sft.steps=0", "algo.name=remax", "algo.group_size=2", "train.steps=3",
                                    "algo.kl_coef=0.05", "algo.kl_in_reward=true"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    summary = trainer.train()
    assert summary["steps_done"] == 3 and 0 <= summary["final_accuracy"] <= 1
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/policy_loss" in r]
    assert len(steps) == 3
    assert all(v == v for r in steps for v in r.values() if isinstance(v, float)), "a metric is NaN"
    assert all("train/baseline_reward" in r and "rollout/kl" in r for r in steps)
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))


@pytest.mark.parametrize("overrides, message", [
    (["algo.group_size=2", "algo.dynamic_sampling=true"],
     "algo.dynamic_sampling=true drops groups whose rewards tie, which teach nothing against a group's mean; "
     "algo.name=remax measures them against the greedy completion, so they do (set algo.dynamic_sampling=false)"),
    (["algo.adv_mode=grpo_no_std"], "algo.adv_mode=grpo_no_std is for grpo's group advantage; algo.name=remax "
                                    "measures each completion against its prompt's greedy completion (leave it at "
                                    "grpo)"),
    (["algo.adv_eps=0.01"], "algo.adv_eps=0.01 is for grpo's group advantage"),
    (["algo.scale_rewards=none"], "algo.scale_rewards=none is for grpo's group advantage"),
    (["algo.lam=0.9"], "algo.lam=0.9 sets the lambda of ppo's GAE; algo.name=remax has no value model"),
])
def test_options_remax_does_not_read_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("adder", TINY + ["algo.name=remax", *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_remax_reads_the_discount_the_group_size_and_whitening():
    cfg = load_config("adder", TINY + ["algo.name=remax", "algo.gamma=0.9", "algo.group_size=1",
                                       "algo.normalize_advantages=true"]).algo
    assert (cfg.gamma, cfg.group_size, cfg.normalize_advantages) == (0.9, 1, True)


def test_a_remax_run_killed_with_sigkill_resumes_exactly(tmp_path):
    args = TINY + ["train.steps=8", "algo.name=remax", "algo.group_size=2"]
    reference = run_child(args + [f"run.dir={tmp_path / 'ref'}"], kill_at=-1)
    assert reference.returncode == 0, reference.stderr
    killed_dir = tmp_path / "killed"
    killed = run_child(args + [f"run.dir={killed_dir}"], kill_at=9)
    assert killed.returncode == -signal.SIGKILL
    assert ckpt.latest_checkpoint(killed_dir / "checkpoints").name == "step_8"
    resumed = run_child(args + [f"run.dir={killed_dir}", "run.resume=auto"], kill_at=-1)
    assert resumed.returncode == 0, resumed.stderr
    assert stable_metrics(killed_dir) == stable_metrics(tmp_path / "ref")
