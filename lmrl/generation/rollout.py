"""In-process rollouts: batched sampling with the policy's KV cache, on the trainer's own weights."""

from __future__ import annotations

import dataclasses
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


LEFT_PADDED = ("prompts", "prompt_mask")  # a Rollout's (B, P) fields; its other (B, N) fields are right-padded


def select_rows(ro: Rollout, rows: list[int]) -> Rollout:
    """The rollout of rows `rows` of `ro` (a subclass keeps its type): every field that has one entry per
    row (a tensor or a list of B) taken at those rows, the others (staleness) as they are."""
    n, index = len(ro), torch.as_tensor(rows, dtype=torch.long)

    def pick(value):
        if isinstance(value, torch.Tensor) and value.dim() and value.size(0) == n:
            return value[index.to(value.device)]
        if isinstance(value, list) and len(value) == n:
            return [value[i] for i in rows]
        return value

    return dataclasses.replace(ro, **{f.name: pick(getattr(ro, f.name)) for f in dataclasses.fields(ro)})


def cat_rollouts(parts: list[Rollout]) -> Rollout:
    """The rollouts `parts` (one type, rows of one task) as one, row after row: prompts left-padded to
    the longest (a `prompt_mask` made where a part had none), completions and their per-token fields
    right-padded with 0 (mask 0); per-row fields joined; the others (staleness) the first part's."""
    if len(parts) == 1:
        return parts[0]
    prompt_len = max(p.prompts.size(1) for p in parts)
    ragged = any(p.prompts.size(1) != prompt_len or p.prompt_mask is not None for p in parts)
    completion_len = max(p.completions.size(1) for p in parts)
    first, out = parts[0], {}
    for f in dataclasses.fields(first):
        values = [getattr(p, f.name) for p in parts]
        if f.name == "prompt_mask" and ragged:
            values = [torch.ones_like(p.prompts, dtype=torch.long) if v is None else v for p, v in zip(parts, values)]
        if all(isinstance(v, torch.Tensor) and v.dim() and v.size(0) == len(p) for v, p in zip(values, parts)):
            if values[0].dim() == 2:
                width = prompt_len if f.name in LEFT_PADDED else completion_len
                left = f.name in LEFT_PADDED
                values = [torch.nn.functional.pad(v, (width - v.size(1), 0) if left else (0, width - v.size(1)))
                          for v in values]
            out[f.name] = torch.cat(values)
        elif all(isinstance(v, list) and len(v) == len(p) for v, p in zip(values, parts)):
            out[f.name] = [x for v in values for x in v]
        else:
            out[f.name] = values[0]
    return dataclasses.replace(first, **out)


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
