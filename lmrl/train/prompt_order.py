"""Which training problems RL draws for each batch (`train.prompt_order`), for a task with a training
set of `n_train` rows (a data set's rows, an environment's training episodes):

- `shuffled`: epochs, as TRL's, verl's and OpenRLHF's samplers make them: every row once per epoch,
  in an order drawn afresh for each epoch; a batch that crosses an epoch's end takes the rest of
  that epoch and the start of the next.
- `in_order`: the rows in the data set's order, epoch after epoch (TRL's `shuffle_dataset=False`,
  verl's `data.shuffle=False`).
- `random`: each problem drawn uniformly with replacement by the task (`sample_train_ids`).

    draws = PromptDraws("shuffled", n_train=100, seed=0, rank=0, world_size=1)
    ids = draws(8, generator)      # the first 8 rows of epoch 0's order; draws.drawn == 8

An epoch's order is a function of the run's seed and the epoch alone, and where a process stands
in the sequence of epochs is one count (`drawn`, in the trainer's state), so a resumed run draws
exactly the rows it would have drawn. Under torchrun every process walks the same sequence: each
step's block of `world_size` x n rows is split between the ranks in order, so no row is drawn twice
in an epoch. A task without a training set of rows (arithmetic: problems generated from their
operands) is always drawn at random."""

from __future__ import annotations

from typing import Callable

import torch

ORDERS = ("shuffled", "in_order", "random")


def epoch_order(order: str, n_train: int, seed: int, epoch: int) -> torch.Tensor:
    """(n_train,) the rows of epoch `epoch` in the order `order` draws them."""
    if order == "in_order":
        return torch.arange(n_train)
    generator = torch.Generator().manual_seed((seed + 1_000_003 * (epoch + 1)) % 2**63)
    return torch.randperm(n_train, generator=generator)


def positions(order: str, n_train: int, seed: int, start: int, n: int) -> torch.Tensor:
    """(n,) the rows at positions start .. start + n - 1 of the sequence of epochs."""
    parts, pos = [], start
    while pos < start + n:
        epoch, offset = divmod(pos, n_train)
        take = min(start + n - pos, n_train - offset)
        parts.append(epoch_order(order, n_train, seed, epoch)[offset:offset + take])
        pos += take
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)


class PromptDraws:
    """A callable `(n, generator) -> (n,) training row ids` for `train.prompt_order` (the signature of a
    task's `sample_train_ids`, which `random` is). `drawn`: rows this process has drawn so far."""

    def __init__(self, order: str, *, n_train: int, seed: int, rank: int = 0, world_size: int = 1, drawn: int = 0,
                 sample: Callable[[int, torch.Generator], torch.Tensor] | None = None):
        if order not in ORDERS:
            raise ValueError(f"train.prompt_order must be one of {', '.join(ORDERS)}, got {order!r}")
        if order != "random" and n_train < 1:
            raise ValueError(f"train.prompt_order={order} needs a training set, and this task has {n_train} rows")
        self.order, self.n_train, self.seed = order, n_train, seed
        self.rank, self.world_size, self.drawn = rank, world_size, drawn
        self.sample = sample

    def __call__(self, n: int, generator: torch.Generator) -> torch.Tensor:
        if self.order == "random":
            if self.sample is None:
                raise ValueError("train.prompt_order=random draws with the task's sample_train_ids: pass sample=")
            return self.sample(n, generator)
        start = self.drawn * self.world_size + self.rank * n  # this rank's share of the step's block
        self.drawn += n
        return positions(self.order, self.n_train, self.seed, start, n)

    def epochs(self) -> float:
        """Passes over the training rows before the next draw (every rank's draws counted)."""
        return self.drawn * self.world_size / self.n_train if self.n_train else 0.0
