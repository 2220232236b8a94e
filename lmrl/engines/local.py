"""Rollout engines: what samples a step's completions for the RL trainer.

    engine = LocalEngine(task, policy)                # or ThreadEngine, RayRolloutEngine, VLLMEngine
    engine.sync(policy, version)                      # the sampler's weights follow the learner's
    pending = engine.submit(ids, sampling=Sampling(temperature=1.0), generator=g)   # greedy=True: argmax decoding
    sampled = pending.result()                        # Sampled(ids, rollout on the learner's device, version)
    engine.close()

The trainer calls `sync` right before every `submit`, so a batch is always sampled with the weights
the learner had when it was asked for. Without `rollout.overlap` the trainer waits for the batch
before it updates (on-policy); with it, the next batch is submitted before this one's update, so it
is sampled one update behind (`rollout/staleness` = 1).

- `LocalEngine`: the learner's own policy, in its process, sampling when asked (the default).
- `ThreadEngine`: a copy of the policy sampling in a background thread (`rollout.overlap` without Ray).
- `lmrl.engines.ray_engine.RayRolloutEngine`: the batch split across `rollout.workers` Ray actors.
- `lmrl.engines.vllm_engine.VLLMEngine`: an HF policy served by vLLM (`rollout.engine: vllm`); it
  returns no log-probs, so the trainer recomputes them with the exact training weights.

Engines other than `LocalEngine` sample with their own generator, seeded from one draw of the
trainer's `sample` generator per batch, so a run is reproducible from its seed whatever the timing.
"""

from __future__ import annotations

import copy
import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from ..generation.rollout import Rollout
from ..generation.sampling import Sampling


@dataclass
class Sampled:
    """One batch back from an engine: the problem ids asked for, their rollout, and the learner
    update count (`version`) of the weights that sampled it."""

    ids: torch.Tensor
    rollout: Rollout
    version: int


class Pending(Protocol):
    def result(self) -> Sampled: ...


class RolloutEngine(Protocol):
    def sync(self, model: torch.nn.Module, version: int) -> None: ...
    def submit(self, ids: torch.Tensor, *, sampling: Sampling, generator: torch.Generator,
               greedy: bool = False) -> Pending: ...
    def close(self) -> None: ...


class Done:
    """A `Pending` whose result is already there."""

    def __init__(self, sampled: Sampled):
        self._sampled = sampled

    def result(self) -> Sampled:
        return self._sampled


def draw_seed(generator: torch.Generator) -> int:
    """One seed for an engine's own sampling generator, drawn from the trainer's."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())


def rollout_to(rollout: Rollout, device: torch.device | str) -> Rollout:
    """The same rollout with every tensor field on `device` (lists and other fields as they are)."""
    moved = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)}
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()}
    return dataclasses.replace(rollout, **moved)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters a learner update changes (all of them, or a LoRA adapter's), detached on CPU:
    what a rollout copy needs after each update."""
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_state_into(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copies `state` (names as `named_parameters` gives them, a subset) into `model`'s parameters."""
    params = dict(model.named_parameters())
    missing = [name for name in state if name not in params]
    if missing:
        raise KeyError(f"weight sync: the rollout copy has no parameter(s) {missing[:3]} "
                       f"({len(missing)} in all): the learner's and the sampler's models differ")
    for name, value in state.items():
        params[name].copy_(value.to(params[name].device, params[name].dtype))


class LocalEngine:
    """Samples with the learner's own policy, in the learner's process, with the trainer's
    generator: on-policy and bit-identical to calling `task.rollout` directly."""

    def __init__(self, task, model: torch.nn.Module):
        self.task, self.model, self.version = task, model, 0

    def sync(self, model: torch.nn.Module, version: int) -> None:
        self.version = version  # the same weights: nothing to copy

    def submit(self, ids, *, sampling: Sampling, generator, greedy: bool = False) -> Pending:
        ro = self.task.rollout(self.model, ids, **sampling.rollout_keywords(), greedy=greedy, generator=generator)
        return Done(Sampled(ids, ro, self.version))

    def close(self) -> None:
        pass


class ThreadEngine:
    """A copy of the policy sampling in a background thread, so the next batch is generated while
    the learner trains (`rollout.overlap` in one process). torch releases the GIL inside its
    kernels, so the two threads share the CPU cores (or the GPU) between them."""

    def __init__(self, task, model: torch.nn.Module):
        self.task = task
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.device = next(model.parameters()).device
        self.version = 0
        self._names = [name for name, p in model.named_parameters() if p.requires_grad]
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmrl-rollout")
        self._inflight: Future | None = None

    def sync(self, model: torch.nn.Module, version: int) -> None:
        if version == self.version:
            return
        if self._inflight is not None:
            self._inflight.result()  # never copy weights under a running rollout
        src = dict(model.named_parameters())
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name in self._names:
                    p.copy_(src[name])
        self.version = version

    def submit(self, ids, *, sampling: Sampling, generator, greedy: bool = False) -> Pending:
        seed, version = draw_seed(generator), self.version
        kind = self.device.type  # autocast is per thread: the caller's (run.mixed_precision) goes with the work
        autocast_on, autocast_dtype = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)

        def work() -> Sampled:
            gen = torch.Generator(device=self.device).manual_seed(seed)
            with torch.autocast(kind, dtype=autocast_dtype, enabled=autocast_on):
                ro = self.task.rollout(self.model, ids, **sampling.rollout_keywords(), greedy=greedy, generator=gen)
            return Sampled(ids, ro, version)

        self._inflight = self._pool.submit(work)
        return self._inflight

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
