"""Rewards: a rollout scored by the task's verifier or a user's reward function, with errors that say
which sample broke it; `RewardModelScorer`, a learned reward model as such a function."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..models.reward_model import load_reward_model
from .text_batches import TextCodec, pad_sequences

# TRL-style: one call scores a batch of (prompt, completion) texts.
RewardFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; nothing was updated."""


def score_rollout(task, ids: torch.Tensor, rollout,
                  reward_fn: RewardFn | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Rewards (B,) (or (B, N) per token), exact-match flags (B,) and the task's extra per-row
    metrics (e.g. {"format_rate": (B,)}) for a rollout of problems `ids`.

    Exact match always comes from the task's verifier (it is the accuracy we report); the reward
    is the task's unless `reward_fn` is given. `reward_fn(prompts, completions, **columns)` gets the
    texts and, TRL-style, the task's extra columns as keyword lists (a math task's `ground_truth`)."""
    rewards, exact, extras = task.score_rollout(ids, rollout)
    if reward_fn is None:
        return rewards, exact, extras
    p_txt, c_txt = task.texts(ids, rollout)
    return call_reward_fn(reward_fn, p_txt, c_txt, task.reward_kwargs(ids)), exact, extras


def call_reward_fn(reward_fn: RewardFn, p_txt: Sequence[str], c_txt: Sequence[str], columns: dict) -> torch.Tensor:
    """`reward_fn(prompts, completions, **columns)` as a float tensor (B,), or a RewardError that
    names the function and the sample: it raised, returned the wrong count, or a non-finite value."""
    name = getattr(reward_fn, "__qualname__", type(reward_fn).__name__)
    try:
        values = list(reward_fn(p_txt, c_txt, **columns))
    except Exception as e:
        raise RewardError(f"reward function {name} raised {type(e).__name__}: {e} "
                          f"(first sample: prompt {p_txt[0]!r}, completion {c_txt[0]!r})") from e
    if len(values) != len(p_txt):
        raise RewardError(f"reward function {name} returned {len(values)} rewards for {len(p_txt)} completions")
    for i, v in enumerate(values):
        try:
            values[i] = float(v)
        except (TypeError, ValueError):
            values[i] = math.nan
        if not math.isfinite(values[i]):
            raise RewardError(f"reward function {name} returned {v!r} for prompt {p_txt[i]!r}, "
                              f"completion {c_txt[i]!r}; rewards must be finite numbers")
    return torch.tensor(values, dtype=torch.float32)


def load_reward_class(spec: str):
    """An instance of the class `spec` names ("package.module:ClassName"), built with no arguments."""
    import importlib

    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise RewardError(f"reward.cls={spec!r}: cannot load it ({type(e).__name__}: {e})") from None
    try:
        return obj()
    except Exception as e:
        raise RewardError(f"reward.cls={spec!r}: {attr}() raised {type(e).__name__}: {e}") from None


class RewardModelScorer:
    """A reward function for the RL trainers: `scorer(prompts, completions, **_) -> list[float]`, the
    reward model's score of each prompt + completion, encoded as in reward-model training (a plain
    prompt through the chat template, the completion followed by the end token)."""

    def __init__(self, path: str | Path, *, device="cpu", batch_size: int = 16, chat: bool = True):
        self.path = str(path)
        self.model, self.tokenizer = load_reward_model(path, device=device)
        self.model.requires_grad_(False)
        self.codec = TextCodec(self.tokenizer, chat=chat)
        self.batch_size = batch_size
        self.device = torch.device(device)

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list[str], **_) -> list[float]:
        scores = []
        for i in range(0, len(completions), self.batch_size):
            rows = [self.codec.prompt_ids(p) + self.codec.response_ids(c)
                    for p, c in zip(prompts[i:i + self.batch_size], completions[i:i + self.batch_size])]
            ids, attention, _ = pad_sequences(rows, rows, self.tokenizer.pad_token_id, self.device)
            scores += self.model(ids, attention).tolist()
        return scores
