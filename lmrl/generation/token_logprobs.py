"""Log-probabilities and entropies of chosen tokens from logits, a slice of rows at a time.

    logp, entropy = token_logprobs(logits, targets, temperature)   # (..., V), (...) -> (...), (...)
    logp, entropy, mean_logit, top1 = token_logprobs_and_diagnostics(logits, targets)

The same numbers as

    z = logits.float() / temperature
    logp = z.gather(-1, targets[..., None])[..., 0] - z.logsumexp(-1)
    entropy = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)

but cheaper where the vocabulary is large. Written as tensor expressions, each step reads and
writes the whole (B, T, V) array (for SmolLM2's 49,152 words, a 32 x 64 learner batch is 400 MB a
copy): the scaled logits, the softmax for the entropy, and in the backward pass the softmax again,
a scattered one-hot, their sum and the temperature's scaling, each a new tensor the allocator must
fault in. Here each slice of `chunk_rows` rows is finished while it is in cache, and the backward
pass writes the gradient once:

    d logp / d z_j    = 1[j = y] - p_j
    d entropy / d z_j = -p_j (log p_j + entropy)

(both then divided by the temperature). Only `logits` (which the caller holds anyway), the log
normaliser and the entropy are kept for backward. The entropy carries a gradient only
when the loss uses it (an entropy bonus); as a metric it costs nothing in the backward pass.

`token_logprobs_and_diagnostics` also reads, from each slice while it is in cache and without
gradient, two numbers TRL's trainers log: the mean of z over the vocabulary and whether the target
is z's argmax (TRL's `mean_logits` and `is_top1`).
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 64  # 64 x 49,152 fp32 logits = 12.6 MB a slice


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(targets), entropy) under softmax(logits / temperature), in float32, shaped like
    `targets`; `logits` is (*targets.shape, V), any float dtype."""
    _check(logits, targets, temperature)
    logp, entropy, _, _ = _TokenLogprobs.apply(logits, targets, float(temperature), int(chunk_rows), False)
    return logp, entropy


def token_logprobs_and_diagnostics(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                                   chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, ...]:
    """`token_logprobs`' (log p(targets), entropy), then, without gradient, each position's mean over
    the vocabulary of z = logits / temperature (float32) and whether the target is z's argmax (bool;
    of tied maxima the first counts, as `torch.argmax` picks it), all shaped like `targets`."""
    _check(logits, targets, temperature)
    return _TokenLogprobs.apply(logits, targets, float(temperature), int(chunk_rows), True)


def _check(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> None:
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_rows, diagnostics):
        flat, index = logits.reshape(-1, logits.size(-1)), targets.reshape(-1, 1)
        n = flat.size(0)
        logp, lse, entropy = (torch.empty(n, device=flat.device) for _ in range(3))
        mean_logit = torch.empty(n, device=flat.device) if diagnostics else None
        top1 = torch.empty(n, dtype=torch.bool, device=flat.device) if diagnostics else None
        for s in range(0, n, chunk_rows):
            z = flat[s:s + chunk_rows].float() / temperature
            if diagnostics:  # read z before it becomes log p in place
                mean_logit[s:s + chunk_rows] = z.mean(-1)
                top1[s:s + chunk_rows] = z.argmax(-1) == index[s:s + chunk_rows, 0]
            lse[s:s + chunk_rows] = lse_c = z.logsumexp(-1)
            log_p = z.sub_(lse_c[:, None])
            entropy[s:s + chunk_rows] = -(log_p.exp()[:, None, :] @ log_p[:, :, None]).view(-1)  # -sum p log p
            logp[s:s + chunk_rows] = log_p.gather(1, index[s:s + chunk_rows])[:, 0]
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        ctx.set_materialize_grads(False)
        if not diagnostics:
            return logp.view(targets.shape), entropy.view(targets.shape), None, None
        mean_logit, top1 = mean_logit.view(targets.shape), top1.view(targets.shape)
        ctx.mark_non_differentiable(mean_logit, top1)
        return logp.view(targets.shape), entropy.view(targets.shape), mean_logit, top1

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy, *_):
        logits, targets, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return None, None, None, None, None
        flat, index = logits.reshape(-1, logits.size(-1)), targets.reshape(-1, 1)
        n, t, rows = flat.size(0), ctx.temperature, ctx.chunk_rows
        g = torch.zeros(n, device=flat.device) if grad_logp is None else grad_logp.reshape(-1).float() / t
        ge = None if grad_entropy is None else grad_entropy.reshape(-1).float() / t
        grad = torch.empty_like(flat)
        for s in range(0, n, rows):
            log_p = (flat[s:s + rows].float() / t).sub_(lse[s:s + rows, None])
            # p_j * (-g - ge (log p_j + entropy)), then + g at the chosen token
            coef = -g[s:s + rows, None] if ge is None else \
                -(g[s:s + rows, None] + ge[s:s + rows, None] * (log_p + entropy[s:s + rows, None]))
            grad[s:s + rows] = log_p.exp_().mul_(coef).scatter_add_(1, index[s:s + rows], g[s:s + rows, None])
        return grad.view_as(logits), None, None, None, None
