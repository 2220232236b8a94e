import math

import pytest
import torch

from lmrl.algos.preference_losses import bradley_terry_loss, dpo_loss


def logps(*values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


# The worked example: β = 0.1,
#   log π(y_c) = −10, log π_ref(y_c) = −12, log π(y_r) = −15, log π_ref(y_r) = −14.
#   chosen log-ratio 2, rejected log-ratio −1, h = 2 − (−1) = 3, β·h = 0.3
#   sigmoid: −log σ(0.3) = log(1 + e^−0.3) = log(1.7408182) = 0.5543552
#   cDPO ε = 0.1: −0.9·log σ(0.3) − 0.1·log σ(−0.3);
#     since −log σ(−x) = −log σ(x) + x, this is 0.5543552 + 0.1·0.3 = 0.5843552
#   IPO: (h − 1/(2β))² = (3 − 5)² = 4;  hinge: max(0, 1 − 0.3) = 0.7
#   rewards: chosen 0.1·2 = 0.2, rejected 0.1·(−1) = −0.1, margin 0.3
EXAMPLE = dict(policy_chosen_logps=logps(-10.0), policy_rejected_logps=logps(-15.0),
               ref_chosen_logps=logps(-12.0), ref_rejected_logps=logps(-14.0), beta=0.1)


def test_sigmoid_at_zero_margin_is_log_2():
    loss, stats = dpo_loss(logps(-3.0, -7.0), logps(-5.0, -2.0), logps(-3.0, -7.0), logps(-5.0, -2.0))
    assert loss.item() == pytest.approx(math.log(2))
    assert stats["rewards/margins"] == 0 and stats["rewards/accuracies"] == 0  # a tie is not a win


def test_sigmoid_worked_example():
    loss, stats = dpo_loss(**EXAMPLE)
    assert loss.item() == pytest.approx(0.5543552, abs=1e-7)
    assert stats["rewards/chosen"] == pytest.approx(0.2)
    assert stats["rewards/rejected"] == pytest.approx(-0.1)
    assert stats["rewards/margins"] == pytest.approx(0.3)
    assert stats["rewards/accuracies"] == 1.0


def test_label_smoothing_adds_epsilon_times_beta_h():
    loss, _ = dpo_loss(**EXAMPLE, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.5543552 + 0.1 * 0.3, abs=1e-7)


def test_ipo_worked_example_summed():
    loss, _ = dpo_loss(**EXAMPLE, loss_type="ipo", ipo_length_normalize=False)
    assert loss.item() == pytest.approx(4.0)


def test_ipo_averages_each_log_ratio_over_its_response_by_default():
    # chosen 4 tokens, rejected 2: h̄ = 2/4 − (−1)/2 = 1, so (1 − 5)² = 16 (summed: 4)
    lengths = dict(chosen_lengths=torch.tensor([4]), rejected_lengths=torch.tensor([2]))
    loss, stats = dpo_loss(**EXAMPLE, loss_type="ipo", **lengths)
    assert loss.item() == pytest.approx(16.0)
    assert stats["rewards/margins"] == pytest.approx(0.3)  # the rewards stay those of the summed log-ratios
    # an empty response counts as one token, not a division by 0
    empty, _ = dpo_loss(**EXAMPLE, loss_type="ipo", chosen_lengths=torch.tensor([0]),
                        rejected_lengths=torch.tensor([1]))
    assert empty.item() == pytest.approx((2 + 1 - 5) ** 2)


def test_ipo_without_lengths_says_what_to_pass():
    with pytest.raises(ValueError, match="chosen_lengths and rejected_lengths.*ipo_length_normalize=False"):
        dpo_loss(**EXAMPLE, loss_type="ipo")


def test_robust_worked_example_and_epsilon_zero_is_plain_dpo():
    # (−0.9·log σ(0.3) + 0.1·log σ(−0.3)) / 0.8 = (0.9·0.5543552 − 0.1·0.8543552) / 0.8 = 0.5168552
    loss, _ = dpo_loss(**EXAMPLE, loss_type="robust", label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.5168552, abs=1e-7)
    assert dpo_loss(**EXAMPLE, loss_type="robust")[0].item() == pytest.approx(0.5543552, abs=1e-7)


def test_hinge_worked_example_and_zero_past_the_margin():
    loss, _ = dpo_loss(**EXAMPLE, loss_type="hinge")
    assert loss.item() == pytest.approx(0.7)
    # h = 20 with β = 0.1: β·h = 2 > 1, past the margin 1/β = 10, so no loss and no gradient
    chosen = logps(10.0, grad=True)
    loss, _ = dpo_loss(chosen, logps(-10.0), logps(0.0), logps(0.0), beta=0.1, loss_type="hinge")
    loss.backward()
    assert loss.item() == 0.0 and chosen.grad.item() == 0.0


def test_stats_average_over_the_batch():
    # pair 1: log-ratios (1, 0) → rewards (0.5, 0); pair 2: (−1, 1) → (−0.5, 0.5), the rejected one wins
    _, stats = dpo_loss(logps(1.0, -1.0), logps(0.0, 1.0), logps(0.0, 0.0), logps(0.0, 0.0), beta=0.5)
    assert stats["rewards/chosen"] == pytest.approx(0.0)
    assert stats["rewards/rejected"] == pytest.approx(0.25)
    assert stats["rewards/margins"] == pytest.approx(-0.25)
    assert stats["rewards/accuracies"] == 0.5


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge", "robust"])
def test_gradient_raises_chosen_and_lowers_rejected(loss_type):
    chosen, rejected = logps(-10.0, grad=True), logps(-15.0, grad=True)
    ref_chosen, ref_rejected = logps(-12.0, grad=True), logps(-14.0, grad=True)
    loss, _ = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, loss_type=loss_type,
                       chosen_lengths=torch.tensor([3]), rejected_lengths=torch.tensor([2]))
    loss.backward()
    # gradient descent moves against the gradient: chosen up (grad < 0), rejected down (grad > 0)
    assert chosen.grad.item() < 0 < rejected.grad.item()
    assert ref_chosen.grad is None and ref_rejected.grad is None  # the reference is a constant


def test_sigmoid_gradient_is_minus_beta_sigmoid_of_minus_beta_h():
    # dL/d log π(y_c) = −β·σ(−β·h) = −0.1·σ(−0.3) = −0.1 / (1 + e^0.3) = −0.0425557
    chosen = logps(-10.0, grad=True)
    loss, _ = dpo_loss(chosen, logps(-15.0), logps(-12.0), logps(-14.0), beta=0.1)
    loss.backward()
    assert chosen.grad.item() == pytest.approx(-0.0425557, abs=1e-7)


def test_dpo_refuses_bad_settings():
    with pytest.raises(ValueError, match="must be one of sigmoid, ipo, hinge, robust, got 'kto'"):
        dpo_loss(**EXAMPLE, loss_type="kto")
    for beta in (0.0, -0.1):
        with pytest.raises(ValueError, match=f"beta must be > 0.*got {beta}"):
            dpo_loss(**{**EXAMPLE, "beta": beta})
    for eps in (-0.1, 0.5):
        with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 0.5\).*got " + str(eps)):
            dpo_loss(**EXAMPLE, label_smoothing=eps)
    for loss_type in ("ipo", "hinge"):
        with pytest.raises(ValueError, match=f"'sigmoid' or 'robust' only, not '{loss_type}'"):
            dpo_loss(**EXAMPLE, loss_type=loss_type, label_smoothing=0.1, ipo_length_normalize=False)
    with pytest.raises(ValueError, match=r"one shape.*ref_rejected_logps \(2,\)"):
        dpo_loss(logps(-1.0), logps(-2.0), logps(-1.0), logps(-2.0, -3.0))


def test_bradley_terry_value_accuracy_and_margin():
    # diffs (1, −1): L = ½·(log(1 + e^−1) + log(1 + e^1)) = ½·(0.3132617 + 1.3132617) = 0.8132617
    loss, stats = bradley_terry_loss(logps(2.0, 0.5), logps(1.0, 1.5))
    assert loss.item() == pytest.approx(0.8132617, abs=1e-7)
    assert stats == {"rm/accuracy": 0.5, "rm/margin_mean": 0.0}
    # margin 1: diffs − 1 = (0, −2): L = ½·(log 2 + log(1 + e^2)) = ½·(0.6931472 + 2.1269280) = 1.4100376
    loss, stats = bradley_terry_loss(logps(2.0, 0.5), logps(1.0, 1.5), margin=1.0)
    assert loss.item() == pytest.approx(1.4100376, abs=1e-7)
    assert stats["rm/margin_mean"] == 0.0  # reported without the margin
    per_pair, _ = bradley_terry_loss(logps(2.0, 0.5), logps(1.0, 1.5), margin=logps(1.0, 0.0))
    assert per_pair.item() == pytest.approx(0.5 * (math.log(2) + math.log(1 + math.e)))
    with pytest.raises(ValueError, match=r"chosen \(2,\) and rejected \(3,\)"):
        bradley_terry_loss(logps(1.0, 2.0), logps(1.0, 2.0, 3.0))
