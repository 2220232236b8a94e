"""The advantage and loss functions against numbers worked out by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from lmrl.algos.advantages import (gae, gpg_alpha, group_advantages, informative_count, leave_one_out_advantages,
                                   normalize_advantages, token_level_rewards)
from lmrl.algos.losses import (aggregate, clipped_surrogate_loss, explained_variance, high_entropy_mask,
                               importance_ratio, kl_estimate, off_policy_mask, value_loss)

T = torch.tensor


# -- group baselines ---------------------------------------------------------------------------------
REWARDS = T([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])  # group 0: 1, 0, 0 (mean 1/3), group 1: 1, 2, 4 (mean 7/3)


def test_raw_mode_is_the_reward_itself_and_allows_groups_of_one():
    assert_close(group_advantages(REWARDS, 3, "raw"), REWARDS)
    assert_close(group_advantages(REWARDS, 1, "raw"), REWARDS)


def test_grpo_no_std_subtracts_the_group_mean():
    assert_close(group_advantages(REWARDS, 3, "grpo_no_std"), T([2 / 3, -1 / 3, -1 / 3, -4 / 3, -1 / 3, 5 / 3]))


def test_grpo_divides_by_the_groups_sample_std_plus_eps():
    # group 0: sample std of (1, 0, 0) = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    # group 1: sample std of (1, 2, 4) = sqrt(((4/3)^2 + (1/3)^2 + (5/3)^2) / 2) = sqrt(7/3)
    s0, s1 = (1 / 3) ** 0.5, (7 / 3) ** 0.5
    want = T([2 / 3 / s0, -1 / 3 / s0, -1 / 3 / s0, -4 / 3 / s1, -1 / 3 / s1, 5 / 3 / s1])
    assert_close(group_advantages(REWARDS, 3, "grpo", eps=0.0), want)
    assert_close(group_advantages(REWARDS, 3, "grpo", eps=0.5)[0], T(2 / 3 / (s0 + 0.5)))


def test_grpo_on_a_group_that_agrees_gives_zero_not_nan():
    # group 0 (1, 1): std 0, so 0 / eps = 0; group 1 (0, 1): mean 1/2, sample std sqrt(1/2); eps is TRL's 1e-4
    assert_close(group_advantages(T([1.0, 1.0, 0.0, 1.0]), 2, "grpo"), T([0.0, 0.0, -0.5 / (0.5**0.5 + 1e-4),
                                                                          0.5 / (0.5**0.5 + 1e-4)]))


def test_grpo_eps_default_is_trls_and_matters_on_a_near_tied_group():
    # a pair 1.6e-4 apart: centred ±8e-5, sample std 1.13e-4; eps 1e-4 gives ±0.375, eps 1e-6 ±0.701
    rewards = T([0.0, 1.6e-4], dtype=torch.float64)
    std = 1.6e-4 / 2**0.5
    assert_close(group_advantages(rewards, 2), T([-8e-5, 8e-5], dtype=torch.float64) / (std + 1e-4))
    assert group_advantages(rewards, 2)[1].item() == pytest.approx(0.375345, abs=1e-6)
    assert group_advantages(rewards, 2, eps=1e-6)[1].item() == pytest.approx(0.700912, abs=1e-6)


def test_grpo_batch_scale_divides_every_group_by_the_batchs_std():
    # centred as by group: (2/3, −1/3, −1/3, −4/3, −1/3, 5/3); the batch's sample std of all six rewards
    batch_std = REWARDS.std().item()
    centred = group_advantages(REWARDS, 3, "grpo_no_std")
    assert_close(group_advantages(REWARDS, 3, "grpo", eps=0.0, scale="batch"), centred / batch_std)
    assert_close(group_advantages(REWARDS, 3, "grpo", scale="batch"), centred / (batch_std + 1e-4))


def test_grpo_scale_none_is_grpo_no_std():
    assert_close(group_advantages(REWARDS, 3, "grpo", scale="none"), group_advantages(REWARDS, 3, "grpo_no_std"))


def test_batch_scale_of_token_rewards_is_per_position():
    rewards = T([[1.0, 0.0], [0.0, 0.0], [1.0, 2.0], [1.0, 0.0]])
    stds = rewards.std(0)  # (2,): one per position over all four rows
    centred = group_advantages(rewards, 2, "grpo_no_std")
    assert_close(group_advantages(rewards, 2, "grpo", eps=0.0, scale="batch"), centred / stds)


@pytest.mark.parametrize("mode", ["raw", "grpo_no_std"])
def test_batch_scale_is_refused_where_there_is_no_division(mode):
    with pytest.raises(ValueError, match="scale_rewards 'batch'"):
        group_advantages(REWARDS, 3, mode, scale="batch")


def test_unknown_scale_is_refused():
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(REWARDS, 3, "grpo", scale="std")


def test_token_rewards_get_group_statistics_per_position():
    rewards = T([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])  # two groups of two, two positions
    assert_close(group_advantages(rewards, 2, "grpo_no_std"), T([[0.5, 0.0], [-0.5, 0.0], [0.0, 0.5], [0.0, -0.5]]))
    # a pair (a, b) has sample std |a − b|/sqrt(2), so ±0.5 / (sqrt(1/2) + eps); agreeing pairs give 0
    h = 0.5 / (0.5**0.5 + 1e-4)
    assert_close(group_advantages(rewards, 2, "grpo"), T([[h, 0.0], [-h, 0.0], [0.0, h], [0.0, -h]]))


def test_leave_one_out_subtracts_the_mean_of_the_others():
    # group 0: 1 - 0 = 1, 0 - 1/2, 0 - 1/2; group 1: 1 - 3, 2 - 5/2, 4 - 3/2
    assert_close(leave_one_out_advantages(REWARDS, 3), T([1.0, -0.5, -0.5, -2.0, -0.5, 2.5]))
    # per position, groups of two: r_i − r_other
    assert_close(leave_one_out_advantages(T([[1.0, 3.0], [0.0, 7.0]]), 2), T([[1.0, -4.0], [-1.0, 4.0]]))


@pytest.mark.parametrize("call, message", [
    (lambda: group_advantages(REWARDS, 1, "grpo"), "group_size must be >= 2"),
    (lambda: group_advantages(REWARDS, 1, "grpo_no_std"), "group_size must be >= 2"),
    (lambda: group_advantages(REWARDS, 0, "raw"), "group_size must be >= 1"),
    (lambda: group_advantages(REWARDS, 4, "grpo"), "do not split into groups of 4"),
    (lambda: group_advantages(REWARDS, 4, "raw"), "do not split into groups of 4"),
    (lambda: group_advantages(REWARDS, 3, "mean"), "must be one of raw, grpo, grpo_no_std"),
    (lambda: leave_one_out_advantages(REWARDS, 1), "group_size >= 2"),
    (lambda: leave_one_out_advantages(REWARDS, 4), "do not split into groups of 4"),
])
def test_group_baselines_refuse_what_they_cannot_compute(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_batch_normalisation_ignores_masked_entries():
    adv, mask = T([[1.0, 3.0, 100.0], [5.0, 7.0, -50.0]]), T([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = normalize_advantages(adv, mask)
    std = 5**0.5  # valid 1, 3, 5, 7: mean 4, population variance (9 + 1 + 1 + 9) / 4 = 5
    assert_close(out, T([[-3 / std, -1 / std, 0.0], [1 / std, 3 / std, 0.0]]))
    valid = out[mask.bool()]
    assert_close(valid.mean(), T(0.0))
    assert_close(valid.std(correction=0), T(1.0))
    adv[0, 2] = -1e6
    assert_close(normalize_advantages(adv, mask), out)


def test_batch_normalisation_of_sequence_advantages_uses_the_population_std():
    # 0, 2: mean 1, population std 1 (the sample std would be sqrt(2))
    assert_close(normalize_advantages(T([0.0, 2.0]), eps=0.0), T([-1.0, 1.0]))


# -- token rewards and GAE ----------------------------------------------------------------------------
MASK = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # ragged: 3 tokens and 1 token


def test_a_sequence_reward_lands_on_the_last_valid_token():
    assert_close(token_level_rewards(T([2.0, -1.0]), MASK), T([[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0]]))
    mask = T([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # a row with no token drops its reward
    assert_close(token_level_rewards(T([2.0, -1.0]), mask), T([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))


def test_a_sequence_reward_lands_on_the_last_valid_token_of_a_row_with_holes():
    mask = T([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])  # an agent episode: turn, observation, turn, padding
    assert_close(token_level_rewards(T([2.0, -1.0]), mask), T([[0.0, 0.0, 2.0, 0.0], [0.0, -1.0, 0.0, 0.0]]))


def test_token_rewards_pass_through_masked():
    assert_close(token_level_rewards(T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), MASK), T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]))


GAE_REWARDS, GAE_VALUES = T([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]]), T([[0.5, 1.0, 1.5], [2.0, 0.0, 0.0]])


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value():
    adv, ret = gae(GAE_REWARDS, GAE_VALUES, MASK, gamma=1.0, lam=1.0)
    assert_close(adv, T([[3.0 - 0.5, 2.0 - 1.0, 2.0 - 1.5], [1.0, 0.0, 0.0]]))  # reward-to-go 3, 2, 2
    assert_close(ret, T([[3.0, 2.0, 2.0], [3.0, 0.0, 0.0]]))
    adv, ret = gae(GAE_REWARDS, GAE_VALUES, MASK, gamma=0.9, lam=1.0)
    # discounted returns: 1 + 0.81·2 = 2.62, 0.9·2 = 1.8, 2
    assert_close(adv[0], T([2.62 - 0.5, 1.8 - 1.0, 2.0 - 1.5]))
    assert_close(ret[0], T([2.62, 1.8, 2.0]))


def test_gae_with_lambda_zero_is_the_one_step_td_error():
    adv, _ = gae(GAE_REWARDS, GAE_VALUES, MASK, gamma=0.9, lam=0.0)
    assert_close(adv, T([[1 + 0.9 * 1.0 - 0.5, 0 + 0.9 * 1.5 - 1.0, 2 - 1.5], [3.0 - 2.0, 0.0, 0.0]]))


def test_gae_in_between():
    # γ = 1, λ = 0.5: δ = (1 + 1 − 0.5, 0 + 1.5 − 1, 2 − 1.5) = (1.5, 0.5, 0.5)
    # A_2 = 0.5, A_1 = 0.5 + 0.5·0.5 = 0.75, A_0 = 1.5 + 0.5·0.75 = 1.875
    adv, ret = gae(GAE_REWARDS, GAE_VALUES, MASK, gamma=1.0, lam=0.5)
    assert_close(adv[0], T([1.875, 0.75, 0.5]))
    assert_close(ret[0], T([2.375, 1.75, 2.0]))


def test_gae_never_reads_padding_and_writes_zeros_there():
    rewards, values = GAE_REWARDS.clone(), GAE_VALUES.clone()
    clean = gae(rewards, values, MASK, 0.9, 0.95)
    rewards[1, 1:], values[1, 1:] = 99.0, -99.0
    for got, want in zip(gae(rewards, values, MASK, 0.9, 0.95), clean):
        assert_close(got, want)
        assert (got[1, 1:] == 0).all()


def test_gae_steps_over_an_episodes_observation_tokens():
    # turn tokens 0, 1 | observation tokens 2, 3 | turn token 4 | padding 5; the reward on the last turn token
    mask = T([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    rewards, values = T([[0.0, 0.0, 7.0, 7.0, 1.0, 7.0]]), T([[0.2, 0.4, 9.0, 9.0, 0.6, 9.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # δ4 = 1 − 0.6 = 0.4; δ1 = 0.9·0.6 − 0.4 = 0.14; δ0 = 0.9·0.4 − 0.2 = 0.16
    # A4 = 0.4, A1 = 0.14 + 0.45·0.4 = 0.32, A0 = 0.16 + 0.45·0.32 = 0.304
    assert_close(adv, T([[0.304, 0.32, 0.0, 0.0, 0.4, 0.0]]))
    assert_close(ret, T([[0.504, 0.72, 0.0, 0.0, 1.0, 0.0]]))
    # with λ = γ = 1 every turn token's advantage is the episode's return minus its value
    adv, _ = gae(rewards, values, mask)
    assert_close(adv, T([[0.8, 0.6, 0.0, 0.0, 0.4, 0.0]]))


def test_gae_is_a_constant():
    adv, ret = gae(GAE_REWARDS, GAE_VALUES.clone().requires_grad_(), MASK)
    assert not adv.requires_grad and not ret.requires_grad


# -- aggregation and the clipped surrogate -------------------------------------------------------------
def test_token_and_sequence_aggregation_differ_on_ragged_lengths():
    x = T([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    assert_close(aggregate(x, MASK, "token"), T(16 / 4))  # (1 + 2 + 3 + 10) / 4 tokens
    assert_close(aggregate(x, MASK, "sequence"), T((2.0 + 10.0) / 2))  # mean of row means 2 and 10
    assert_close(aggregate(x, MASK, "constant", constant=5), T(16 / (2 * 5)))
    assert_close(aggregate(x, None, "token"), T(16 / 6))
    with pytest.raises(ValueError, match="needs a positive normaliser"):
        aggregate(x, MASK, "constant")
    with pytest.raises(ValueError, match="token, sequence, constant"):
        aggregate(x, MASK, "tokens")


def test_an_empty_row_counts_as_zero_in_the_sequence_mean():
    x, mask = T([[4.0, 2.0], [7.0, 7.0]]), T([[1.0, 1.0], [0.0, 0.0]])
    assert_close(aggregate(x, mask, "sequence"), T((3.0 + 0.0) / 2))


def surrogate(ratio, adv, left=0.1, right=0.3, mask=None, level="token"):
    logp = torch.log(T(ratio)).requires_grad_()
    loss, stats = clipped_surrogate_loss(logp, torch.zeros_like(logp), T(adv), mask, left, right, level)
    loss.backward()
    return loss.item(), logp.grad, stats


def test_the_clip_is_asymmetric():
    # A > 0: 1.2 is inside [0.9, 1.3], 1.4 is cut to 1.3; A < 0: 0.85 is cut to 0.9, 1.2 is not clipped
    loss, grad, stats = surrogate([[1.2, 1.4, 0.85, 1.2]], [[1.0, 1.0, -1.0, -1.0]])
    assert loss == pytest.approx(-(1.2 + 1.3 - 0.9 - 1.2) / 4)
    assert grad[0, 1] == 0 and grad[0, 2] == 0  # clipped: no gradient
    assert grad[0, 0] == pytest.approx(-1.2 / 4) and grad[0, 3] == pytest.approx(1.2 / 4)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx((1.2 + 1.4 + 0.85 + 1.2) / 4)
    # (ρ − 1) − ln ρ: 0.2 − 0.18232 = 0.01768 (twice), 0.4 − 0.33647 = 0.06353, −0.15 + 0.16252 = 0.01252
    assert stats["approx_kl"] == pytest.approx((2 * 0.0176784 + 0.0635278 + 0.0125189) / 4, rel=1e-4)


def test_the_same_ratio_is_clipped_on_one_side_only():
    # 0.85 with A > 0: min(0.85, 0.9) = 0.85, unclipped; 1.4 with A < 0: min(−1.4, −1.3) = −1.4, unclipped;
    # 1.4 with A = 0 is outside the band but the clip changes nothing, so it does not count
    loss, grad, stats = surrogate([[0.85, 1.4, 1.4]], [[1.0, -1.0, 0.0]])
    assert loss == pytest.approx((-0.85 + 1.4 + 0.0) / 3)
    assert_close(grad, T([[-0.85 / 3, 1.4 / 3, 0.0]]))
    assert stats["clip_frac"] == 0


def test_masked_tokens_never_contribute_to_the_surrogate():
    mask = T([[1.0, 0.0]])
    loss_a, grad_a, stats_a = surrogate([[1.1, 1.2]], [[1.0, 5.0]], mask=mask)
    loss_b, grad_b, stats_b = surrogate([[1.1, 0.3]], [[1.0, -7.0]], mask=mask)  # would be clipped if valid
    assert loss_a == pytest.approx(loss_b) == pytest.approx(-1.1)
    assert_close(grad_a, T([[-1.1, 0.0]]))
    assert_close(grad_b, grad_a)
    assert stats_a == pytest.approx(stats_b) and stats_b["clip_frac"] == 0 and stats_b["ratio_mean"] == pytest.approx(1.1)
    # padding whose log-probs disagree wildly (ρ = e^200 overflows) still adds nothing, not a nan
    logp = T([[0.0953102, 0.0]], requires_grad=True)  # ln 1.1
    loss, stats = clipped_surrogate_loss(logp, T([[0.0, -200.0]]), T([[1.0, -7.0]]), mask, 0.1, 0.3)
    loss.backward()
    assert loss.item() == pytest.approx(-1.1) and stats["approx_kl"] == pytest.approx(stats_a["approx_kl"], abs=1e-6)
    assert_close(logp.grad, grad_a)


def test_sequence_advantages_are_shared_by_a_sequences_tokens():
    # ρ = 1 everywhere, A = (2, −1): per-token losses −2, −2 | 1 (the last token is padding)
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    loss, _, _ = surrogate([[1.0, 1.0], [1.0, 1.0]], [2.0, -1.0], mask=mask)
    assert loss == pytest.approx((-2 - 2 + 1) / 3)
    loss, _, _ = surrogate([[1.0, 1.0], [1.0, 1.0]], [2.0, -1.0], mask=mask, level="sequence")
    assert loss == pytest.approx((-2 + 1) / 2)


def test_at_ratio_one_the_surrogate_gradient_is_the_policy_gradient():
    logp = torch.randn(3, 4, requires_grad=True)
    adv, mask = torch.randn(3), T([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    loss, _ = clipped_surrogate_loss(logp, logp.detach(), adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    (pg,) = torch.autograd.grad(-aggregate(logp * adv[:, None], mask, "token"), logp)
    assert_close(grad, pg)
    assert (grad[mask == 0] == 0).all() and (grad[mask == 1] != 0).all()


def test_old_logprobs_and_advantages_get_no_gradient():
    logp, old, adv = torch.zeros(1, 2, requires_grad=True), torch.zeros(1, 2, requires_grad=True), T([1.0]).requires_grad_()
    loss, _ = clipped_surrogate_loss(logp, old, adv)
    loss.backward()
    assert old.grad is None and adv.grad is None and logp.grad is not None


# -- ratio level (GSPO), the ratio cap (INTELLECT-2), the high-entropy and off-policy masks -------------
LN = math.log
S0 = math.sqrt(1.1 * 0.9)  # row 0's sequence ratio: exp of the mean of ln 1.1 and ln 0.9 = 0.9949874
S2 = math.sqrt(1.2 * 1.5)  # row 2's: 1.3416408
RATIO_ROWS = T([[LN(1.1), LN(0.9)], [LN(0.5), 0.0], [LN(1.2), LN(1.5)]])  # row 1's second token is padding
RATIO_MASK = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])


def test_the_token_and_gspo_ratio_levels_by_hand():
    assert_close(importance_ratio(RATIO_ROWS, RATIO_MASK), T([[1.1, 0.9], [0.5, 1.0], [1.2, 1.5]]))
    assert_close(importance_ratio(RATIO_ROWS, RATIO_MASK, "sequence"), T([[S0], [0.5], [S2]]))
    log_ratio = RATIO_ROWS.clone().requires_grad_()
    gspo_token = importance_ratio(log_ratio, RATIO_MASK, "sequence_token")
    assert_close(gspo_token.detach(), T([[S0, S0], [0.5, 0.5], [S2, S2]]))  # the sequence's value at each token
    (row0_t0,) = torch.autograd.grad(gspo_token[0, 0], log_ratio)  # ... and the token's own gradient, times it
    assert_close(row0_t0, T([[S0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    (seq,) = torch.autograd.grad(importance_ratio(log_ratio, RATIO_MASK, "sequence")[0, 0], log_ratio)
    assert_close(seq, T([[S0 / 2, S0 / 2], [0.0, 0.0], [0.0, 0.0]]))  # GSPO: ds/dlog ρ_t = s / |y|
    assert_close(importance_ratio(T([[0.3, 0.1]]), T([[0.0, 0.0]]), "sequence"), T([[1.0]]))  # no valid token
    with pytest.raises(ValueError, match="token, sequence, sequence_token"):
        importance_ratio(RATIO_ROWS, RATIO_MASK, "sentence")


def test_one_clipped_ratio_per_sequence_by_hand():
    # clip [0.8, 1.2]; row 0 (A = 1): s = 0.995, inside; row 1 (A = −1): s = 0.5, clipped up to 0.8;
    # row 2 (A = 1): s = 1.342, clipped down to 1.2. Token means over 5 valid tokens.
    logp = RATIO_ROWS.clone().requires_grad_()
    loss, stats = clipped_surrogate_loss(logp, torch.zeros(3, 2), T([1.0, -1.0, 1.0]), RATIO_MASK, 0.2, 0.2,
                                         ratio_level="sequence")
    loss.backward()
    assert loss.item() == pytest.approx((-2 * S0 + 0.8 - 2 * 1.2) / 5)  # -0.7179950
    assert_close(logp.grad, T([[-S0 / 5, -S0 / 5], [0.0, 0.0], [0.0, 0.0]]))  # d(−2s/5)/dlog ρ_t = −2/5 · s/2
    # TRL's clip_ratio/* count sequences: 1 of 3 clipped low, 1 of 3 high
    assert stats["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 3)
    assert stats["clip_frac"] == stats["clip_ratio/region_mean"] == pytest.approx(2 / 3)
    assert (stats["clip_ratio/low_min"], stats["clip_ratio/high_max"]) == (0.0, 1.0)
    assert stats["ratio_mean"] == pytest.approx((S0 + 0.5 + S2) / 3)


def test_the_summed_sequence_ratio_is_the_ratio_of_the_completions_probabilities():
    # TRL's RLOO ratio: exp(Σ_t log ρ_t), no length normalisation; each token's gradient is s itself
    log_ratio = RATIO_ROWS.clone().requires_grad_()
    ratio = importance_ratio(log_ratio, RATIO_MASK, "sequence_sum")
    assert_close(ratio.detach(), T([[1.1 * 0.9], [0.5], [1.2 * 1.5]]))  # row 1's padding left out
    (row0,) = torch.autograd.grad(ratio[0, 0], log_ratio)
    assert_close(row0, T([[0.99, 0.99], [0.0, 0.0], [0.0, 0.0]]))
    assert_close(importance_ratio(T([[0.3, 0.1]]), T([[0.0, 0.0]]), "sequence_sum"), T([[1.0]]))  # no valid token


def test_trls_rloo_loss_by_hand():
    # ratio_level=sequence_sum, level=sequence, clip [0.8, 1.2]: row 0 (A = 1) s = 0.99 inside; row 1 (A = −1)
    # s = 0.5 clipped up to 0.8; row 2 (A = 1) s = 1.8 clipped down to 1.2. A mean over the 3 completions.
    logp = RATIO_ROWS.clone().requires_grad_()
    loss, stats = clipped_surrogate_loss(logp, torch.zeros(3, 2), T([1.0, -1.0, 1.0]), RATIO_MASK, 0.2, 0.2,
                                         level="sequence", ratio_level="sequence_sum")
    loss.backward()
    assert loss.item() == pytest.approx((-0.99 + 0.8 - 1.2) / 3)
    assert_close(logp.grad, T([[-0.99 / 3, -0.99 / 3], [0.0, 0.0], [0.0, 0.0]]))
    # clip_ratio/* count completions, as TRL's RLOOTrainer does: 1 of 3 clipped low, 1 of 3 high
    assert (stats["clip_ratio/low_mean"], stats["clip_ratio/high_mean"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    assert stats["clip_frac"] == stats["clip_ratio/region_mean"] == pytest.approx(2 / 3)
    assert (stats["clip_ratio/low_min"], stats["clip_ratio/high_max"]) == (0.0, 1.0)
    assert stats["ratio_mean"] == pytest.approx((0.99 + 0.5 + 1.8) / 3)

def test_gspo_token_is_gspo_with_each_tokens_own_advantage():
    # row 0 with token advantages (2, 0): GSPO spreads the first token's credit over both tokens' log-probs,
    # GSPO-token keeps it on the first; both equal GSPO's with one advantage per sequence (row 1: A = 1)
    advantages = T([[2.0, 0.0], [1.0, 1.0]])
    grads = {}
    for level in ("sequence", "sequence_token"):
        logp = RATIO_ROWS[[0, 2]].clone().requires_grad_()
        loss, _ = clipped_surrogate_loss(logp, torch.zeros(2, 2), advantages, None, 0.2, 0.5, ratio_level=level)
        loss.backward()
        assert loss.item() == pytest.approx((-2 * S0 - 2 * S2) / 4)
        grads[level] = logp.grad
    assert_close(grads["sequence"], T([[-S0 / 4, -S0 / 4], [-S2 / 4, -S2 / 4]]))
    assert_close(grads["sequence_token"], T([[-2 * S0 / 4, 0.0], [-S2 / 4, -S2 / 4]]))


def test_the_ratio_cap_bounds_the_unclipped_term_of_a_negative_advantage():
    # clip [0.8, 1.2], cap 2: ρ = 3 with A = −1 adds min(−2, −1.2) = −2 → loss 2, no gradient (uncapped: 3,
    # gradient 3); ρ = 1.5 with A = −1 is under the cap: 1.5 and its gradient; ρ = 3 with A = 1 was clipped at
    # 1.2 anyway
    ratios, advantages = [[3.0, 1.5, 3.0]], [[-1.0, -1.0, 1.0]]
    logp = torch.log(T(ratios)).requires_grad_()
    loss, stats = clipped_surrogate_loss(logp, torch.zeros(1, 3), T(advantages), None, 0.2, 0.2, ratio_max=2.0)
    loss.backward()
    assert loss.item() == pytest.approx((2.0 + 1.5 - 1.2) / 3)
    assert_close(logp.grad, T([[0.0, 1.5 / 3, 0.0]]))
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 3)  # the capped 2 > 1.2 still counts, as in TRL
    assert stats["clip_frac_capped"] == pytest.approx(1 / 3)  # only ρ = 3 with A = −1 (verl's pg_clipfrac_lower)
    _, masked = clipped_surrogate_loss(logp, torch.zeros(1, 3), T(advantages), T([[0.0, 1.0, 1.0]]), ratio_max=2.0)
    assert masked["clip_frac_capped"] == 0.0  # the capped token is padding
    _, sequences = clipped_surrogate_loss(torch.log(T([[3.0], [1.0]])), torch.zeros(2, 1), T([-1.0, -1.0]),
                                          ratio_level="sequence_sum", ratio_max=2.0)
    assert sequences["clip_frac_capped"] == pytest.approx(1 / 2)  # counted per completion
    assert "clip_frac_capped" not in clipped_surrogate_loss(logp, torch.zeros(1, 3), T(advantages))[1]
    loss, _, _ = surrogate(ratios[0:1], advantages, left=0.2, right=0.2)
    assert loss == pytest.approx((3.0 + 1.5 - 1.2) / 3)


def test_token_weights_leave_tokens_out_but_keep_the_normaliser():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = clipped_surrogate_loss(logp, torch.zeros(1, 2), T([1.0]), T([[1.0, 1.0]]), token_weights=T([[1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1 / 2)  # one token trains, the mean is still over both
    assert_close(logp.grad, T([[-0.5, 0.0]]))


ENTROPY = T([[0.1, 0.5, 0.9], [0.3, 0.7, 5.0]])  # 5.0 sits on padding
ENTROPY_MASK = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


@pytest.mark.parametrize("quantile, kept", [
    (0.5, [[0, 1, 1], [0, 1, 0]]),  # τ = median of 0.1, 0.3, 0.5, 0.7, 0.9 = 0.5 (with the padding's 5.0: 0.6)
    (0.2, [[0, 0, 1], [0, 0, 0]]),  # τ = 0.8-quantile: 0.7 + 0.2·(0.9 − 0.7) = 0.74
    (1.0, [[1, 1, 1], [1, 1, 0]]),  # τ = the minimum: every valid token
    (0.0, [[0, 0, 1], [0, 0, 0]]),  # τ = the maximum
])
def test_high_entropy_tokens_by_hand(quantile, kept):
    assert high_entropy_mask(ENTROPY, ENTROPY_MASK, quantile).tolist() == T(kept).bool().tolist()


def test_no_valid_token_keeps_none_and_the_entropy_mask_is_a_constant():
    assert not high_entropy_mask(ENTROPY, torch.zeros(2, 3), 0.5).any()
    entropy = ENTROPY.clone().requires_grad_()
    assert not high_entropy_mask(entropy, ENTROPY_MASK, 0.5).requires_grad


def test_off_policy_mask_drops_drifted_completions_with_negative_advantage():
    # mean log π_old − log π over valid tokens, threshold 0.1: row 0 drifted 0.2 with A < 0: dropped;
    # row 1 drifted 0 (A < 0), row 2 drifted 1.0 but A > 0, row 3's padding (100) is not read: kept
    old = T([[0.3, 0.1], [0.05, -0.05], [1.0, 1.0], [0.05, 100.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    keep = off_policy_mask(T([-1.0, -1.0, 1.0, -1.0]), torch.zeros(4, 2), old, mask, 0.1)
    assert keep.tolist() == [[0.0], [1.0], [1.0], [1.0]]
    assert off_policy_mask(T([0.0]), T([[0.0]]), T([[5.0]]), None, 0.1).tolist() == [[1.0]]  # A = 0 is kept
    assert off_policy_mask(T([-1.0]), T([[0.0, 0.0]]), T([[float("nan"), 0.5]]), None, 0.1).tolist() == [[0.0]]
    # token advantages: kept per token by its own sign
    keep = off_policy_mask(T([[1.0, -1.0]]), torch.zeros(1, 2), T([[1.0, 1.0]]), None, 0.1)
    assert keep.tolist() == [[1.0, 0.0]]


# -- KL, entropy, value loss, explained variance ------------------------------------------------------
def test_kl_estimators_by_hand():
    logp, ref = T([-1.0, -2.0]), T([-1.5, -1.0])  # log r = 0.5, -1.0
    assert_close(kl_estimate(logp, ref, "k1"), T([0.5, -1.0]))
    assert_close(kl_estimate(logp, ref, "k2"), T([0.125, 0.5]))
    # k3: e^-0.5 − 1 + 0.5 = 0.6065307 − 0.5 = 0.1065307; e^1 − 1 − 1 = 0.7182818
    assert_close(kl_estimate(logp, ref, "k3"), T([0.1065307, 0.7182818]))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


def test_a_kl_clamp_bounds_each_estimate_and_stops_its_gradient_there():
    logp = T([-1.0, -30.0, -1.0, -1.0]).requires_grad_()
    ref = T([-1.5, -1.0, -1.5, -100.0])  # log r = 0.5, -29 (k3 = e^29 - 30: 3.9e12), 0.5, 99
    k3 = kl_estimate(logp, ref, "k3", clamp=10.0)
    assert_close(k3, T([0.1065307, 10.0, 0.1065307, 10.0]))  # e^-99 - 1 + 99 = 98 > 10
    k3.sum().backward()
    assert_close(logp.grad, T([1 - 0.6065307, 0.0, 1 - 0.6065307, 0.0]))
    assert_close(kl_estimate(logp, ref, "k1", clamp=10.0), T([0.5, -10.0, 0.5, 10.0]))
    # no clamp: e^-log r overflows nowhere here, and the estimate is the unbounded one
    assert kl_estimate(logp, ref, "k3")[1].item() > 1e12


def test_kl_gradient_flows_through_the_policy_only():
    logp, ref = T([-1.0, -2.0]).requires_grad_(), T([-1.5, -1.0]).requires_grad_()
    kl_estimate(logp, ref, "k3").sum().backward()
    assert_close(logp.grad, T([1 - 0.6065307, 1 - 2.7182818]))  # d k3 / d log r = 1 − e^(−log r)
    assert ref.grad is None


def test_k3_is_never_negative_and_zero_when_the_policies_agree():
    logp, ref = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert_close(kl_estimate(logp, logp, "k3"), torch.zeros(1000))


def test_value_loss_clipped_and_unclipped():
    values, old, returns = T([[2.0, 0.0]]), T([[1.0, 0.0]]), T([[3.0, 1.0]])
    loss, _ = value_loss(values, old, returns)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    # clip 0.5: V_clip = (1.5, 0.0): errors (3 - 1.5)^2 = 2.25 > 1 is taken at the first token
    values.requires_grad_()
    loss, stats = value_loss(values, old, returns, clip_range=0.5)
    assert loss.item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert stats["value_clip_frac"] == pytest.approx(0.5)
    loss.backward()  # the clipped term is flat in V at the first token; (V − R)/2 = −0.5 at the second
    assert_close(values.grad, T([[0.0, -0.5]]))


def test_value_clip_keeps_the_larger_error():
    # V moves from 1 to 4 with R = 3: unclipped error 1, V_clip = 1.5 gives 2.25, larger, so it is kept
    # V moves from 1 to 0 with R = 3: unclipped error 9, V_clip = 0.5 gives 6.25, smaller: unclipped
    loss, stats = value_loss(T([4.0, 0.0]), T([1.0, 1.0]), T([3.0, 3.0]), clip_range=0.5)
    assert loss.item() == pytest.approx(0.5 * (2.25 + 9.0) / 2)
    assert stats["value_clip_frac"] == pytest.approx(0.5)
    loss, _ = value_loss(T([[4.0, 0.0]]), T([[1.0, 1.0]]), T([[3.0, 3.0]]), T([[0.0, 1.0]]), clip_range=0.5)
    assert loss.item() == pytest.approx(0.5 * 9.0)


def test_explained_variance_is_one_for_perfect_values_and_zero_for_the_mean():
    returns = T([1.0, 2.0, 3.0, 6.0])
    assert explained_variance(returns.clone(), returns) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 3.0), returns) == pytest.approx(0.0)
    # Var(R) = 3.5, Var(R − V) for V = (1, 2, 3, 4): residuals 0, 0, 0, 2, population var 0.75
    assert explained_variance(T([1.0, 2.0, 3.0, 4.0]), returns) == pytest.approx(1 - 0.75 / 3.5)
    mask = T([[1.0, 1.0, 0.0]])  # padding values do not count
    assert explained_variance(T([[1.0, 2.0, 50.0]]), T([[1.0, 2.0, 0.0]]), mask) == pytest.approx(1.0)
    assert math.isnan(explained_variance(T([1.0, 2.0]), T([4.0, 4.0])))  # the returns do not vary


@pytest.mark.parametrize("overrides", [["algo.name=rloo"], ["algo.name=grpo", "algo.adv_mode=grpo_no_std"],
                                       ["algo.name=grpo", "algo.adv_mode=raw"]])
def test_config_refuses_batch_scale_where_nothing_is_divided(overrides):
    from lmrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="algo.scale_rewards=batch divides grpo's advantages"):
        load_config(None, [*overrides, "algo.group_size=4", "algo.scale_rewards=batch"])
    load_config(None, ["algo.name=grpo", "algo.group_size=4", "algo.scale_rewards=batch"])  # grpo's own: accepted


def test_grpo_algorithm_passes_scale_rewards_to_its_advantages():
    from lmrl.algos import build_algorithm
    from lmrl.config import AlgoConfig

    algo = build_algorithm(AlgoConfig(name="grpo", group_size=3, scale_rewards="batch"))
    advantages = algo.group_advantages(ONE_PROCESS, REWARDS, torch.ones(6, 2))
    assert_close(advantages, group_advantages(REWARDS, 3, "grpo", scale="batch"))
    assert not torch.allclose(advantages, group_advantages(REWARDS, 3, "grpo"))


class _OneProcess:
    """A learner's reduction on one process: the sum is the tensor itself."""

    @staticmethod
    def all_reduce_sum(t):
        return t


ONE_PROCESS = _OneProcess()


# -- verl's group estimators: grpo_passk, opo, gpg -------------------------------------------------
def test_passk_gives_only_each_groups_best_the_gap_to_the_runner_up_over_the_group_std():
    # group 0: 1, 0, 0 → best row 0, gap 1, std sqrt(1/3); group 1: 1, 2, 4 → best row 5, gap 2, std sqrt(7/3)
    want = T([1 / (1 / 3) ** 0.5, 0, 0, 0, 0, 2 / (7 / 3) ** 0.5])
    assert_close(group_advantages(REWARDS, 3, "passk", eps=0.0), want)
    assert_close(group_advantages(REWARDS, 3, "passk", eps=0.5)[5], T(2 / ((7 / 3) ** 0.5 + 0.5)))
    assert_close(group_advantages(REWARDS, 3, "passk", scale="none"), T([1.0, 0, 0, 0, 0, 2.0]))
    # equal best: the first of them, with a gap of 0 (nothing to learn); a tied group: all 0
    assert_close(group_advantages(T([2.0, 0.0, 2.0, 5.0, 5.0, 5.0]), 3, "passk", eps=0.0), torch.zeros(6))


def test_passk_matches_an_independent_transcription_of_verls_loop():
    torch.manual_seed(0)
    rewards = torch.randint(0, 4, (24,)).float()
    want = torch.zeros(24)
    for start in range(0, 24, 4):  # verl's grpo_passk: per group, r_max - r_second_max at the max, / (std + eps)
        group = rewards[start:start + 4]
        ordered = sorted(group.tolist(), reverse=True)
        best = max(range(4), key=lambda i: (group[i].item(), -i))
        want[start + best] = (ordered[0] - ordered[1]) / (group.std().item() + 1e-6)
    assert_close(group_advantages(rewards, 4, "passk", eps=1e-6), want)


def test_opo_baseline_is_each_groups_length_weighted_mean_reward():
    lengths = T([1.0, 2.0, 1.0, 3.0, 1.0, 0.0])
    # group 0: (1·1 + 0·2 + 0·1) / 4 = 0.25; group 1: (1·3 + 2·1 + 4·0) / 4 = 1.25
    want = T([0.75, -0.25, -0.25, -0.25, 0.75, 2.75])
    assert_close(group_advantages(REWARDS, 3, "opo", lengths=lengths), want)
    # equal lengths: the plain group mean; a group without tokens: its plain mean too
    assert_close(group_advantages(REWARDS, 3, "opo", lengths=torch.full((6,), 5.0)),
                 group_advantages(REWARDS, 3, "grpo_no_std"))
    assert_close(group_advantages(REWARDS, 3, "opo", lengths=torch.zeros(6)),
                 group_advantages(REWARDS, 3, "grpo_no_std"))
    with pytest.raises(ValueError, match="pass lengths"):
        group_advantages(REWARDS, 3, "opo")


def test_gpg_scales_the_centred_rewards_by_the_batch_over_its_informative_completions():
    rewards = T([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # group 1 tied: 3 of 6 completions informative, α = 2
    assert informative_count(rewards, 3) == (6, 3)
    assert_close(group_advantages(rewards, 3, "gpg"), 2 * group_advantages(rewards, 3, "grpo_no_std"))
    assert_close(group_advantages(REWARDS, 3, "gpg"), group_advantages(REWARDS, 3, "grpo_no_std"))  # α = 1
    assert_close(group_advantages(rewards, 3, "gpg", alpha=4.0), 4 * group_advantages(rewards, 3, "grpo_no_std"))
    assert gpg_alpha(6, 0) == 1.0  # nothing informative: every advantage is 0 anyway
    # token rewards: a group differs where any position does
    assert informative_count(T([[1.0, 0.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]), 2) == (4, 2)


@pytest.mark.parametrize("mode", ["passk", "opo"])
def test_whole_completion_modes_refuse_token_rewards(mode):
    with pytest.raises(ValueError, match=f"advantage mode '{mode}' compares whole completions"):
        group_advantages(torch.ones(4, 3), 2, mode, lengths=torch.ones(4))


def test_grpo_algorithm_reads_lengths_from_the_mask_and_alpha_over_every_process():
    from lmrl.algos import build_algorithm
    from lmrl.config import AlgoConfig

    mask = T([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    opo = build_algorithm(AlgoConfig(name="grpo", group_size=3, adv_mode="opo"))
    assert_close(opo.group_advantages(ONE_PROCESS, REWARDS, mask), T([0.75, -0.25, -0.25, -0.25, 0.75, 2.75]))

    class TwoProcesses:  # the other process's batch: 6 completions, none informative
        @staticmethod
        def all_reduce_sum(t):
            return t + T([6.0, 0.0], dtype=t.dtype)

    gpg = build_algorithm(AlgoConfig(name="grpo", group_size=3, adv_mode="gpg"))
    rewards = T([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert_close(gpg.group_advantages(TwoProcesses, rewards, mask), 4 * group_advantages(rewards, 3, "grpo_no_std"))


def test_normalize_advantages_without_the_std_only_centres():
    a, mask = T([[1.0, 3.0], [5.0, 0.0]]), T([[1.0, 1.0], [1.0, 0.0]])
    assert_close(normalize_advantages(a, mask, divide=False), T([[-2.0, 0.0], [2.0, 0.0]]))
    assert_close(normalize_advantages(a, mask), T([[-2.0, 0.0], [2.0, 0.0]]) / ((8 / 3) ** 0.5 + 1e-8))


@pytest.mark.parametrize("overrides, message", [
    (["algo.name=grpo", "algo.group_size=4", "algo.normalize_advantages_std=false"],
     "algo.normalize_advantages_std=false leaves the std out of the batch whitening, which algo.name=grpo"),
    (["algo.name=reinforce", "algo.normalize_advantages=true"],
     "algo.normalize_advantages=true: algo.name=reinforce's advantages are r minus its moving baseline"),
    (["algo.name=grpo", "algo.group_size=1", "algo.adv_mode=passk"], "algo.group_size must be >= 2"),
    (["algo.name=grpo", "algo.group_size=4", "algo.adv_mode=opo", "algo.scale_rewards=batch"],
     "algo.scale_rewards=batch divides grpo's advantages"),
])
def test_config_refuses_what_the_algorithm_would_ignore(overrides, message):
    from lmrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize("overrides", [
    ["algo.name=grpo", "algo.group_size=4", "algo.normalize_advantages=true", "algo.normalize_advantages_std=false"],
    ["algo.name=reinforce_plus_plus", "algo.normalize_advantages_std=false"],
    ["algo.name=ppo", "algo.value_model=head", "algo.normalize_advantages_std=false"],
    ["algo.name=grpo", "algo.group_size=4", "algo.adv_mode=passk"],
    ["algo.name=grpo", "algo.group_size=4", "algo.adv_mode=gpg", "algo.scale_rewards=none"],
])
def test_config_accepts_centring_where_the_algorithm_whitens_and_the_new_modes(overrides):
    from lmrl.config import load_config

    load_config(None, overrides)
