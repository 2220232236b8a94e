"""In-process rollouts: batched sampling with the policy's KV cache, on the trainer's own weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """One step's sampled completions. B rows; N completion tokens (every row the same length for
    the arithmetic task, so `mask` is all ones there; it exists for tasks with stop tokens)."""

    prompts: torch.Tensor  # (B, P) token ids
    completions: torch.Tensor  # (B, N) sampled ids
    logprobs: torch.Tensor  # (B, N) log-probs at sampling time
    mask: torch.Tensor  # (B, N) 1 on tokens the policy chose, 0 on padding
    rewards: torch.Tensor | None = None  # (B,)

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.completions], dim=1)

    def __len__(self) -> int:
        return self.prompts.size(0)


@torch.no_grad()
def sample(model, prompts: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
           greedy: bool = False, generator: torch.Generator | None = None) -> Rollout:
    """Samples completions in eval mode (no dropout) and puts the model back in its previous mode."""
    was_training = model.training
    model.eval()
    try:
        completions, logprobs = model.generate(prompts, max_new_tokens, temperature=temperature, top_k=top_k,
                                               greedy=greedy, generator=generator)
    finally:
        model.train(was_training)
    return Rollout(prompts, completions, logprobs, torch.ones_like(completions, dtype=torch.float32))
