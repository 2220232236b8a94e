"""The algorithm classes on the real loop: one metric vocabulary, the config errors, and the
identity that ties GRPO back to the plain policy gradient."""

import json

import pytest
import torch

from lmrl.algos import build_algorithm
from lmrl.algos.base import policy_forward
from lmrl.algos.losses import aggregate
from lmrl.config import ConfigError, load_config
from lmrl.models.gpt import GPT, GPTConfig
from lmrl.generation.rollout import sample
from lmrl.train.rl_trainer import RLTrainer

from .conftest import TINY

VOCABULARY = ["train/policy_loss", "train/entropy", "train/clip_frac", "train/approx_kl", "train/advantage_mean",
              "train/grad_norm", "rollout/reward_mean", "rollout/length_mean", "train/lr", "train/accuracy"]
ALGOS = {
    "reinforce": [],
    "rloo": ["algo.name=rloo", "algo.group_size=4"],
    # TRL's RLOOTrainer, as lmrl.trl.RLOOConfig translates it (with a second pass, so the ratio moves)
    "rloo-trl": ["algo.name=rloo", "algo.group_size=2", "algo.ratio_level=sequence_sum", "algo.loss_level=sequence",
                 "algo.kl_coef=0.05", "algo.kl_in_reward=true", "algo.kl_estimator=k1", "algo.ppo_epochs=2",
                 "algo.normalize_advantages=true", "reward.clip=[0.0,0.5]"],
    "grpo": ["algo.name=grpo", "algo.group_size=4", "algo.kl_coef=0.05", "algo.ppo_epochs=2", "algo.minibatch_size=8"],
    "ppo": ["algo.name=ppo", "algo.value_model=head", "algo.ppo_epochs=2", "algo.minibatch_size=8",
            "algo.kl_coef=0.05", "algo.kl_in_reward=true"],
    "ppo-separate": ["algo.name=ppo", "algo.value_model=separate", "algo.ent_coef=0.01", "task.reward=digits"],
    "reinforce_plus_plus": ["algo.name=reinforce_plus_plus", "algo.kl_coef=0.05", "algo.kl_in_reward=true",
                            "algo.kl_estimator=k1"],
    "reinforce_plus_plus_baseline": ["algo.name=reinforce_plus_plus_baseline", "algo.group_size=4",
                                     "algo.ppo_epochs=2", "algo.minibatch_size=8"],
    "remax": ["algo.name=remax", "algo.group_size=2", "algo.kl_coef=0.05", "algo.ppo_epochs=2",
              "algo.minibatch_size=8"],
}


def rl_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "rollout/reward_mean" in r]


@pytest.mark.parametrize("name", ALGOS)
def test_every_algorithm_trains_on_the_loop_and_logs_one_vocabulary(tiny_config, name):
    cfg = tiny_config(*ALGOS[name], "train.steps=3", "train.eval_every=3")
    summary = RLTrainer(cfg).train()
    assert summary["rl_steps"] == 3 and 0 <= summary["final_accuracy"] <= 1
    rows = rl_rows(cfg.run_dir)
    assert len(rows) == 3
    expected = [k for k in VOCABULARY if not (name == "reinforce" and k in ("train/clip_frac", "train/approx_kl"))]
    if name.startswith("ppo"):
        expected += ["train/value_loss", "train/explained_variance"]
    if "kl_coef" in " ".join(ALGOS[name]):
        expected += ["train/kl", "rollout/kl"]
    for row in rows:
        missing = [k for k in expected if k not in row]
        assert not missing, f"{name} did not log {missing}"
        assert all(v == v for v in row.values() if isinstance(v, float)), f"{name} logged NaN: {row}"
    if name.startswith("ppo"):
        ckpts = sorted((cfg.run_dir / "checkpoints").glob("step_*"))
        assert (ckpts[-1] / "value.safetensors").is_file()


def test_several_minibatches_and_epochs_make_several_optimizer_steps(tiny_config, monkeypatch):
    cfg = tiny_config(*ALGOS["grpo"], "train.steps=1", "sft.steps=0")
    trainer = RLTrainer(cfg)
    calls = []
    step = trainer.optimizer_step
    monkeypatch.setattr(trainer, "optimizer_step", lambda loss: calls.append(1) or step(loss))
    trainer.train()
    assert len(calls) == 2 * (16 // 8)  # ppo_epochs × rollout_size / minibatch_size


class Stub:
    """The smallest Learner: one process, no optimizer (the test reads the gradients)."""

    distributed = False

    def __init__(self, model, reference=None):
        self.train_model = self.module = model
        self.reference = reference
        self.generators = {"data": torch.Generator().manual_seed(0)}

    def optimizer_step(self, loss):
        return {"loss": loss.item()}

    def no_sync(self, sync):
        from contextlib import nullcontext
        return nullcontext()

    def all_reduce_sum(self, t):
        return t


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=12, n_position=16, n_layer=1, n_head=2, n_embd=16))


@pytest.mark.parametrize("overrides", [["algo.name=grpo", "algo.group_size=4"], ["algo.name=reinforce"],
                                       ["algo.name=reinforce_plus_plus"], ["algo.name=ppo", "algo.value_model=head"]])
def test_with_the_kl_in_the_reward_the_shaped_reward_is_logged_as_verls_critic_rewards(overrides):
    from lmrl.models.reference import build_reference
    from lmrl.models.heads import ActorCritic

    model = _tiny_gpt()
    cfg = load_config("adder", [*overrides, "train.rollout_size=8", "algo.kl_coef=0.5", "algo.kl_in_reward=true",
                                "algo.kl_estimator=k1"]).algo
    ro = sample(model, torch.randint(12, (2, 5)).repeat_interleave(4, 0), 3, generator=torch.Generator().manual_seed(1))
    reference = build_reference(model)
    with torch.no_grad():  # the policy moves away from its reference, so the KL is not 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ro.logprobs, _, _ = policy_forward(model, ro.sequences, 3)
    ro.logprobs = ro.logprobs.detach()
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    learner = Stub(ActorCritic(model, "head") if cfg.name == "ppo" else model, reference)
    _, metrics = build_algorithm(cfg, max_new_tokens=3).prepare(learner, ro, rewards)
    # k1 summed over a completion is rollout/kl's per-completion KL: the shaped mean is r − β·KL on average
    assert metrics["rollout/kl"] != 0
    assert metrics["train/shaped_reward_mean"] == pytest.approx(rewards.mean().item() - 0.5 * metrics["rollout/kl"],
                                                                abs=1e-5)
    if cfg.name in ("ppo", "reinforce_plus_plus"):
        assert "train/return_mean" in metrics


def test_one_grpo_step_with_one_epoch_and_no_active_clip_is_the_plain_policy_gradient():
    model = _tiny_gpt()
    cfg = load_config("adder", ["algo.name=grpo", "algo.group_size=4", "train.rollout_size=8"]).algo
    prompts = torch.randint(12, (2, 5)).repeat_interleave(4, 0)
    ro = sample(model, prompts, 3, generator=torch.Generator().manual_seed(1))
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])

    algo, learner = build_algorithm(cfg, max_new_tokens=3), Stub(model)
    algo.update(learner, *algo.prepare(learner, ro, rewards))
    grpo_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    groups = rewards.view(2, 4)
    advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)  # TRL eps
    logp, _, _ = policy_forward(model, ro.sequences, 3)
    (-aggregate(logp * advantages[:, None], ro.mask, "token")).backward()
    for got, want in zip(grpo_grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("overrides, key", [
    (["algo.loss_level=tokens"], "algo.loss_level"),
    (["algo.name=grpo", "algo.group_size=1"], "algo.group_size"),
    (["algo.name=rloo"], "algo.group_size"),
    (["algo.name=grpo", "algo.group_size=4", "algo.ppo_epochs=0"], "algo.ppo_epochs"),
    (["algo.name=ppo"], "algo.value_model"),
    (["algo.name=grpo", "algo.group_size=4", "algo.value_model=head"], "algo.value_model"),
    (["algo.name=reinforce", "algo.value_model=separate"], "algo.value_model"),
    (["algo.name=grpo", "algo.group_size=4", "algo.critic_lr=1e-5"], "algo.critic_lr=1e-05 is for ppo's critic"),
    (["algo.name=grpo", "algo.group_size=3", "train.rollout_size=16"], "algo.group_size"),
    (["algo.name=reinforce", "algo.ppo_epochs=2"], "algo.ppo_epochs"),
    (["algo.name=grpo", "algo.group_size=4", "algo.kl_estimator=k4"], "algo.kl_estimator"),
])
def test_incompatible_algorithm_options_fail_at_config_time_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config("adder", TINY + overrides)


def test_the_reference_is_only_built_when_the_kl_coefficient_is_positive(tiny_config, tmp_path):
    for kl, has_ref in [("0", False), ("0.1", True)]:
        cfg = tiny_config("algo.name=grpo", "algo.group_size=4", f"algo.kl_coef={kl}", "train.steps=1",
                          dir=tmp_path / f"kl{kl}")
        trainer = RLTrainer(cfg)
        trainer.train()
        assert (trainer.reference is not None) == has_ref
        ckpt = sorted((cfg.run_dir / "checkpoints").glob("step_*"))[-1]
        assert (ckpt / "reference.safetensors").is_file() == has_ref


def test_trainers_named_after_an_algorithm_set_it_and_revalidate(tiny_config):
    from lmrl import GRPOTrainer, PPOTrainer

    trainer = GRPOTrainer(tiny_config("algo.group_size=4"))
    assert trainer.config.algo.name == "grpo"
    with pytest.raises(ConfigError, match="algo.group_size"):
        GRPOTrainer(tiny_config())  # the adder preset samples each prompt once
    with pytest.raises(ConfigError, match="algo.value_model"):
        PPOTrainer(tiny_config())


# -- completions whose advantage is 0 are left out of the update's pass ----------------------------

def _assert_same_gradients(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def _update(model, overrides, rollout, rewards, *, ga_steps=1, learner=None):
    """One `Algorithm.prepare` and `update`; (gradients, the batch size of every forward pass with gradients,
    metrics)."""
    model.zero_grad(set_to_none=True)
    cfg = load_config("adder", ["train.rollout_size=8", *overrides]).algo
    rows = []

    def count(module, args):
        if torch.is_grad_enabled():
            rows.append(args[0].size(0))

    hook = model.register_forward_pre_hook(count)
    try:
        algo, learner = build_algorithm(cfg, max_new_tokens=3, ga_steps=ga_steps), learner or Stub(model)
        metrics = algo.update(learner, *algo.prepare(learner, rollout, rewards))
    finally:
        hook.remove()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()], rows, metrics


def _rollout(model, mask_rows=()):
    prompts = torch.randint(12, (2, 5), generator=torch.Generator().manual_seed(2)).repeat_interleave(4, 0)
    ro = sample(model, prompts, 3, generator=torch.Generator().manual_seed(1))
    for row, valid in mask_rows:  # shorter completions: token-level normalisers differ from row counts
        ro.mask[row, valid:] = 0
    return ro


# group 1 scored alike (advantage 0 under grpo and rloo), group 2 did not
SPLIT = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.0])


@pytest.mark.parametrize("overrides, ga_steps", [
    (["algo.name=grpo", "algo.group_size=4"], 1),
    (["algo.name=grpo", "algo.group_size=4", "algo.loss_level=sequence"], 2),
    (["algo.name=grpo", "algo.group_size=4", "algo.loss_level=constant"], 2),
    (["algo.name=grpo", "algo.group_size=4", "algo.ppo_epochs=2", "algo.minibatch_size=4"], 2),
    (["algo.name=rloo", "algo.group_size=4"], 2),
])
def test_completions_with_zero_advantage_leave_the_pass_and_the_gradient_is_the_same(overrides, ga_steps):
    model = _tiny_gpt()
    ro = _rollout(model, mask_rows=[(4, 1), (6, 2)])
    dense, dense_rows, dense_metrics = _update(model, [*overrides, "algo.skip_zero_advantage=false"], ro, SPLIT,
                                               ga_steps=ga_steps)
    sparse, sparse_rows, sparse_metrics = _update(model, overrides, ro, SPLIT, ga_steps=ga_steps)
    _assert_same_gradients(sparse, dense)
    assert dense_metrics["train/update_fraction"] == 1.0
    if "algo.minibatch_size=4" in overrides:  # random minibatches: one may hold none of group 2 (one row runs)
        assert sum(dense_rows) / 2 <= sum(sparse_rows) < sum(dense_rows)
    else:  # only the group that did not score alike ran
        assert sum(sparse_rows) * 2 == sum(dense_rows) and sparse_metrics["train/update_fraction"] == 0.5


def test_a_completion_with_no_valid_token_leaves_the_pass_whatever_its_advantage():
    model = _tiny_gpt()
    ro = _rollout(model, mask_rows=[(5, 0)])  # as algo.mask_truncated_completions leaves a cut-off completion
    dense, _, _ = _update(model, ["algo.name=grpo", "algo.group_size=4", "algo.skip_zero_advantage=false"], ro, SPLIT)
    sparse, rows, _ = _update(model, ["algo.name=grpo", "algo.group_size=4"], ro, SPLIT)
    assert rows == [3]
    _assert_same_gradients(sparse, dense)


def test_reinforce_leaves_out_completions_whose_token_advantages_are_all_zero():
    model = _tiny_gpt()
    ro = _rollout(model)
    rewards = torch.zeros(8, 3)  # token rewards; the first batch is its own baseline
    rewards[2, 1] = rewards[5, 0] = 1.0  # rows 2 and 5 differ from the batch mean on a token; so do all others
    dense, dense_rows, _ = _update(model, ["algo.skip_zero_advantage=false"], ro, rewards)
    sparse, sparse_rows, _ = _update(model, [], ro, rewards)
    assert sparse_rows == dense_rows == [8]  # every row's advantage is nonzero somewhere: nothing to leave out
    rewards = torch.zeros(8, 3)
    rewards[:2, 1] = 1.0  # rows 0-3 above and below the mean (0.5) of token 1
    rewards[4:, 1] = 0.5  # rows 4-7 at the mean on every token: their advantages are all 0
    dense, _, _ = _update(model, ["algo.skip_zero_advantage=false"], ro, rewards)
    sparse, sparse_rows, _ = _update(model, [], ro, rewards)
    assert sparse_rows == [4]
    _assert_same_gradients(sparse, dense)


def test_when_no_completion_carries_loss_one_runs_and_the_optimizer_gets_zero_gradients():
    model = _tiny_gpt()
    ro = _rollout(model)
    grads, rows, metrics = _update(model, ["algo.name=grpo", "algo.group_size=4"], ro, torch.ones(8))
    assert rows == [1] and metrics["train/update_fraction"] == 1 / 8
    assert all(g is not None and not g.any() for g in grads)  # zeros, as a full pass gives: AdamW still steps


@pytest.mark.parametrize("overrides", [
    ["algo.kl_coef=0.1"],  # KL in the loss: a zero-advantage completion still pulls towards the reference
    ["algo.ent_coef=0.01"],
])
def test_every_completion_runs_when_the_loss_has_terms_besides_the_advantage(overrides):
    model = _tiny_gpt()
    ro = _rollout(model)
    reference = GPT(model.config)
    _, rows, metrics = _update(model, ["algo.name=grpo", "algo.group_size=4", *overrides], ro, SPLIT,
                               learner=Stub(model, reference))
    assert rows == [8] and metrics["train/update_fraction"] == 1.0


def test_every_completion_runs_under_several_processes():
    model = _tiny_gpt()
    learner = Stub(model)
    learner.distributed = True  # each process must run as many passes as the others
    _, rows, _ = _update(model, ["algo.name=grpo", "algo.group_size=4"], _rollout(model), SPLIT, learner=learner)
    assert rows == [8]


# -- GSPO's ratio level, INTELLECT-2's cap, high-entropy tokens, the off-policy mask ---------------------
OPTIONS = {
    "gspo": ["algo.ratio_level=sequence"],
    "gspo-token": ["algo.ratio_level=sequence_token"],
    "ratio-cap": ["algo.clip_ratio_max=2.0"],
    "high-entropy": ["algo.top_entropy_quantile=0.2"],
    "off-policy-mask": ["algo.off_policy_mask_threshold=0.01"],
}


@pytest.mark.parametrize("name", OPTIONS)
def test_grpo_trains_with_each_ratio_option(tiny_config, name):
    # two epochs per rollout: the second pass's ratios have moved, so each option has something to act on
    cfg = tiny_config("algo.name=grpo", "algo.group_size=4", "algo.ppo_epochs=2", *OPTIONS[name],
                      "train.steps=2", "train.eval_every=2")
    assert RLTrainer(cfg).train()["rl_steps"] == 2
    rows = rl_rows(cfg.run_dir)
    assert len(rows) == 2
    for row in rows:
        assert all(k in row for k in ("train/policy_loss", "clip_ratio/region_mean", "clip_ratio/high_max"))
        assert all(v == v for v in row.values() if isinstance(v, float)), f"{name} logged NaN: {row}"


@pytest.mark.parametrize("mode", ["passk", "opo", "gpg"])
def test_grpo_trains_with_verls_group_estimators(tiny_config, mode):
    cfg = tiny_config("algo.name=grpo", "algo.group_size=4", f"algo.adv_mode={mode}", "task.reward=digits",
                      "train.steps=2", "train.eval_every=2", "train.log_completions=true")
    assert RLTrainer(cfg).train()["rl_steps"] == 2
    rows = rl_rows(cfg.run_dir)
    assert len(rows) == 2 and all(v == v for row in rows for v in row.values() if isinstance(v, float))
    logged = [json.loads(line) for line in (cfg.run_dir / "completions.jsonl").read_text().splitlines()]
    advantages = torch.tensor([row["advantage"] for row in logged if row["step"] == logged[0]["step"]]).view(-1, 4)
    if mode == "passk":  # at most one completion per group has an advantage, and it is not negative
        assert ((advantages != 0).sum(1) <= 1).all() and (advantages >= 0).all()


def test_ppo_shares_the_ratio_options(tiny_config):
    cfg = tiny_config("algo.name=ppo", "algo.value_model=head", "algo.ratio_level=sequence",
                      "algo.clip_ratio_max=1.5", "algo.top_entropy_quantile=0.5", "algo.off_policy_mask_threshold=0.1",
                      "train.steps=1", "train.eval_every=1")
    assert RLTrainer(cfg).train()["rl_steps"] == 1


@pytest.mark.parametrize("overrides, message", [
    (["algo.clip_ratio_max=1.2"], "algo.clip_ratio_max=1.2 must be > 1 + algo.clip_range_right = 1.2"),
    (["algo.clip_range_right=0.28", "algo.clip_ratio_max=1.25"], "algo.clip_ratio_max=1.25 must be > 1 + "
                                                                 "algo.clip_range_right = 1.28"),
    (["algo.top_entropy_quantile=1.5"], "algo.top_entropy_quantile must be in [0, 1], got 1.5"),
    (["algo.top_entropy_quantile=-0.1"], "algo.top_entropy_quantile must be in [0, 1], got -0.1"),
    (["algo.off_policy_mask_threshold=0"], "algo.off_policy_mask_threshold must be > 0, got 0.0"),
    (["algo.ratio_level=seq"], "algo.ratio_level='seq' is not one of token, sequence, sequence_token"),
])
def test_ratio_options_out_of_range_are_one_line_naming_the_key_and_value(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("adder", TINY + ["algo.name=grpo", "algo.group_size=4", *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("option", ["algo.ratio_level=sequence", "algo.clip_ratio_max=4.0",
                                    "algo.top_entropy_quantile=0.2", "algo.off_policy_mask_threshold=0.5"])
def test_reinforce_refuses_the_options_of_a_ratio_it_does_not_have(option):
    with pytest.raises(ConfigError) as e:
        load_config("adder", TINY + [option])
    assert f"{option} shapes the clipped ratio (" in str(e.value) and "algo.name=reinforce has none" in str(e.value)
    assert "grpo, rloo, ppo, reinforce_plus_plus" in str(e.value)  # the clipping algorithms, by registration order


def _moved_batch(model, overrides):
    """A GRPO batch of `_rollout`'s completions whose old log-probs are 0.4 nats off (random signs), so the
    ratios differ from 1 as after an earlier update."""
    cfg = load_config("adder", ["train.rollout_size=8", "algo.name=grpo", "algo.group_size=4", *overrides]).algo
    algo, learner = build_algorithm(cfg, max_new_tokens=3), Stub(model)
    batch, _ = algo.prepare(learner, _rollout(model, mask_rows=[(4, 1), (6, 2)]), SPLIT)
    logp, _, _ = policy_forward(model, batch.sequences, 3)
    sign = torch.randint(2, logp.shape, generator=torch.Generator().manual_seed(3)) * 2 - 1
    batch.old_logprobs = logp.detach() + 0.4 * sign
    return algo, learner, batch


@pytest.mark.parametrize("overrides", [
    ["algo.ratio_level=sequence"], ["algo.ratio_level=sequence_token", "algo.clip_ratio_max=1.3"],
    ["algo.off_policy_mask_threshold=0.05", "algo.loss_level=sequence"],
])
def test_zero_advantage_completions_still_leave_the_pass_with_per_completion_options(overrides):
    model = _tiny_gpt()
    grads = {}
    for skip in ("true", "false"):
        model.zero_grad(set_to_none=True)
        algo, learner, batch = _moved_batch(model, [*overrides, f"algo.skip_zero_advantage={skip}"])
        metrics = algo.update(learner, batch, {})
        grads[skip] = [p.grad.clone() for p in model.parameters()]
        assert metrics["train/update_fraction"] == (0.5 if skip == "true" else 1.0)
    _assert_same_gradients(grads["true"], grads["false"])


def test_every_completion_runs_when_only_the_high_entropy_tokens_train():
    # the threshold is a quantile over the micro-batch's tokens: leaving rows out would move it
    model = _tiny_gpt()
    _, rows, metrics = _update(model, ["algo.name=grpo", "algo.group_size=4", "algo.top_entropy_quantile=0.2"],
                               _rollout(model), SPLIT)
    assert rows == [8] and metrics["train/update_fraction"] == 1.0


def test_the_entropy_bonus_acts_on_the_high_entropy_tokens_only():
    from lmrl.algos.losses import high_entropy_mask

    model = _tiny_gpt()
    algo, _, batch = _moved_batch(model, ["algo.top_entropy_quantile=0.3", "algo.ent_coef=0.1"])
    logp, entropy, _ = policy_forward(model, batch.sequences, 3)
    loss, stats = algo.loss(batch, logp, entropy, None)
    kept = batch.mask * high_entropy_mask(entropy, batch.mask, 0.3)
    assert 0 < kept.sum() < batch.mask.sum()
    bonus = (entropy * kept).sum() / kept.sum()  # loss_level=token over the tokens trained
    torch.testing.assert_close(loss, torch.tensor(stats["policy_loss"]) - 0.1 * bonus)
    assert stats["entropy"] == pytest.approx(((entropy * batch.mask).sum() / batch.mask.sum()).item())  # all tokens


# -- PPO's value function: an optimizer group of its own -------------------------------------------------
def test_each_parameter_group_is_clipped_on_its_own(tmp_path):
    from lmrl.train.lifecycle import guarded_step

    policy, value = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([{"params": [policy]}, {"params": [value]}], lr=1.0)
    policy.grad, value.grad = torch.tensor([6.0, 8.0]), torch.tensor([0.3, 0.4])  # norms 10 and 0.5
    state = {"step": 0, "nonfinite_total": 0, "nonfinite_run": 0}
    stats = guarded_step(optimizer, torch.tensor(1.0), state, grad_clip=1.0, max_nonfinite=3, device="cpu",
                         ckpt_dir=tmp_path, info=print)
    assert stats["grad_norm"] == pytest.approx(10.0) and stats["value_grad_norm"] == pytest.approx(0.5)
    # the policy's step is cut to norm 1; the value's is its own, untouched by the policy's large gradient
    torch.testing.assert_close(policy.detach(), torch.tensor([-0.6, -0.8]))
    torch.testing.assert_close(value.detach(), torch.tensor([-0.3, -0.4]))


def test_ppo_trains_its_value_function_at_algo_critic_lr(tiny_config):
    cfg = tiny_config("algo.name=ppo", "algo.value_model=head", "algo.critic_lr=3e-3", "optim.lr=1e-4",
                      "schedule.name=constant", "train.steps=2", "train.eval_every=2")
    trainer = RLTrainer(cfg)
    trainer.train()
    policy_group, value_group = trainer.optimizer.param_groups
    assert (policy_group["lr"], value_group["lr"]) == (pytest.approx(1e-4), pytest.approx(3e-3))
    value_params = {id(p) for p in trainer.module.value.parameters()}
    assert {id(p) for p in value_group["params"]} == value_params
    assert not value_params & {id(p) for p in policy_group["params"]}
    rows = rl_rows(cfg.run_dir)
    assert rows and all(r["train/value_grad_norm"] > 0 for r in rows)


@pytest.mark.parametrize("setting, whitened", [(None, True), ("false", False), ("true", True)])
def test_ppo_whitens_its_advantages_unless_told_not_to_as_verl_openrlhf_and_trl_do(setting, whitened):
    from lmrl.models.heads import ActorCritic

    model = ActorCritic(_tiny_gpt())
    overrides = ["algo.name=ppo", "algo.value_model=head"]
    overrides += [f"algo.normalize_advantages={setting}"] if setting else []
    algo = build_algorithm(load_config("adder", TINY + overrides).algo, max_new_tokens=3)
    ro = sample(model.policy, torch.randint(12, (4, 5)), 3, generator=torch.Generator().manual_seed(1))
    batch, _ = algo.prepare(Stub(model), ro, torch.tensor([1.0, 0.0, 0.5, 0.25]))
    valid = batch.advantages[ro.mask.bool()]
    assert (abs(valid.mean().item()) < 1e-5 and abs(valid.std(unbiased=False).item() - 1) < 1e-4) == whitened


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_algorithms_do_not_whiten_unless_told_to(name):
    cfg = load_config("adder", TINY + [f"algo.name={name}", "algo.group_size=4"]).algo
    assert not build_algorithm(cfg).normalizes
    assert build_algorithm(load_config("adder", TINY + [f"algo.name={name}", "algo.group_size=4",
                                                        "algo.normalize_advantages=true"]).algo).normalizes


def test_reward_clip_clamps_the_rewards_the_update_uses_and_logs_them_as_scored(tiny_config, monkeypatch, tmp_path):
    from lmrl.algos.grpo import GRPO

    seen = []
    prepare = GRPO.prepare
    monkeypatch.setattr(GRPO, "prepare", lambda self, learner, ro, rewards: seen.append(rewards.clone()) or
                        prepare(self, learner, ro, rewards))
    runs = {}
    for i, clip in enumerate(("[]", "[0.2,0.6]")):
        seen.clear()
        cfg = tiny_config("algo.name=grpo", "algo.group_size=4", "task.reward=digits", "train.steps=1",
                          "train.eval_every=1", f"reward.clip={clip}", dir=tmp_path / f"run{i}")
        RLTrainer(cfg).train()
        runs[clip] = (seen[0], rl_rows(cfg.run_dir)[0]["rollout/reward_mean"])
    raw, clamped = runs["[]"][0], runs["[0.2,0.6]"][0]
    assert raw.min() < 0.2 and raw.max() > 0.6, "the tiny run's rewards straddle the clip range"
    torch.testing.assert_close(clamped, raw.clamp(0.2, 0.6))  # the same seed samples the same completions
    assert runs["[0.2,0.6]"][1] == pytest.approx(runs["[]"][1])  # the logged reward is as scored


@pytest.mark.parametrize("clip, message", [("[1.0]", r"reward.clip must be \[low, high\]"),
                                           ("[1.0,0.0]", "low < high"), ("[0,.inf]", "two finite numbers")])
def test_reward_clip_takes_two_finite_numbers_low_first(clip, message):
    with pytest.raises(ConfigError, match=message):
        load_config("adder", [f"reward.clip={clip}"])
