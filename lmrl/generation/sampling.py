"""The distribution a sampler draws the next token from, given the model's logits, as transformers'
`generate(do_sample=True, ...)` builds it (`GenerationMixin._get_logits_processor`): the repetition
penalty first (`RepetitionPenaltyLogitsProcessor`, a processor), then the warpers in their order:
temperature, top-k, top-p (nucleus), min-p (`TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, `MinPLogitsWarper`), with their tie rules. So lmrl's samplers, `generate` with
lmrl's log-prob recorder, and TRL's rollouts draw from the same distribution.

    sampling = Sampling(temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.1)
    seen = seen_tokens(prompt_ids, prompt_mask, V) if sampling.penalizes else None   # (B, V) bool
    logits = sampling.warp(logits, seen)            # (B, V), -inf outside what may be drawn
    mark_seen(seen, tokens)                         # after each step's draw

A token is "seen" when it is a real token of the prompt (left padding is not: `seen_tokens` reads
the attention mask, as transformers' `generate` and vLLM do) or of the completion so far.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """The sampling options of every lmrl sampler (defaults: each option off). `temperature` > 0
    is checked where a sampler samples (greedy decoding ignores every option)."""

    temperature: float = 1.0
    top_k: int = 0  # the k most likely tokens (0: off)
    top_p: float = 1.0  # the nucleus (1: off)
    min_p: float = 0.0  # tokens below min_p x the most likely one's probability dropped (0: off)
    repetition_penalty: float = 1.0  # seen tokens' logits: positive ones divided by it, negative multiplied (1: off)

    def __post_init__(self):
        for name, ok, bounds in [("top_k", self.top_k >= 0, ">= 0"), ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
                                 ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
                                 ("repetition_penalty", self.repetition_penalty > 0, "> 0")]:
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise ValueError(f"{name} must be {bounds}, got {value}")

    @classmethod
    def of(cls, sampling: Sampling | None = None, **options) -> Sampling:
        """`sampling` (default: every option off) with `options` (its field names) put over it."""
        sampling = sampling if sampling is not None else cls()
        return dataclasses.replace(sampling, **options) if options else sampling

    @property
    def penalizes(self) -> bool:
        """Whether a sampler must track the tokens each row has seen."""
        return self.repetition_penalty != 1.0

    def warp(self, logits: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """`logits` (B, V) as transformers' sampling processors leave them: the repetition penalty on
        the tokens `seen` (B, V) bool marks (needed when `penalizes`), then `warp_logits`."""
        if self.penalizes:
            if seen is None:
                raise ValueError("repetition_penalty needs the tokens each row has seen (seen_tokens)")
            logits = penalize_repeats(logits, seen, self.repetition_penalty)
        return warp_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)

    def rollout_keywords(self) -> dict:
        """The keywords of a task's `rollout(policy, ids, *, temperature, top_k, top_p, ...)`:
        min_p and repetition_penalty only when set, so a task whose rollout predates them still runs."""
        keywords = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        keywords.update({name: getattr(self, name) for name in NEWER_OPTIONS
                         if getattr(self, name) != getattr(OFF, name)})
        return keywords


OFF = Sampling()
NEWER_OPTIONS = ("min_p", "repetition_penalty")  # what a task's rollout is given only when set


def options_not_taken(rollout, sampling: Sampling) -> list[str]:
    """The keywords `sampling.rollout_keywords()` gives that the callable `rollout` (a task's
    rollout method) has no parameter for (none when it takes **kwargs or has no readable signature)."""
    try:
        params = inspect.signature(rollout).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [name for name in sampling.rollout_keywords() if name not in params]


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0) -> torch.Tensor:
    """`logits` (..., V) divided by `temperature`, with -inf outside the `top_k` most likely tokens
    (0: off), outside the nucleus: the most likely tokens whose probabilities sum to at least
    `top_p` (1: off; the most likely token always stays), and on the tokens whose probability is
    below `min_p` times the most likely one's (0: off). `logits` itself is left as it is."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = logits.sort(dim=-1)
        # drop the least likely tokens while the mass dropped stays within 1 - top_p
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    if min_p > 0:
        # the threshold scales with the most likely token's probability, which itself always stays
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return logits


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """`logits` (B, V) with those of the tokens `seen` (B, V) bool marks divided by `penalty` where
    positive and multiplied by it where negative (each token once, however often it occurred)."""
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """(B, V) bool: True on the ids of each row of `ids` (B, P) where `mask` (B, P) is 1 (None: every
    position). Left padding is masked off, so a pad id counts only where the row really holds it."""
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    # a masked or out-of-vocabulary id goes to one extra column, dropped at the end
    columns = ids.clamp(max=vocab_size).masked_fill(~real, vocab_size)
    seen = torch.zeros(ids.size(0), vocab_size + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, columns, True)[:, :vocab_size]


def mark_seen(seen: torch.Tensor, tokens: torch.Tensor) -> None:
    """Marks each row's drawn token (B,) in `seen` (B, V), in place."""
    seen[torch.arange(seen.size(0), device=seen.device), tokens] = True
