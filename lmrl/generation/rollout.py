"""In-process rollouts: batched sampling with the policy's KV cache, on the trainer's own weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import Sampling


@dataclass
class Rollout:
    """One step's sampled completions. B rows; N completion tokens (every row the same length for
    the arithmetic task, so `mask` is all ones there; a text task's completions end at EOS).

    Text prompts differ in length: they are left-padded and `prompt_mask` marks their real
    tokens; every forward pass over `sequences` then takes `attention_mask` (None: no padding)."""

    prompts: torch.Tensor  # (B, P) token ids
    completions: torch.Tensor  # (B, N) sampled ids
    logprobs: torch.Tensor  # (B, N) log-probs at sampling time
    mask: torch.Tensor  # (B, N) 1 on tokens the policy chose, 0 on padding
    prompt_mask: torch.Tensor | None = None  # (B, P) 1 on real prompt tokens, 0 on left padding
    staleness: int = 0  # learner updates since the weights that sampled it (rollout.overlap: 1)
    # (B,) bool: cut off by the length limit before its end of sequence (an agent: by the turn or
    # context limit); None where completions have no end of sequence (fixed-length answers)
    truncated: torch.Tensor | None = None

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.completions], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor | None:
        """(B, P + N), or None when no prompt is padded. Padding after a completion's EOS stays
        visible: it comes after every token that carries loss, so no such token attends to it."""
        if self.prompt_mask is None:
            return None
        return torch.cat([self.prompt_mask.long(), torch.ones_like(self.completions)], dim=1)

    def __len__(self) -> int:
        return self.prompts.size(0)


@torch.no_grad()
def sample(model, prompts: torch.Tensor, max_new_tokens: int, *, sampling: Sampling | None = None, greedy: bool = False,
           generator: torch.Generator | None = None, **options) -> Rollout:
    """Samples completions in eval mode (no dropout) and puts the model back in its previous mode.
    `sampling` (or its fields as keywords) as `GPT.generate` takes it."""
    was_training = model.training
    model.eval()
    try:
        completions, logprobs = model.generate(prompts, max_new_tokens, sampling=Sampling.of(sampling, **options),
                                               greedy=greedy, generator=generator)
    finally:
        model.train(was_training)
    return Rollout(prompts, completions, logprobs, torch.ones_like(completions, dtype=torch.float32))


@torch.no_grad()
def sample_text(policy, prompts: list[str], max_new_tokens: int, *, sampling: Sampling | None = None,
                greedy: bool = False, generator: torch.Generator | None = None, **options) -> Rollout:
    """Text prompts through a Hugging Face policy (`HFPolicy.generate_text`): left-padded, each
    completion ending at its first EOS. `sampling` (or its fields as keywords) as `generate_ids` takes it."""
    ids, mask = policy.encode(prompts)
    completions, keep, logprobs = policy.generate_ids(ids, mask, max_new_tokens,
                                                      sampling=Sampling.of(sampling, **options), greedy=greedy,
                                                      generator=generator)
    ended = torch.isin(completions, torch.tensor(list(policy.eos_token_ids), device=completions.device)).any(1)
    return Rollout(ids, completions, logprobs, keep, prompt_mask=mask, truncated=~ended)
