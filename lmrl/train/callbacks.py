"""Trainer hooks: code of your own that runs at fixed points of an RL run.

    class PrintWins(Callback):
        def on_episode_end(self, trainer, episode):
            if episode.reward > 0:
                print(episode.completion)

    RLTrainer(config, callbacks=[PrintWins()]).train()

Hooks (all optional; the base class's do nothing):
- `on_episode_end(trainer, episode)`: once per sampled completion / multi-turn episode, on every
  process, after scoring and before the update. `episode` is an `Episode`.
- `on_update_end(trainer, step)`: right after each optimizer step (warm-up and RL), before that
  step's evaluation, logging and checkpoint (transformers' `on_step_end` point).
- `on_step_end(trainer, step, metrics)`: after each step's evaluation (when one is due) and logging,
  with the step's metrics (process 0 has every metric; others the same keys).
- `on_checkpoint(trainer, path)`: on process 0, after a checkpoint directory is complete.

A hook that raises stops the run like any other error; checkpoints already written stay intact.
To drive RL from an agent loop you run yourself, see `lmrl.train.online.EpisodeLearner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Episode:
    """One scored completion as a callback sees it."""

    step: int  # the update it feeds (global step, 1-based)
    prompt: str
    completion: str  # the agent's text (a multi-turn episode: its turns joined)
    reward: float  # the completion's reward (summed over tokens for per-token rewards)
    logprobs: torch.Tensor  # (n,) log-probs of the policy's own tokens at sampling time
    messages: list[dict] | None = None  # a multi-turn episode's whole conversation
    info: dict = field(default_factory=dict)  # the environment's record (multi-turn), else {}


class Callback:
    def on_episode_end(self, trainer, episode: Episode) -> None: ...
    def on_update_end(self, trainer, step: int) -> None: ...
    def on_step_end(self, trainer, step: int, metrics: dict) -> None: ...
    def on_checkpoint(self, trainer, path: Path) -> None: ...


class CallbackList:
    """Dispatches each hook to every callback that overrides it."""

    HOOKS = ("on_episode_end", "on_update_end", "on_step_end", "on_checkpoint")

    def __init__(self, callbacks=None):
        self.callbacks = list(callbacks or [])
        for cb in self.callbacks:
            if not any(callable(getattr(cb, name, None)) for name in self.HOOKS):
                raise TypeError(f"callback {cb!r} has none of {', '.join(self.HOOKS)}")

    def _with(self, name: str) -> list:
        return [cb for cb in self.callbacks if getattr(type(cb), name, None) is not getattr(Callback, name)
                and callable(getattr(cb, name, None))]

    def rollout_end(self, trainer, step: int, ids: torch.Tensor, rollout, rewards: torch.Tensor) -> None:
        """`on_episode_end` for each row of a scored rollout (texts are decoded only if someone listens)."""
        listeners = self._with("on_episode_end")
        if not listeners:
            return
        prompts, completions = trainer.task.texts(ids, rollout)
        per_row = rewards.float().sum(1) if rewards.dim() == 2 else rewards.float()
        transcripts = getattr(rollout, "transcripts", None) or [None] * len(prompts)
        infos = getattr(rollout, "infos", None) or [{}] * len(prompts)
        for i in range(len(prompts)):
            keep = rollout.mask[i].bool()
            episode = Episode(step, prompts[i], completions[i], per_row[i].item(), rollout.logprobs[i][keep].cpu(),
                              transcripts[i], dict(infos[i]))
            for cb in listeners:
                cb.on_episode_end(trainer, episode)

    def update_end(self, trainer, step: int) -> None:
        for cb in self._with("on_update_end"):
            cb.on_update_end(trainer, step)

    def step_end(self, trainer, step: int, metrics: dict) -> None:
        for cb in self._with("on_step_end"):
            cb.on_step_end(trainer, step, metrics)

    def checkpoint(self, trainer, path: Path) -> None:
        for cb in self._with("on_checkpoint"):
            cb.on_checkpoint(trainer, path)
