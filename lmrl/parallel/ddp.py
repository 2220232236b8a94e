"""torchrun helpers: one process per device, gradients averaged by DDP, rank 0 logs and saves.

`torchrun --nproc_per_node=N -m lmrl train adder` sets RANK/WORLD_SIZE/LOCAL_RANK; without them
everything here degrades to a single process with no process group. Under torchrun the process group
is joined even with one process (`--nproc_per_node=1`), so a one-GPU machine runs the DDP / FSDP code
path of a multi-GPU run (one NCCL rank) rather than the plain one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..common.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    grouped: bool = False  # in a torch.distributed process group (torchrun), whatever its size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """DDP / FSDP wrapping and collectives are on: this process is one rank of a process group."""
        return self.grouped or self.world_size > 1


DEVICES = "auto | cpu | cuda | cuda:N"  # what run.device takes


def device_problem(preference: str, key: str = "run.device") -> str | None:
    """The line saying `preference` is not one of `DEVICES`, or None."""
    if re.fullmatch(r"auto|cpu|cuda(:\d+)?", preference):
        return None
    return f"{key}={preference!r} is not one of {DEVICES}"


def resolve_device(preference: str, info: DistInfo) -> torch.device:
    """'auto' → this rank's GPU when CUDA is present, else CPU; 'cuda' → cuda:<local_rank>; 'cuda:N'
    → that GPU. A name outside `DEVICES`, or a GPU that is not there, is a ConfigError naming it."""
    problem = device_problem(preference)
    if problem:
        raise ConfigError(problem)
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if not preference.startswith("cuda"):
        return torch.device(preference)
    if not torch.cuda.is_available():
        raise ConfigError(f"run.device={preference} but no CUDA device is visible; use run.device=cpu or auto")
    device = torch.device("cuda", info.local_rank) if preference == "cuda" else torch.device(preference)
    count = torch.cuda.device_count()
    if device.index >= count:
        named = f"gives rank {info.rank} cuda:{device.index} (its LOCAL_RANK)" if preference == "cuda" else "names a GPU"
        visible = "cuda:0" + (f" to cuda:{count - 1}" if count > 1 else "")
        raise ConfigError(f"run.device={preference} {named}, but this process sees {count} CUDA "
                          f"device{'s' if count > 1 else ''} ({visible})")
    return device


def init_distributed(preference: str = "auto") -> tuple[DistInfo, torch.device]:
    """Joins the torchrun process group when launched by torchrun (gloo on CPU, nccl on GPU), also
    when it started a single process (TORCHELASTIC_RUN_ID is torchrun's own variable)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        info = DistInfo()
        return info, resolve_device(preference, info)
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")), grouped=True)
    device = resolve_device(preference, info)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    return info, device


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place); identity in a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(obj):
    """Rank 0's `obj` on every rank (any picklable value); identity in a single process."""
    if dist.is_available() and dist.is_initialized():
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return obj


def gather_object(obj) -> list | None:
    """Every rank's `obj` (any picklable value) on rank 0, in rank order; None on the other ranks.
    `[obj]` in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    every = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, every, dst=0)
    return every
