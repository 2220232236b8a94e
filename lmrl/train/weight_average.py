"""An exponential moving average of a model's trainable weights (Polyak averaging, `train.ema_decay`).

After every optimizer step, average ← decay · average + (1 − decay) · weights (torch's
`get_ema_multi_avg_fn`: one multi-tensor lerp over all of them). The trained weights keep training and
sampling; the average is what is evaluated, kept as the best model and exported: it smooths out the
step-to-step noise of the iterates, which in RL on a small policy moves held-out accuracy by several
points between evaluations.

Only trainable tensors are averaged (a LoRA policy: its adapter), so the cost is one copy of them."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.optim.swa_utils import get_ema_multi_avg_fn

from ..checkpoint import CheckpointError

NAME = "ema"  # the average's name among a checkpoint's extra modules
FILE = f"{NAME}.safetensors"  # its file in a checkpoint dir


class WeightAverage:
    """The average of `model`'s trainable parameters, starting from their values now."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.averages = [p.detach().clone() for p in self.params]
        self._lerp = get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def update(self) -> None:
        """Moves the average towards the weights as they are now (call after each optimizer step)."""
        self._lerp(self.averages, [p.detach() for p in self.params], None)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block and its own again after it."""
        with torch.no_grad():
            own = [p.detach().clone() for p in self.params]
            for p, a in zip(self.params, self.averages):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, o in zip(self.params, own):
                    p.copy_(o)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The model's weights become the average (for good: the end of training)."""
        for p, a in zip(self.params, self.averages):
            p.copy_(a)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averages under the model's parameter names."""
        return dict(zip(self.names, self.averages))

    @torch.no_grad()
    def load(self, file: Path) -> None:
        """The averages from a file `state_dict` was saved to, every name and shape matching."""
        state = read_average(file, dict(zip(self.names, self.averages)))
        for name, a in zip(self.names, self.averages):
            a.copy_(state[name])


def read_average(file: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a saved average, checked against `like` (name → tensor): the same names and shapes."""
    device = str(next(iter(like.values())).device) if like else "cpu"
    try:
        state = load_file(str(file), device=device)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} does not load ({e})") from None
    missing, unexpected = set(like) - set(state), set(state) - set(like)
    if missing or unexpected:
        raise CheckpointError(f"{file} does not match the model's trainable weights: missing keys "
                              f"{sorted(missing)}, unexpected keys {sorted(unexpected)}")
    for name, t in like.items():
        if state[name].shape != t.shape:
            raise CheckpointError(f"{file}: {name} has shape {tuple(state[name].shape)}, the model's is "
                                  f"{tuple(t.shape)}")
    return state


@torch.no_grad()
def load_average(model: torch.nn.Module, file: Path) -> None:
    """`model`'s trainable weights become the average saved in `file` (what its run evaluated)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for name, t in read_average(file, params).items():
        params[name].copy_(t)
