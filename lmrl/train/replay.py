"""Replay of failed prompts in RL (`train.replay_fraction`): the training problems some completion
recently got wrong, each once, and the batches drawn partly from them.

    replay = ReplayBuffer(capacity=4, fraction=0.5)
    replay.add(torch.tensor([7, 7, 3, 3]), torch.tensor([1, 0, 1, 1]))   # replay.ids == [7]
    ids = replay.draw(8, task.sample_train_ids, generator)              # 4 drawn uniformly, 4 from [7]

The buffer holds problem ids only (never labels: a failure is a completion the reward called
wrong), so it is a plain list that the trainer keeps in its state and a resume gives back."""

from __future__ import annotations

from typing import Callable

import torch


class ReplayBuffer:
    """The last `capacity` failed training problems, oldest first, each at most once per batch that
    failed it; `fraction` of a batch is drawn from them (with repeats), the rest by `sample`."""

    def __init__(self, capacity: int, fraction: float, ids=None):
        self.capacity, self.fraction = capacity, fraction
        self.ids: list[int] = list(ids or [])

    def draw(self, n: int, sample: Callable[[int, torch.Generator], torch.Tensor],
             generator: torch.Generator) -> torch.Tensor:
        """`n` problem ids: `sample(n - k, generator)` drawn uniformly, then k = ⌊n · fraction⌋ (at
        most the buffer's size) picked uniformly from the buffer with the same generator."""
        k = min(int(n * self.fraction), len(self.ids))
        ids = sample(n - k, generator)
        if k:
            pick = torch.randint(len(self.ids), (k,), generator=generator)
            ids = torch.cat([ids, torch.tensor(self.ids, dtype=ids.dtype)[pick]])
        return ids

    def add(self, ids: torch.Tensor, exact: torch.Tensor) -> None:
        """Appends the problems of `ids` that some completion got wrong (`exact` 0), each once, in
        batch order; then keeps the last `capacity`."""
        failed = dict.fromkeys(ids[~exact.bool().cpu()].tolist())
        self.ids = (self.ids + list(failed))[-self.capacity:]
