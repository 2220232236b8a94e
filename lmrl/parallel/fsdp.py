"""FSDP for Hugging Face policies under torchrun (`distributed.strategy: fsdp`): each rank keeps a
1/N shard of every parameter, gradient and optimizer state, for models that do not fit one device.

    root = shard(trainer.module)             # in place (torch's FSDP2 `fully_shard`), idempotent
    with full_parameters(policy): ...        # sampling / evaluation: whole weights, no collectives
    with gradient_sync(root, sync=False): ...  # accumulation: gradients reduced on the last micro-batch
    state = full_state_dict(policy)          # every rank gathers, rank 0 gets CPU tensors (checkpoints)
    load_full_state_dict(policy, state)      # every rank keeps its shard of a whole state

Units: every decoder layer (the classes a transformers model names in `_no_split_modules`), every
`HFPolicy` (its embeddings, final norm and head) and PPO's `ValueHead`, then the root. One forward
all-gathers a unit's parameters and frees them after it; backward reduce-scatters its gradients.

Sampling cannot work that way: rows finish at different times, so ranks run different numbers of
forward passes, and per-layer all-gathers would wait on each other forever. `full_parameters`
gathers a policy once (one all-gather per unit, the same on every rank) and keeps it whole until the
block ends, so generation makes no collectives; `HFPolicy.generate_ids` and multi-turn episodes
enter it themselves, the trainer around a whole evaluation.

Checkpoints stay in the single-process format (`lmrl.checkpoint`): every rank joins the
gathers, rank 0 writes whole tensors; the optimizer state is id-keyed as `optimizer.state_dict()`
gives it, so a checkpoint resumes under FSDP, DDP or in one process alike."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

_UNIT_CLASSES = {"HFPolicy", "ValueHead"}


def is_sharded(module: nn.Module) -> bool:
    return any(isinstance(m, FSDPModule) for m in module.modules())


def _units(module: nn.Module) -> list[FSDPModule]:
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def _layer_classes(root: nn.Module) -> set[str]:
    """Decoder-layer class names of every transformers model inside `root` (e.g. LlamaDecoderLayer)."""
    names = set()
    for m in root.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return names


def shard(root: nn.Module, *, frozen: bool = False) -> nn.Module:
    """Shards `root` in place over all ranks (a no-op if it already is) and returns it.

    `frozen`: a module that never trains (a KL reference copy): its root frees its parameters after
    every forward too, as no backward will. A policy's prompt-sharing shortcut is switched off: its
    number of forward passes depends on the batch, and every rank must run the same."""
    if is_sharded(root):
        return root
    layers = _layer_classes(root)
    if not layers:
        raise ValueError(f"distributed.strategy=fsdp: found no decoder layers to shard in {type(root).__name__} "
                         f"(it shards transformers models, which name them in _no_split_modules)")
    mods = list(root.modules())
    for m in reversed(mods):  # inner units first: a unit owns the parameters no inner unit took
        if m is root:
            continue
        if type(m).__name__ in layers or type(m).__name__ in _UNIT_CLASSES:
            if hasattr(m, "share_prompts"):
                m.share_prompts = False
            fully_shard(m, reshard_after_forward=True)
            m._lmrl_reshard_after_forward = True
    if hasattr(root, "share_prompts"):
        root.share_prompts = False
    # The root keeps its parameters from forward to backward (FSDP's default), unless nothing trains.
    fully_shard(root, reshard_after_forward=frozen)
    root._lmrl_reshard_after_forward = frozen
    # FSDP takes the first module to run forward as its root; sampling calls inner modules directly,
    # so run one token through the real root now.
    device, training = next(root.parameters()).device, root.training
    root.eval()  # no dropout: the global RNG stays where it was
    with torch.no_grad():
        root(torch.zeros(1, 1, dtype=torch.long, device=device))
    root.train(training)
    for unit in _units(root):
        unit.reshard()
    return root


@contextlib.contextmanager
def full_parameters(module: nn.Module):
    """Inside, every parameter of `module` is whole on this process and forward passes through it
    make no collectives (a no-op when nothing in it is sharded). Entering and leaving are
    collective: every rank must enter the same blocks in the same order. Nested blocks leave the
    units an outer block gathered to it."""
    units = [u for u in _units(module) if not getattr(u, "_lmrl_gathered", False)]
    for unit in units:
        unit.unshard()  # one all-gather per unit, in module order on every rank
        unit.set_reshard_after_forward(False, recurse=False)
        unit._lmrl_gathered = True
    try:
        yield module
    finally:
        for unit in units:
            unit._lmrl_gathered = False
            unit.set_reshard_after_forward(getattr(unit, "_lmrl_reshard_after_forward", True), recurse=False)
            unit.reshard()


@contextlib.contextmanager
def gradient_sync(root: nn.Module, sync: bool):
    """Gradient accumulation: with `sync` False the backward keeps whole gradients locally (no
    reduce-scatter); the micro-batch with `sync` True reduces the sum (FSDP's `no_sync`)."""
    root.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)


def _reshard(module: nn.Module) -> None:
    """Registers the sharded parameters again (a root keeps whole ones after a no-grad forward),
    so that names and parameters are the ones the optimizer holds. Local: no collectives."""
    for unit in _units(module):
        unit.reshard()


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(module: nn.Module, names=None) -> dict[str, torch.Tensor]:
    """`module.state_dict()` (or its entries `names`) with every tensor whole, on the CPU, on rank 0;
    the other ranks join each gather and get {}. Collective: every rank passes the same names. A
    tied weight (one parameter under two names) is gathered once and stays one tensor."""
    _reshard(module)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    first: dict[int, str] = {}  # id(parameter) -> its first name
    canonical = {}  # name -> the first name of its parameter
    for name, p in module.named_parameters(remove_duplicate=False):
        canonical[name] = first.setdefault(id(p), name)
    state = module.state_dict()
    gathered: dict[str, torch.Tensor] = {}  # rank 0 only
    seen: set[str] = set()  # on every rank, so that every rank gathers the same tensors
    out = {}
    for name in state if names is None else names:
        key = canonical.get(name, name)
        if key not in seen:
            seen.add(key)
            whole = _whole(state[key])
            if rank0:
                gathered[key] = whole.detach().cpu()
        if rank0:
            out[name] = gathered[key]
    return out


@torch.no_grad()
def load_full_state_dict(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copies whole tensors (names as in `module.state_dict()`, any subset; a tied weight under any
    of its names) into `module`, each rank keeping its own shard. Every rank passes the same state;
    no collectives."""
    _reshard(module)
    params = dict(module.named_parameters(remove_duplicate=False))
    targets = {**dict(module.named_buffers(remove_duplicate=False)), **params}
    for name, value in state.items():
        if name not in targets:
            raise KeyError(f"{type(module).__name__} has no parameter or buffer {name!r}")
        _copy_whole(targets[name], value)


def _copy_whole(target: torch.Tensor, value: torch.Tensor) -> None:
    value = value.to(device=target.device, dtype=target.dtype)
    if isinstance(target, DTensor):  # this rank's slice, as FSDP cut it (src_data_rank=None: no broadcast)
        value = distribute_tensor(value, target.device_mesh, target.placements, src_data_rank=None)
    target.copy_(value)


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` with every sharded state tensor (Adam's moments) whole, on the CPU:
    the single-process format, on rank 0 ({} elsewhere). Collective."""
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    sd = optimizer.state_dict()
    state = {}
    for index in sorted(sd["state"]):
        entry = {k: _whole(v).detach().cpu() if torch.is_tensor(v) else v for k, v in sd["state"][index].items()}
        if rank0:
            state[index] = entry
    return {"state": state, "param_groups": sd["param_groups"]} if rank0 else {}


def load_optimizer_state(optimizer: torch.optim.Optimizer, sd: dict) -> None:
    """Loads a single-process `optimizer.state_dict()` into an optimizer over sharded parameters:
    each rank keeps its shard of every state tensor shaped like its parameter. No collectives."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in sd["state"].items():
        p = params[int(index)]
        state[index] = {k: _shard_like(p, v) for k, v in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


def _shard_like(param: torch.Tensor, value):
    if isinstance(param, DTensor) and torch.is_tensor(value) and value.shape == param.shape:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    return value


def is_sharded_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    return any(isinstance(p, DTensor) for group in optimizer.param_groups for p in group["params"])
