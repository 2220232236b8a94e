import pytest
import torch

from lmrl.algos.advantages import baseline_advantages, update_moving_baseline
from lmrl.algos.losses import reinforce_loss


def test_moving_baseline_update_is_point_nine_old_plus_point_one_mean():
    assert update_moving_baseline(0.5, 1.0, 0.9) == pytest.approx(0.55)
    assert update_moving_baseline(0.55, 0.0, 0.9) == pytest.approx(0.495)


def test_moving_baseline_starts_at_the_first_batch_mean():
    assert update_moving_baseline(None, 0.3, 0.9) == pytest.approx(0.3)


def test_advantage_is_reward_minus_baseline():
    adv = baseline_advantages(torch.tensor([1.0, 0.0, 1.0]), 0.25)
    assert adv.tolist() == [0.75, -0.25, 0.75]


def test_reinforce_loss_is_minus_mean_of_sequence_logprob_times_advantage():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    adv = torch.tensor([2.0, -1.0])
    # seq logprobs: -3, -1 ; -(( -3*2) + (-1*-1)) / 2 = -(-6 + 1)/2 = 2.5
    assert reinforce_loss(logp, adv).item() == pytest.approx(2.5)


def test_reinforce_gradient_raises_logprob_of_positive_advantage():
    logits = torch.zeros(1, 3, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, :1]  # log-prob of token 0
    reinforce_loss(logp, torch.tensor([1.0])).backward()
    assert logits.grad[0, 0] < 0  # gradient descent increases logit 0
    logits.grad = None
    logp = torch.log_softmax(logits, -1)[:, :1]
    reinforce_loss(logp, torch.tensor([-1.0])).backward()
    assert logits.grad[0, 0] > 0


def test_masked_tokens_never_contribute():
    logp = torch.tensor([[-1.0, -5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]])
    loss = reinforce_loss(logp, torch.tensor([1.0]), mask)
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert logp.grad[0, 1] == 0.0


def test_advantages_are_treated_as_constants():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    adv = torch.tensor([2.0], requires_grad=True)
    reinforce_loss(logp, adv).backward()
    assert adv.grad is None


def test_token_rewards_get_a_baseline_per_position():
    b = update_moving_baseline(None, torch.tensor([1.0, 0.5]))
    assert b.tolist() == [1.0, 0.5]
    b = update_moving_baseline(b, torch.tensor([0.0, 1.0]), 0.9)
    assert b.tolist() == pytest.approx([0.9, 0.55])
    adv = baseline_advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), b)
    assert torch.allclose(adv, torch.tensor([[0.1, -0.55], [-0.9, 0.45]]))


def test_reinforce_loss_with_token_advantages_credits_each_token_with_its_own():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    adv = torch.tensor([[1.0, -1.0], [0.0, 2.0]])
    # -((-1*1 + -2*-1) + (-0.5*0 + -0.5*2)) / 2 = -((1) + (-1)) / 2 = 0
    assert reinforce_loss(logp, adv).item() == pytest.approx(0.0)
    # a sequence advantage equals the same value on every token
    seq = torch.tensor([2.0, -1.0])
    assert reinforce_loss(logp, seq).item() == pytest.approx(reinforce_loss(logp, seq[:, None].expand(2, 2)).item())
