"""token_logprobs against the plain tensor expressions, in value and gradient; the diagnostics
(mean logit, top-1) read in the same pass, on logits written by hand."""

import math

import pytest
import torch

from lmrl.generation.token_logprobs import token_logprobs, token_logprobs_and_diagnostics


def reference(logits, targets, temperature):
    z = logits.double() / temperature
    logp = z.log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    entropy = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [1, 5, 64])
def test_values_and_gradients_match_the_plain_expressions(temperature, chunk_rows):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=gen) * 4).requires_grad_()
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    w_logp, w_ent = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)

    logp, entropy = token_logprobs(logits, targets, temperature, chunk_rows=chunk_rows)
    ((logp * w_logp).sum() + (entropy * w_ent).sum()).backward()
    grad, logits.grad = logits.grad.clone(), None
    ref_logp, ref_ent = reference(logits, targets, temperature)
    ((ref_logp * w_logp).sum() + (ref_ent * w_ent).sum()).backward()

    assert logp.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, logits.grad, atol=1e-5, rtol=1e-4)


def test_gradient_of_the_log_probs_alone_and_of_the_entropy_alone():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4, 30, generator=gen) * 3
    targets = torch.randint(0, 30, (4,), generator=gen)
    for pick in (0, 1):
        logits = base.clone().requires_grad_()
        token_logprobs(logits, targets, 0.5, chunk_rows=3)[pick].sum().backward()
        ref = base.clone().requires_grad_()
        reference(ref, targets, 0.5)[pick].sum().backward()
        torch.testing.assert_close(logits.grad, ref.grad.float(), atol=1e-5, rtol=1e-4)
    # at a one-hot target the gradient is (onehot - p) / T: each row's entries sum to zero
    assert logits.grad.sum(-1).abs().max() < 1e-5


def test_entropies_of_known_distributions():
    # uniform over 3: ln 3; two equal tokens and one all but ruled out: ln 2; one token certain: 0
    logits = torch.tensor([[5.0, 5.0, 5.0], [0.0, 0.0, -1e4], [1e4, 0.0, 0.0]])
    logp, entropy = token_logprobs(logits, torch.tensor([0, 1, 0]))
    torch.testing.assert_close(entropy, torch.tensor([math.log(3), math.log(2), 0.0]))
    torch.testing.assert_close(logp, torch.tensor([-math.log(3), -math.log(2), 0.0]))


def test_low_precision_logits_are_read_in_float32_and_get_a_gradient_of_their_dtype():
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(6, 40, generator=gen) * 3).bfloat16().requires_grad_()
    targets = torch.randint(0, 40, (6,), generator=gen)
    logp, entropy = token_logprobs(logits, targets)
    ref_logp, ref_ent = reference(logits.float(), targets, 1.0)
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)
    logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_diagnostics_are_the_mean_logit_and_whether_the_target_is_the_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0],    # target 1: the first of two maxima
                           [1.0, 3.0, 3.0, 0.0],    # target 2: tied with an earlier token, not the argmax
                           [2.0, -2.0, 0.0, 4.0],   # target 3: the argmax
                           [0.0, 0.0, 0.0, 0.0]])   # target 2: all tied, token 0 is the argmax
    targets = torch.tensor([1, 2, 3, 2])
    for temperature, chunk_rows in ((1.0, 64), (0.5, 3)):
        logp, entropy, mean_logit, top1 = token_logprobs_and_diagnostics(logits, targets, temperature, chunk_rows)
        # the mean of logits / temperature over the 4 words: 7/4, 7/4, 4/4, 0
        torch.testing.assert_close(mean_logit, torch.tensor([1.75, 1.75, 1.0, 0.0]) / temperature)
        assert top1.tolist() == [True, False, True, False] and top1.dtype == torch.bool
        plain_logp, plain_entropy = token_logprobs(logits, targets, temperature, chunk_rows)
        assert torch.equal(logp, plain_logp) and torch.equal(entropy, plain_entropy)
    assert entropy[3].item() == pytest.approx(math.log(4))


def test_diagnostics_leave_the_gradient_unchanged():
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(2, 5, 30, generator=gen) * 3
    targets = torch.randint(0, 30, (2, 5), generator=gen)
    grads = []
    for compute in (token_logprobs, token_logprobs_and_diagnostics):
        logits = base.clone().requires_grad_()
        logp, entropy, *diagnostics = compute(logits, targets, 0.7, chunk_rows=4)
        (logp.sum() + entropy.sum()).backward()
        grads.append(logits.grad)
        assert all(not d.requires_grad for d in diagnostics)
    assert torch.equal(grads[0], grads[1])


def test_bad_shapes_and_temperatures_are_refused():
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs_and_diagnostics(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
