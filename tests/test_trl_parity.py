"""lmrl's advantage and loss functions against TRL's own trainers, on random tensors.

Each test runs a TRL trainer method unbound, on a stub that holds only the attributes that method
reads (no model, no data set, no accelerator launch), and the lmrl function a TRL user would map it
to; values agree to 1e-6. Where lmrl deliberately differs, a test pins the difference down.

    GRPOTrainer._generate_and_score_completions  advantages (scale_rewards group / batch / none)
    GRPOTrainer._compute_loss                    per-token clipped loss, loss_type grpo / bnpo / dr_grpo /
                                                 dapo, asymmetric clipping, k3 KL in the loss; importance
                                                 sampling level, delta, top_entropy_quantile and
                                                 off_policy_mask_threshold, with the clip_ratio/* metrics
    RLOOTrainer._generate_and_score_completions  advantages: leave-one-out, reward_clip_range, beta's k1 KL in
                                                 the reward; normalize_advantages (its std pinned down)
    RLOOTrainer._compute_loss                    one clipped ratio per completion (ratio_level=sequence_sum,
                                                 loss_level=sequence), with the clip_ratio/* metrics
    DPOTrainer._compute_loss                     sigmoid, ipo, hinge, robust (label smoothing); entropy,
                                                 logits/chosen|rejected, mean_token_accuracy, num_tokens
    SFTTrainer.compute_loss                      loss, entropy, mean_token_accuracy, num_tokens
    RewardTrainer.compute_loss                   Bradley–Terry with a margin column

The token diagnostics are fed TRL's own per-token outputs: its fused LM head's kernel
(`ChunkedLogProbFunction`, torch path) run on logits with the identity as the head.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from lmrl.algos import build_algorithm
from lmrl.algos.advantages import group_advantages
from lmrl.algos.base import PreparedBatch
from lmrl.algos.losses import clipped_surrogate_loss, kl_estimate
from lmrl.algos.preference_losses import bradley_terry_loss, dpo_loss
from lmrl.config import AlgoConfig
from lmrl.tasks.text_batches import PairExample, pad_sequences, pair_batch, pair_logps_and_sums, pair_rows
from lmrl.train.dpo_trainer import dpo_token_metrics
from lmrl.train.offline import PairTrainer
from lmrl.train.sft_trainer import SFTTrainer as LmrlSFTTrainer
from tests.test_pair_rows import Bigram
from trl import DPOTrainer, GRPOTrainer, RewardTrainer, RLOOTrainer, SFTTrainer
from trl.kernels.chunked_logprob import ChunkedLogProbFunction

TOL = dict(rtol=0, atol=1e-6)


class Accelerator:
    """What the trainers' loss code asks of accelerate in one process."""

    device = torch.device("cpu")
    process_index = 0
    num_processes = 1

    def gather(self, t):
        return t

    gather_for_metrics = gather

    def reduce(self, t, reduction="sum"):
        return t

    def pad_across_processes(self, t, dim=0, pad_index=0):
        return t


def metrics() -> defaultdict:
    return defaultdict(lambda: defaultdict(list))


def completion_mask(rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, width) right-padded masks of random lengths 1..width."""
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    return (torch.arange(width) < lengths[:, None]).long()


# -- GRPO advantages -----------------------------------------------------------------------------------
def trl_grpo_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str) -> torch.Tensor:
    """TRL's advantages for these rewards: `_generate_and_score_completions` with generation and reward
    functions stubbed to hand back one-token completions and `rewards`."""
    b = rewards.numel()

    def generate(prompts):
        return ([[1, 2]] * b, [[3]] * b, None, ["c"] * b, None, {}, None, None)

    stub = SimpleNamespace(
        accelerator=Accelerator(), model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        environment_factories=None, tools=None, environments=None, _generate=generate,
        _tokenizer=SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None, mask_truncated_completions=False,
        args=SimpleNamespace(per_device_train_batch_size=b, steps_per_generation=1, gradient_accumulation_steps=1,
                             gradient_checkpointing_kwargs=None),
        num_iterations=1, use_vllm=False, vllm_importance_sampling_correction=False, beta=0.0,
        _calculate_rewards=lambda *args: rewards.float().unsqueeze(1), num_generations=group_size,
        multi_objective_aggregation="sum_then_normalize", reward_weights=torch.ones(1),
        scale_rewards=scale_rewards, reward_func_names=["r"], _metrics=metrics(),
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
               "extra": defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False)
    out = GRPOTrainer._generate_and_score_completions(stub, [{"prompt": "p"}] * b)
    return out["advantages"]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_grpo_advantages_are_trls(scale, group_size):
    gen = torch.Generator().manual_seed(group_size)
    rewards = torch.randn(6 * group_size, generator=gen)
    rewards[:group_size] = 0.5  # a group that agrees: std 0, advantages 0 in both
    rewards[group_size:2 * group_size] = (torch.rand(group_size, generator=gen) < 0.5).float()  # 0/1 rewards
    ours = group_advantages(rewards, group_size, "grpo", scale=scale)  # lmrl's defaults otherwise
    torch.testing.assert_close(ours, trl_grpo_advantages(rewards, group_size, scale), **TOL)


def test_grpo_advantages_on_a_near_tied_group_are_trls_with_the_default_eps():
    # two rewards 1.13e-4 apart (sample std 8e-5): eps 1e-4 gives ±0.31, the old 1e-6 gave ±0.70
    rewards = torch.tensor([0.3, 0.3 + 1.13e-4])
    theirs = trl_grpo_advantages(rewards, 2, "group")
    torch.testing.assert_close(group_advantages(rewards, 2), theirs, **TOL)
    assert (group_advantages(rewards, 2, eps=1e-6) - theirs).abs().max() > 0.3


# -- GRPO per-token loss ---------------------------------------------------------------------------------
# TRL's loss_type -> lmrl's algo.loss_level (dr_grpo's constant is TRL's max_completion_length)
LOSS_TYPES = {"grpo": "sequence", "bnpo": "token", "dapo": "token", "dr_grpo": "constant"}


def trl_grpo_loss(loss_type: str, logps, old, ref, advantages, mask, beta: float, eps_low: float,
                  eps_high: float, max_len: int, entropies=None, level: str = "token", delta=None,
                  quantile: float = 1.0, off_policy=None, bias_kl: bool = False):
    """TRL's GRPO loss on these log-probs (and entropies: the forward pass stubbed), and its metrics."""
    entropies = torch.zeros_like(logps) if entropies is None else entropies
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None),
        aux_loss_enabled=False, top_entropy_quantile=quantile, off_policy_mask_threshold=off_policy,
        importance_sampling_level=level, beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=bias_kl, delta=delta, steps_per_generation=1),
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, max_completion_length=max_len,
        accelerator=Accelerator(), _entropy_bonus_enabled=False, _metrics=metrics(),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask)
    stub.get_high_entropy_mask = lambda *a: GRPOTrainer.get_high_entropy_mask(stub, *a)
    b, t = mask.shape
    inputs = {"prompt_ids": torch.ones(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
              "completion_ids": torch.ones(b, t, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    if beta:
        inputs["ref_per_token_logps"] = ref
    return GRPOTrainer._compute_loss(stub, None, inputs), stub._metrics["train"]


def lmrl_grpo_loss(level: str, logps, old, ref, advantages, mask, beta: float, eps_low: float, eps_high: float,
                   max_len: int, entropies=None, **options):
    """lmrl's GRPO loss (the algorithm's `loss`: clipped surrogate + β·KL, aggregated by `level`; `options`
    are other `algo` keys)."""
    cfg = AlgoConfig(name="grpo", group_size=2, loss_level=level, clip_range_left=eps_low,
                     clip_range_right=eps_high, kl_coef=beta, kl_estimator="k3", **options)
    algo = build_algorithm(cfg, max_new_tokens=max_len)
    batch = PreparedBatch(torch.zeros(len(mask), 1, dtype=torch.long), mask, advantages, old_logprobs=old,
                          ref_logprobs=ref if beta else None)
    return algo.loss(batch, logps, torch.zeros_like(logps) if entropies is None else entropies, None)


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_grpo_loss_and_gradient_are_trls(loss_type, beta):
    gen = torch.Generator().manual_seed(len(loss_type) + int(beta * 100))
    b, t = 8, 12
    mask = completion_mask(b, t, gen)
    old = -torch.rand(b, t, generator=gen) * 3
    logps_init = old + 0.3 * torch.randn(b, t, generator=gen)  # ratios from ~0.4 to ~2.5: both clips bite
    ref = old + 0.2 * torch.randn(b, t, generator=gen)
    advantages = torch.randn(b, generator=gen)
    setting = dict(beta=beta, eps_low=0.2, eps_high=0.28, max_len=t)

    theirs_logps = logps_init.clone().requires_grad_(True)
    theirs, trl_metrics = trl_grpo_loss(loss_type, theirs_logps, old, ref, advantages, mask, **setting)
    theirs.backward()
    ours_logps = logps_init.clone().requires_grad_(True)
    ours, stats = lmrl_grpo_loss(LOSS_TYPES[loss_type], ours_logps, old, ref, advantages, mask, **setting)
    ours.backward()

    torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
    torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, **TOL)
    clip_low, clip_high = trl_metrics["clip_ratio/low_mean"][0], trl_metrics["clip_ratio/high_mean"][0]
    assert clip_low > 0 and clip_high > 0  # the test reaches both sides of the asymmetric clip
    assert stats["clip_frac"] == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-6)
    if beta and LOSS_TYPES[loss_type] == "token":  # TRL logs the KL as a mean over tokens
        assert stats["kl"] == pytest.approx(trl_metrics["kl"][0], abs=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_grpo_ratio_weighted_kl_is_trls_bias_corrected_kl(loss_type, level):
    gen = torch.Generator().manual_seed(len(loss_type) + len(level))
    b, t = 8, 12
    mask = completion_mask(b, t, gen)
    old = -torch.rand(b, t, generator=gen) * 3
    logps_init = old + 0.3 * torch.randn(b, t, generator=gen)
    ref = old + 0.2 * torch.randn(b, t, generator=gen)
    advantages = torch.randn(b, generator=gen)
    setting = dict(beta=0.5, eps_low=0.2, eps_high=0.28, max_len=t)
    grads = {}
    for bias_kl in (True, False):
        theirs_logps = logps_init.clone().requires_grad_(True)
        theirs, trl_metrics = trl_grpo_loss(loss_type, theirs_logps, old, ref, advantages, mask, level=level,
                                            bias_kl=bias_kl, **setting)
        theirs.backward()
        ours_logps = logps_init.clone().requires_grad_(True)
        ours, stats = lmrl_grpo_loss(LOSS_TYPES[loss_type], ours_logps, old, ref, advantages, mask, ratio_level=level,
                                     kl_ratio_weighted=bias_kl, **setting)
        ours.backward()
        torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
        torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, **TOL)
        if LOSS_TYPES[loss_type] == "token":
            assert stats["kl"] == pytest.approx(trl_metrics["kl"][0], abs=1e-6)
        grads[bias_kl] = ours_logps.grad
    assert (grads[True] - grads[False]).abs().max() > 1e-3  # the weighting changes the gradient


def test_grpo_ratio_weighted_kl_changes_the_on_policy_gradient_by_kl_times_the_score():
    # at ratio 1: d/dlogp (k3·ρ) = dk3/dlogp + k3, so each token's gradient grows by β·k3 (token level, /tokens)
    gen = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 3)
    logps = -torch.rand(2, 3, generator=gen)
    ref = logps + 0.5 * torch.randn(2, 3, generator=gen)
    grads = []
    for weighted in (False, True):
        x = logps.clone().requires_grad_(True)
        loss, _ = lmrl_grpo_loss("token", x, logps, ref, torch.zeros(2), mask, beta=1.0, eps_low=0.2, eps_high=0.2,
                                 max_len=3, kl_ratio_weighted=weighted)
        loss.backward()
        grads.append(x.grad)
    k3 = torch.exp(ref - logps) - (ref - logps) - 1
    torch.testing.assert_close(grads[1] - grads[0], k3 / 6, **TOL)


# TRL's GRPOConfig fields -> lmrl's algo keys
GRPO_OPTIONS = {"level": "ratio_level", "delta": "clip_ratio_max", "quantile": "top_entropy_quantile",
                "off_policy": "off_policy_mask_threshold"}
CLIP_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
                "clip_ratio/high_max")


def grpo_options_case(seed: int, b: int = 8, t: int = 12):
    """Log-probs that moved from the old ones (ratios ~0.4 to ~2.5, some completions drifted far), a
    last row without a valid token, entropies with large values on padding (which must never count)."""
    gen = torch.Generator().manual_seed(seed)
    mask = completion_mask(b, t, gen)
    mask[-1] = 0
    old = -torch.rand(b, t, generator=gen) * 3
    logps = old + 0.5 * torch.randn(b, t, generator=gen) - 0.2 * torch.rand(b, 1, generator=gen)
    ref = old + 0.2 * torch.randn(b, t, generator=gen)
    entropies = torch.where(mask.bool(), torch.rand(b, t, generator=gen) * 2, torch.full((b, t), 9.0))
    return logps, old, ref, torch.randn(b, generator=gen), mask, entropies


@pytest.mark.parametrize("options", [
    dict(level="sequence"), dict(delta=1.5), dict(quantile=0.2), dict(quantile=0.5), dict(quantile=0.0),
    dict(off_policy=0.05),
    dict(level="sequence", delta=1.3, quantile=0.3, off_policy=0.05),
])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_grpo_options_loss_gradient_and_clip_metrics_are_trls(loss_type, beta, options):
    logps_init, old, ref, advantages, mask, entropies = grpo_options_case(len(loss_type) + len(options))
    setting = dict(beta=beta, eps_low=0.2, eps_high=0.28, max_len=mask.size(1), entropies=entropies)

    theirs_logps = logps_init.clone().requires_grad_(True)
    theirs, trl_metrics = trl_grpo_loss(loss_type, theirs_logps, old, ref, advantages, mask, **setting, **options)
    theirs.backward()
    ours_logps = logps_init.clone().requires_grad_(True)
    ours, stats = lmrl_grpo_loss(LOSS_TYPES[loss_type], ours_logps, old, ref, advantages, mask, **setting,
                                 **{GRPO_OPTIONS[k]: v for k, v in options.items()})
    ours.backward()

    torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
    torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, **TOL)
    for key in CLIP_METRICS:
        assert stats[key] == pytest.approx(trl_metrics[key][0], abs=1e-6), key
    assert stats["clip_frac"] == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert stats["token_entropy"] == pytest.approx(trl_metrics["entropy"][0], abs=1e-6)
    if beta:
        assert stats["token_kl"] == pytest.approx(trl_metrics["kl"][0], abs=1e-6)
    plain_logps = logps_init.clone().requires_grad_(True)  # the case reaches what the options change
    lmrl_grpo_loss(LOSS_TYPES[loss_type], plain_logps, old, ref, advantages, mask, **setting)[0].backward()
    assert (plain_logps.grad - ours_logps.grad).abs().max() > 1e-4


@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_gspo_token_with_sequence_advantages_is_trls_gspo(loss_type):
    """GSPO-token (ratio_level=sequence_token) takes each token's gradient times the completion's ratio;
    with one advantage per completion its loss and gradient are GSPO's (the GSPO paper, section 4.3),
    which TRL 1.16 computes (its own GRPOTrainer has no sequence_token)."""
    logps_init, old, ref, advantages, mask, _ = grpo_options_case(3)
    setting = dict(beta=0.0, eps_low=0.2, eps_high=0.28, max_len=mask.size(1))
    theirs_logps = logps_init.clone().requires_grad_(True)
    theirs, _ = trl_grpo_loss(loss_type, theirs_logps, old, ref, advantages, mask, **setting, level="sequence",
                              delta=1.5)
    theirs.backward()
    ours_logps = logps_init.clone().requires_grad_(True)
    ours, _ = lmrl_grpo_loss(LOSS_TYPES[loss_type], ours_logps, old, ref, advantages, mask, **setting,
                             ratio_level="sequence_token", clip_ratio_max=1.5)
    ours.backward()
    torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
    torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, **TOL)


def test_k3_kl_is_trls_per_token_kl():
    gen = torch.Generator().manual_seed(3)
    b, t = 4, 6
    mask = torch.ones(b, t, dtype=torch.long)
    logps = -torch.rand(b, t, generator=gen) * 3
    ref = logps + torch.randn(b, t, generator=gen)
    zero = torch.zeros(b)  # no advantage: TRL's loss is β·mean KL alone
    theirs, _ = trl_grpo_loss("bnpo", logps, logps, ref, zero, mask, beta=1.0, eps_low=0.2, eps_high=0.2, max_len=t)
    torch.testing.assert_close(kl_estimate(logps, ref, "k3").mean(), theirs, **TOL)


# -- RLOO (TRL's RLOOTrainer, lmrl's rloo as lmrl.trl.RLOOConfig translates it) ----------------------------
def lmrl_rloo_algo(tmp_path, **fields):
    """lmrl's algorithm and config for a TRL RLOOConfig with these fields (lmrl.trl's translation)."""
    from lmrl.trl import RLOOConfig

    cfg = RLOOConfig(output_dir=str(tmp_path), use_cpu=True, **fields).to_config(model_path="m", train_rows=8)
    return build_algorithm(cfg.algo, max_new_tokens=12), cfg


def rloo_case(seed: int, b: int = 16, t: int = 12):
    """Log-probs that moved from the old ones (sequence ratios exp(Σ log ρ) from ~0.5 to ~2: both clips bite),
    reference log-probs apart from the old ones, rewards and per-token entropies."""
    gen = torch.Generator().manual_seed(seed)
    mask = completion_mask(b, t, gen)
    mask[0] = 1  # the longest completion fills the width, as TRL pads them
    old = -torch.rand(b, t, generator=gen) * 3
    logps = old + 0.15 * torch.randn(b, t, generator=gen)
    ref = old + 0.2 * torch.randn(b, t, generator=gen)
    entropies = torch.where(mask.bool(), torch.rand(b, t, generator=gen) * 2, torch.full((b, t), 9.0))
    return logps, old, ref, torch.randn(b, generator=gen) * 2, mask, entropies


def trl_rloo_advantages(rewards, old, ref, mask, group_size: int, beta: float, clip_range, normalize: bool):
    """TRL's advantages: `RLOOTrainer._generate_and_score_completions` with generation stubbed to hand back
    completions of `mask`'s lengths, the policy's and the reference's forward passes to hand back `old` and
    `ref`, and the one reward function to hand back `rewards`."""
    b = rewards.numel()
    lengths = mask.sum(1).tolist()
    model, ref_model = SimpleNamespace(training=True, is_gradient_checkpointing=False), object()

    def logps(net, *args, **kwargs):
        return (old if net is model else ref), None, None

    stub = SimpleNamespace(
        accelerator=Accelerator(), model=model, ref_model=ref_model, pad_to_multiple_of=None,
        _generate=lambda prompts: ([[1, 2]] * b, [[3] * n for n in lengths], ["c"] * b),
        _tokenizer=SimpleNamespace(pad_token_id=0), mask_truncated_completions=False,
        args=SimpleNamespace(per_device_train_batch_size=b, gradient_checkpointing_kwargs=None),
        _get_per_token_logps_and_entropies=logps, beta=beta, reward_clip_range=clip_range,
        normalize_advantages=normalize, _calculate_rewards=lambda *args: rewards.float().unsqueeze(1),
        num_generations=group_size, reward_weights=torch.ones(1), reward_func_names=["r"], _metrics=metrics(),
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
               "extra": defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False)
    out = RLOOTrainer._generate_and_score_completions(stub, [{"prompt": "p"}] * b)
    assert torch.equal(out["completion_mask"], mask)
    return out["advantages"], stub._metrics["train"]


def lmrl_rloo_advantages(algo, cfg, rewards, old, ref, mask):
    """lmrl's advantages for the same step: the rewards clamped to reward.clip (as the RL trainer does), then
    the algorithm's `prepare` (the KL into the reward, the leave-one-out baselines, any whitening), the
    reference's log-probs handed in for its forward pass."""
    from lmrl.generation.rollout import Rollout

    if cfg.reward.clip:
        rewards = rewards.clamp(*cfg.reward.clip)
    b, t = mask.shape
    rollout = Rollout(torch.ones(b, 2, dtype=torch.long), torch.ones(b, t, dtype=torch.long), old, mask)
    algo.reference_logprobs = lambda learner, ro: ref
    learner = SimpleNamespace(reference=object(), all_reduce_sum=lambda x: x)
    batch, metrics_ = algo.prepare(learner, rollout, rewards)
    return batch.advantages, metrics_


@pytest.mark.parametrize("group_size", [2, 4])
@pytest.mark.parametrize("fields", [dict(), dict(beta=0.0), dict(beta=0.3), dict(reward_clip_range=(-1.0, 1.5)),
                                    dict(beta=0.3, reward_clip_range=(-0.5, 2.0))])
def test_rloo_advantages_are_trls(tmp_path, group_size, fields):
    """Leave-one-out baselines of the rewards clamped to reward_clip_range, minus beta times the k1 KL summed
    over each completion (TRL's default beta is 0.05)."""
    _, old, ref, rewards, mask, _ = rloo_case(group_size + len(fields))
    algo, cfg = lmrl_rloo_algo(tmp_path, num_generations=group_size, **fields)
    beta, clip = fields.get("beta", 0.05), fields.get("reward_clip_range")
    theirs, trl_metrics = trl_rloo_advantages(rewards, old, ref, mask, group_size, beta, clip, normalize=False)
    ours, _ = lmrl_rloo_advantages(algo, cfg, rewards, old, ref, mask)
    torch.testing.assert_close(ours, theirs, **TOL)
    if clip:  # the case reaches the clamp
        assert ((rewards < clip[0]) | (rewards > clip[1])).any()
    if beta:  # the KL moves the advantages
        unshaped, _ = trl_rloo_advantages(rewards, old, ref, mask, group_size, 0.0, clip, normalize=False)
        assert (unshaped - theirs).abs().max() > 1e-2
        assert trl_metrics["kl"][0] == pytest.approx(((old - ref) * mask).sum().item() / mask.sum().item(), abs=1e-6)


def test_rloo_normalized_advantages_differ_from_trls_by_the_std_they_divide_by(tmp_path):
    """normalize_advantages: both centre on the batch mean; lmrl divides by the population std + 1e-8, TRL by the
    sample (Bessel) std + 1e-4, so lmrl's are TRL's times (s_sample + 1e-4) / (s_population + 1e-8)."""
    _, old, ref, rewards, mask, _ = rloo_case(5)
    algo, cfg = lmrl_rloo_algo(tmp_path, num_generations=4, normalize_advantages=True, beta=0.1)
    theirs, _ = trl_rloo_advantages(rewards, old, ref, mask, 4, 0.1, None, normalize=True)
    ours, _ = lmrl_rloo_advantages(algo, cfg, rewards, old, ref, mask)
    raw, _ = trl_rloo_advantages(rewards, old, ref, mask, 4, 0.1, None, normalize=False)
    factor = (raw.std() + 1e-4) / (raw.std(correction=0) + 1e-8)
    torch.testing.assert_close(ours, theirs * factor, **TOL)
    torch.testing.assert_close(ours.mean(), torch.tensor(0.0), **TOL)
    assert factor > 1.03  # B = 16: sqrt(16/15), a difference a test sees


def trl_rloo_loss(logps, old, advantages, mask, entropies, eps_low: float, eps_high: float):
    """TRL's RLOO loss on these log-probs and entropies (the forward pass stubbed), and its metrics; the old
    log-probs summed over each completion, as `_generate_and_score_completions` hands them on."""
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None), aux_loss_enabled=False,
        epsilon_low=eps_low, epsilon_high=eps_high, model=SimpleNamespace(training=True), accelerator=Accelerator(),
        _metrics=metrics())
    b, t = mask.shape
    inputs = {"prompt_ids": torch.ones(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
              "completion_ids": torch.ones(b, t, dtype=torch.long), "completion_mask": mask,
              "old_logps": (old * mask).sum(1), "advantages": advantages}
    return RLOOTrainer._compute_loss(stub, None, inputs), stub._metrics["train"]


@pytest.mark.parametrize("fields", [dict(), dict(epsilon=0.1, epsilon_high=0.28), dict(beta=0.0)])
def test_rloo_loss_gradient_and_clip_metrics_are_trls(tmp_path, fields):
    """One clipped ratio per completion, exp(Σ_t log π − log π_old) (ratio_level=sequence_sum), averaged over
    completions (loss_level=sequence); the KL is in the reward, not the loss."""
    logps_init, old, ref, advantages, mask, entropies = rloo_case(len(fields) + 7)
    algo, cfg = lmrl_rloo_algo(tmp_path, **fields)
    assert (cfg.algo.ratio_level, cfg.algo.loss_level, cfg.algo.kl_in_reward) == ("sequence_sum", "sequence", True)
    eps_low = fields.get("epsilon", 0.2)
    eps_high = fields.get("epsilon_high", eps_low)

    theirs_logps = logps_init.clone().requires_grad_(True)
    theirs, trl_metrics = trl_rloo_loss(theirs_logps, old, advantages, mask, entropies, eps_low, eps_high)
    theirs.backward()
    ours_logps = logps_init.clone().requires_grad_(True)
    batch = PreparedBatch(torch.zeros(len(mask), 1, dtype=torch.long), mask, advantages, old_logprobs=old,
                          ref_logprobs=ref if cfg.algo.kl_coef else None)
    ours, stats = algo.loss(batch, ours_logps, entropies, None)
    ours.backward()

    torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
    torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, **TOL)
    assert trl_metrics["clip_ratio/low_mean"][0] > 0 and trl_metrics["clip_ratio/high_mean"][0] > 0  # both clips bite
    for key in CLIP_METRICS:
        assert stats[key] == pytest.approx(trl_metrics[key][0], abs=1e-6), key
    assert stats["clip_frac"] == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert stats["token_entropy"] == pytest.approx(trl_metrics["entropy"][0], abs=1e-6)
    gspo_logps = logps_init.clone().requires_grad_(True)  # GSPO's length-normalised ratio is another loss
    clipped_surrogate_loss(gspo_logps, old, advantages, mask, eps_low, eps_high, "sequence",
                           ratio_level="sequence")[0].backward()
    assert (gspo_logps.grad - ours_logps.grad).abs().max() > 1e-3


def test_rloo_completion_without_a_valid_token_adds_trls_gradient_but_not_its_constant(tmp_path):
    """A completion whose mask is all 0 (mask_truncated_completions) has ratio 1 in both and no gradient; TRL's
    mean still adds its −A_i / B to the loss's value, lmrl's sequence mean counts it as 0."""
    logps_init, old, _, advantages, mask, entropies = rloo_case(11)
    mask[3] = 0
    algo, _ = lmrl_rloo_algo(tmp_path, beta=0.0)
    theirs_logps = logps_init.clone().requires_grad_(True)
    theirs, _ = trl_rloo_loss(theirs_logps, old, advantages, mask, entropies, 0.2, 0.2)
    theirs.backward()
    ours_logps = logps_init.clone().requires_grad_(True)
    batch = PreparedBatch(torch.zeros(len(mask), 1, dtype=torch.long), mask, advantages, old_logprobs=old)
    ours, _ = algo.loss(batch, ours_logps, entropies, None)
    ours.backward()
    torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, **TOL)
    torch.testing.assert_close(ours.detach(), theirs.detach() + advantages[3] / len(mask), **TOL)


# -- DPO -------------------------------------------------------------------------------------------------
def trl_dpo(loss_type: str, beta: float, label_smoothing: float, token_logps, ref_chosen, ref_rejected,
            mask):
    """TRL's DPO loss and metrics: `_compute_loss` on a stub model whose per-token log-probs are
    `token_logps` (2B, T − 1), chosen rows first, with the reference log-probs precomputed."""
    rows, width = mask.shape
    zeros = torch.zeros(rows, width - 1)
    out = SimpleNamespace(log_probs=token_logps, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    inputs = {"input_ids": torch.ones(rows, width, dtype=torch.long), "attention_mask": torch.ones(rows, width),
              "completion_mask": mask}
    return trl_dpo_on(out, inputs, ref_chosen, ref_rejected, loss_type, beta, label_smoothing)


def trl_dpo_on(out, inputs: dict, ref_chosen, ref_rejected, loss_type: str = "sigmoid", beta: float = 0.1,
               label_smoothing: float = 0.0):
    """`DPOTrainer._compute_loss` on a stub model that returns `out` (the fused LM head's per-token
    fields) for `inputs` (input_ids, attention_mask, completion_mask), the reference precomputed."""
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=Accelerator(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
        beta=beta, label_smoothing=label_smoothing, use_weighting=False, _metrics=metrics(),
        _total_train_tokens=0, _tp_size=1)
    inputs = {**inputs, "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    loss = DPOTrainer._compute_loss(stub, lambda **kw: out, inputs, return_outputs=False)
    return loss, {k: v[0] for k, v in stub._metrics["train"].items()}


def dpo_case(seed: int, pairs: int = 6, width: int = 20):
    """Random token log-probs of pairs with prompts of 3 tokens and responses of random lengths."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width - 3, (2 * pairs,), generator=gen)
    mask = ((torch.arange(width) >= 3) & (torch.arange(width) < 3 + lengths[:, None])).long()  # (2B, T)
    token_logps = -torch.rand(2 * pairs, width - 1, generator=gen) * 2 * mask[:, 1:]  # 0 off the response
    ref = token_logps.sum(1) + torch.randn(2 * pairs, generator=gen) * 3
    return token_logps, ref[:pairs], ref[pairs:], mask


@pytest.mark.parametrize("loss_type, label_smoothing", [("sigmoid", 0.0), ("ipo", 0.0), ("hinge", 0.0),
                                                        ("robust", 0.1), ("robust", 0.3)])
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_losses_and_reward_stats_are_trls(loss_type, label_smoothing, beta):
    token_logps, ref_chosen, ref_rejected, mask = dpo_case(int(beta * 10) + len(loss_type))
    theirs, trl_stats = trl_dpo(loss_type, beta, label_smoothing, token_logps, ref_chosen, ref_rejected, mask)
    logps, lengths = token_logps.sum(1), mask.sum(1)
    n = len(logps) // 2
    ours, stats = dpo_loss(logps[:n], logps[n:], ref_chosen, ref_rejected, beta=beta, loss_type=loss_type,
                           label_smoothing=label_smoothing, chosen_lengths=lengths[:n], rejected_lengths=lengths[n:])
    torch.testing.assert_close(ours, theirs, **TOL)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert stats[key] == pytest.approx(trl_stats[key], abs=1e-6), key


def test_ipo_summed_is_an_option_that_differs_from_trl():
    token_logps, ref_chosen, ref_rejected, mask = dpo_case(7)
    theirs, _ = trl_dpo("ipo", 0.1, 0.0, token_logps, ref_chosen, ref_rejected, mask)
    logps, n = token_logps.sum(1), len(token_logps) // 2
    summed, _ = dpo_loss(logps[:n], logps[n:], ref_chosen, ref_rejected, beta=0.1, loss_type="ipo",
                         ipo_length_normalize=False)
    assert abs(summed.item() - theirs.item()) > 1.0


def test_trl_sigmoid_ignores_label_smoothing_where_lmrl_applies_cdpo():
    token_logps, ref_chosen, ref_rejected, mask = dpo_case(11)
    theirs, _ = trl_dpo("sigmoid", 0.1, 0.2, token_logps, ref_chosen, ref_rejected, mask)
    logps, n = token_logps.sum(1), len(token_logps) // 2
    plain, _ = dpo_loss(logps[:n], logps[n:], ref_chosen, ref_rejected, beta=0.1)
    cdpo, _ = dpo_loss(logps[:n], logps[n:], ref_chosen, ref_rejected, beta=0.1, label_smoothing=0.2)
    torch.testing.assert_close(plain, theirs, **TOL)
    assert abs(cdpo.item() - theirs.item()) > 1e-3


# -- token diagnostics (DPO, SFT) --------------------------------------------------------------------------
def trl_fused_outputs(logits: torch.Tensor, ids: torch.Tensor, loss_mask: torch.Tensor):
    """What TRL's fused LM head returns for rows `ids` (B, T) whose logits are `logits` (B, T, V) and
    whose labels are the ids where `loss_mask` is 1 (-100 elsewhere): its kernel on the positions
    t < T − 1 predicting ids[t + 1] (the identity as LM head, so a tile is the logits themselves), every
    field zero where the label is -100, as `add_fused_lm_head`'s forward leaves them on a CPU."""
    labels = ids.masked_fill(loss_mask == 0, -100)[:, 1:]
    mask = labels != -100
    vocab = logits.size(-1)
    fields = ChunkedLogProbFunction.apply(logits[:, :-1].reshape(-1, vocab), torch.eye(vocab), None,
                                          labels.clamp(min=0).reshape(-1), 1.0, 32768, None, 1.0,
                                          ("entropy", "mean_logits", "is_top1"))
    names = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    return SimpleNamespace(label_mask=mask, aux_loss=None, **{
        name: None if x is None else x.view(mask.shape).masked_fill(~mask, 0) for name, x in zip(names, fields)})


def random_table(seed: int, vocab: int = 40) -> torch.Tensor:
    """A bigram model's logits after each of `vocab` tokens; after token 1 tokens 4 and 9 tie for the
    maximum (only 4, the first, is the argmax)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, generator=gen) * 3
    table[1, 4] = table[1, 9] = table[1].max() + 1
    return table


def random_pairs(seed: int, vocab: int = 40) -> list[PairExample]:
    """Pairs of prompts and replies of random lengths over tokens 1..vocab − 1, one reply with a loss mask
    that leaves tokens out, and the tie of `random_table` among the predicted tokens."""
    gen = torch.Generator().manual_seed(seed)

    def tokens():
        return torch.randint(1, vocab, (int(torch.randint(1, 7, ()).item()),), generator=gen).tolist()

    pairs = [PairExample(tokens(), tokens(), tokens()) for _ in range(5)]
    pairs.append(PairExample([5, 1], [9, 1, 4], [4, 2, 3, 1], [1, 0, 1], None))
    return pairs


@pytest.mark.parametrize("seed", [0, 1])
def test_dpo_token_metrics_and_num_tokens_are_trls(seed):
    """entropy, logits/chosen, logits/rejected, mean_token_accuracy and num_tokens: TRL's from each side in
    a right-padded row of its own (its collator's layout), lmrl's from both of its layouts."""
    table, pairs = random_table(seed), random_pairs(seed)
    ids, attention, loss_mask = pair_batch(pairs, 0, "cpu")
    inputs = {"input_ids": ids, "attention_mask": attention, "completion_mask": loss_mask}
    ref = torch.zeros(len(pairs))
    _, theirs = trl_dpo_on(trl_fused_outputs(table[ids], ids, loss_mask), inputs, ref, ref)
    for batch in (pair_batch(pairs, 0, "cpu"), pair_rows(pairs, 0, "cpu")):
        _, counted, sums = pair_logps_and_sums(Bigram(table), batch)
        ours = {k: v.value for k, v in dpo_token_metrics(sums, counted).items()}
        assert ours == pytest.approx({k: theirs[k] for k in ours}, abs=1e-6)
    assert 0 < theirs["mean_token_accuracy"] < 1
    trainer = SimpleNamespace(pair=PairTrainer.pair)
    assert sum(PairTrainer.row_tokens(trainer, pair) for pair in pairs) == theirs["num_tokens"]


class SFTAccelerator(Accelerator):
    parallelism_config = None  # no context or sequence parallelism


def trl_sft(out, inputs: dict):
    """`SFTTrainer.compute_loss` (the default nll loss) on a stub model that returns `out`."""
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=SFTAccelerator(), aux_loss_enabled=False,
        compute_loss_func=None, label_smoother=None,
        args=SimpleNamespace(loss_type="nll", average_tokens_across_devices=False), _metrics=metrics(),
        _total_train_tokens=0, _tp_size=1)
    loss = SFTTrainer.compute_loss(stub, lambda **kw: out, dict(inputs))
    return loss, {k: v[0] for k, v in stub._metrics["train"].items()}


def test_sft_loss_token_metrics_and_num_tokens_are_trls():
    table = random_table(2)
    rows = [(pair.prompt + pair.chosen, [0] * len(pair.prompt) + (pair.chosen_mask or [1] * len(pair.chosen)))
            for pair in random_pairs(2)]
    ids, attention, loss_mask = pad_sequences([r[0] for r in rows], [r[1] for r in rows])
    theirs_loss, theirs = trl_sft(trl_fused_outputs(table[ids], ids, loss_mask),
                                  {"input_ids": ids, "attention_mask": attention})
    model = Bigram(table)
    trainer = SimpleNamespace(model=model, _call=lambda: model)
    loss, ours = LmrlSFTTrainer.compute_loss(trainer, (ids, attention, loss_mask))
    torch.testing.assert_close(loss, theirs_loss, **TOL)
    assert ours["entropy"].value == pytest.approx(theirs["entropy"], abs=1e-6)
    assert ours["mean_token_accuracy"].value == pytest.approx(theirs["mean_token_accuracy"], abs=1e-6)
    assert 0 < theirs["mean_token_accuracy"] < 1
    assert sum(LmrlSFTTrainer.row_tokens(trainer, SimpleNamespace(ids=r[0])) for r in rows) == theirs["num_tokens"]


# -- reward model ----------------------------------------------------------------------------------------
def trl_reward_loss(chosen, rejected, margin=None):
    scores = torch.cat([chosen, rejected]).unsqueeze(1)  # (2B, 1), as a sequence-classification head's logits
    stub = SimpleNamespace(model=SimpleNamespace(training=True), accelerator=Accelerator(),
                           args=SimpleNamespace(center_rewards_coefficient=None), _metrics=metrics(),
                           _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.ones(len(scores), 4, dtype=torch.long), "attention_mask": torch.ones(len(scores), 4)}
    if margin is not None:
        inputs["margin"] = margin
    loss = RewardTrainer.compute_loss(stub, lambda **kw: SimpleNamespace(logits=scores), inputs)
    return loss, {k: v[0] for k, v in stub._metrics["train"].items()}


@pytest.mark.parametrize("with_margin", [False, True])
def test_reward_model_loss_is_trls(with_margin):
    gen = torch.Generator().manual_seed(5)
    chosen, rejected = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    margin = torch.rand(16, generator=gen) * 2 if with_margin else None
    theirs, trl_stats = trl_reward_loss(chosen, rejected, margin)
    ours, stats = bradley_terry_loss(chosen, rejected, margin)
    torch.testing.assert_close(ours, theirs, **TOL)
    assert stats["rm/accuracy"] == pytest.approx(trl_stats["accuracy"], abs=1e-6)
    assert stats["rm/margin_mean"] == pytest.approx(trl_stats["margin"], abs=1e-6)
    if with_margin:  # the margin changes the loss: it is used, not read and dropped
        assert abs(ours.item() - bradley_terry_loss(chosen, rejected)[0].item()) > 1e-2


def test_margin_column_is_read_and_checked():
    from lmrl.common.data import DataError
    from lmrl.tasks.preference_data import read_preference

    rows = read_preference([{"prompt": "2+2?", "chosen": "4", "rejected": "5", "margin": 2},
                            {"prompt": "2+3?", "chosen": "5", "rejected": "6"}])
    assert [r.margin for r in rows] == [2.0, None]
    for bad in ("1", True, float("nan")):
        with pytest.raises(DataError, match="row 0: 'margin' must be a finite number"):
            read_preference([{"prompt": "2+2?", "chosen": "4", "rejected": "5", "margin": bad}])


def test_reward_trainer_loss_on_rows_with_margins_is_trls(tmp_path):
    from lmrl.config import load_config
    from lmrl.common.data import write_jsonl
    from lmrl.tasks.text_batches import pair_batch
    from lmrl.train.reward_trainer import RewardTrainer
    from tests.test_hf import save_tiny_llama

    save_tiny_llama(tmp_path / "model", max_positions=64)
    rows = [{"prompt": f"{a}+{b}?", "chosen": f"yes {a + b}", "rejected": f"no {a + b}", "margin": 0.5 * a}
            for a in range(4) for b in range(2)]
    write_jsonl(tmp_path / "pairs.jsonl", rows)
    cfg = load_config(None, ["run.trainer=reward", f"run.dir={tmp_path / 'run'}", "model.type=hf",
                             f"data.train_file={tmp_path / 'pairs.jsonl'}",
                             f"model.path={tmp_path / 'model'}", "data.batch_size=8", "data.max_length=32",
                             "run.progress=false", "run.tensorboard=false", "run.threads=1"])
    trainer = RewardTrainer(cfg)
    batch = trainer.collate(trainer.train_rows)
    ours, stats = trainer.compute_loss(batch)
    ids, attention, _ = pair_batch([pair for pair, _ in trainer.train_rows], trainer.pad_id, "cpu")
    with torch.no_grad():
        scores = trainer.model(ids, attention)  # each side in its own row, as TRL scores it
    n = len(rows)
    margin = torch.tensor([r["margin"] for r in rows])
    theirs, trl_stats = trl_reward_loss(scores[:n], scores[n:], margin)
    torch.testing.assert_close(ours.detach(), theirs, **TOL)
    assert stats["rm/accuracy"] == pytest.approx(trl_stats["accuracy"], abs=1e-6)
    without, _ = trl_reward_loss(scores[:n], scores[n:])
    assert abs(ours.item() - without.item()) > 1e-3  # the margins were used
