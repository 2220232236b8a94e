"""Which rollout engine samples an RL run's batches: `rollout.engine` names one in `ENGINES` (the
config's choices are this registry), and `rollout.workers` > 0 puts Ray workers in its place.

    engine = make_engine(config, task, policy, group_size=4, info=log.info, ckpt_dir=run_dir / "checkpoints",
                         build_worker=functools.partial(build_worker_parts, config))
"""

from __future__ import annotations

from typing import Callable

import torch

from .ray_engine import RayRolloutEngine
from .local import LocalEngine, RolloutEngine, ThreadEngine
from .vllm_engine import VLLMEngine


def _local(config, task, policy: torch.nn.Module, world_size: int) -> RolloutEngine:
    """The learner's own policy; with `rollout.overlap`, a copy of it sampling in a background thread."""
    return ThreadEngine(task, policy) if config.rollout.overlap else LocalEngine(task, policy)


def _vllm(config, task, policy: torch.nn.Module, world_size: int) -> RolloutEngine:
    return VLLMEngine(config, task, policy, world_size=world_size)


# `rollout.engine` name -> its builder (config, task, policy, world_size) -> engine
ENGINES: dict[str, Callable[..., RolloutEngine]] = {"local": _local, "vllm": _vllm}


def make_engine(config, task, policy: torch.nn.Module, *, group_size: int = 1, world_size: int = 1,
                info: Callable[[str], None] = print, ckpt_dir=None,
                build_worker: Callable | None = None) -> RolloutEngine:
    """The engine `config` asks for to sample `task`'s completions from `policy`: Ray workers
    (`rollout.workers` > 0, whole groups of `group_size` rows per worker, each building its task and
    policy with `build_worker(device)`: the trainer's `lmrl.train.build.build_worker_parts` bound to
    the config), else the one `rollout.engine` names. `info` logs a line; `ckpt_dir` is named when a
    failure stops the run."""
    if config.rollout.workers > 0:
        if build_worker is None:
            raise ValueError("rollout.workers > 0 needs build_worker= (what each Ray worker builds its task and "
                             "policy with, e.g. functools.partial(lmrl.train.build.build_worker_parts, config))")
        return RayRolloutEngine(config, task, build_worker=build_worker, group_size=group_size, info=info,
                                ckpt_dir=ckpt_dir)
    return ENGINES[config.rollout.engine](config, task, policy, world_size)
