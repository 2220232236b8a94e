"""What each file of a checkpoint holds, written and read: the model's weights as safetensors (each
tied weight once; a LoRA policy's or reward model's adapter only, in PEFT's own layout: adapter_model.safetensors +
adapter_config.json, so `PeftModel.from_pretrained(base, step_dir)` loads it), the RNG states (python,
numpy, torch, CUDA, named generators) as tensors and plain values, and optimizer / scheduler state
read with `torch.load(weights_only=True)`: no pickled code runs on load.

A model sharded by FSDP (`lmrl.parallel.fsdp`) is written in the same layout from its weights
gathered whole (`whole_weights`, `gathered_weights`); loading gives each rank its shard.
"""

from __future__ import annotations

import copy
import random
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from ..models.reference import has_lora_adapter
from .layout import ADAPTER_CONFIG_FILE, ADAPTER_FILE, MODEL_FILE, CheckpointError, one_line


# --- RNG state -------------------------------------------------------------------------------
# Everything is turned into tensors, ints, floats and lists so that it loads under
# torch.load(weights_only=True), which refuses numpy arrays.

def capture_rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Snapshot python `random`, numpy's global RNG, torch CPU/CUDA RNGs and named generators."""
    version, mt_state, gauss_next = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"kind": np_kind, "keys": torch.from_numpy(np_keys.astype(np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def restore_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    """Put back what `capture_rng_state` took; each given generator must be in `state`."""
    missing = sorted(set(generators or {}) - set(state["generators"]))
    if missing:
        raise CheckpointError(f"no saved RNG state for generator(s) {missing}; "
                              f"saved: {sorted(state['generators'])}")
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    npst = state["numpy"]
    np.random.set_state((npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda = state["cuda"]
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            warnings.warn(f"checkpoint has CUDA RNG states for {len(cuda)} device(s), this process sees "
                          f"{torch.cuda.device_count()}; restoring the first ones only")
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)
    for name, g in (generators or {}).items():
        g.set_state(state["generators"][name])


# --- optimizer and scheduler state ----------------------------------------------------------

def torch_load(file: Path, map_location) -> Any:
    """torch.load(weights_only=True), any failure to read turned into one line naming the file."""
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated, empty or foreign file: each reader raises its own type
        raise CheckpointError(f"{file} does not load ({one_line(e)})") from None


def _sharded_optimizer(optimizer) -> bool:
    if "lmrl.parallel.fsdp" not in sys.modules:
        return False
    from ..parallel.fsdp import is_sharded_optimizer

    return is_sharded_optimizer(optimizer)


def load_optimizer_state(optimizer, saved: dict) -> None:
    """Load the optimizer state dict `saved` (as a checkpoint holds it, whole) into `optimizer`; a
    sharded optimizer keeps its rank's shard of Adam's moments."""
    if _sharded_optimizer(optimizer):
        from ..parallel.fsdp import load_optimizer_state as load_sharded

        load_sharded(optimizer, saved)
    else:
        optimizer.load_state_dict(saved)


# --- model weights ---------------------------------------------------------------------------

def _adapter_only(model: torch.nn.Module) -> bool:
    """A LoRA policy, or a LoRA reward model (whose score head trains too: peft's `modules_to_save`,
    which its adapter files hold): only the adapter trains, so only the adapter is saved."""
    return has_lora_adapter(model) or _lora_reward_model(model)


def _lora_reward_model(model: torch.nn.Module) -> bool:
    """A `RewardModel` whose sequence classifier carries a peft adapter (checked without importing peft)."""
    return any(c.__name__ == "RewardModel" for c in type(model).__mro__) and \
        hasattr(getattr(model, "model", None), "peft_config")


def _sharded(model: torch.nn.Module) -> bool:
    """Sharded by FSDP (checked without importing FSDP, a second's work, when nothing has)."""
    if "lmrl.parallel.fsdp" not in sys.modules:
        return False
    from ..parallel.fsdp import is_sharded

    return is_sharded(model)


def _tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Names that share one parameter (tied embeddings), sorted, one list per parameter."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def weights_to_save(model: torch.nn.Module) -> list[str]:
    """The names `save_weights_file` writes for `model`: a LoRA policy's adapter weights; otherwise
    its state dict with each tied weight once, under the name safetensors' `save_model` keeps (the
    first in sort order)."""
    if _adapter_only(model):
        return [n for n, p in model.named_parameters() if p.requires_grad]
    dropped = {n for names in _tied_names(model) for n in names[1:]}
    return [n for n in model.state_dict() if n not in dropped]


# HFPolicy.model is the PeftModel: the policy's parameter names start with this.
_PEFT_MODEL_PREFIX = "model."
_ADAPTER_NAME = "default"  # the adapter lmrl.models.lora adds; PEFT's files leave its name out


@dataclass
class AdapterWeights:
    """A LoRA policy's adapter as PEFT saves it: `tensors` under the names peft's
    get_peft_model_state_dict gives them (the adapter name left out) and `config`, the adapter's
    peft.LoraConfig. `save_model_weights` writes it as adapter_model.safetensors +
    adapter_config.json."""

    tensors: dict[str, torch.Tensor]
    config: Any


def _peft_names(model: torch.nn.Module) -> dict[str, str]:
    """Each adapter weight of the LoRA policy `model`, as `weights_to_save` names it -> its name in
    PEFT's adapter_model.safetensors. The names are peft's own: get_peft_model_state_dict selects and
    renames the entries of the state dict it is handed, and is handed each weight's index here, so
    its answer says which name became which."""
    from peft import get_peft_model_state_dict

    names = weights_to_save(model)
    by_index = {n.removeprefix(_PEFT_MODEL_PREFIX): torch.tensor(i) for i, n in enumerate(names)}
    renamed = get_peft_model_state_dict(model.model, state_dict=by_index, adapter_name=_ADAPTER_NAME,
                                        save_embedding_layers=False)
    peft_name = {names[int(i)]: name for name, i in renamed.items()}
    lost = [n for n in names if n not in peft_name]
    if lost:
        raise CheckpointError(f"{len(lost)} trainable weight(s) of {type(model).__name__} are not part of its LoRA "
                              f"adapter, so PEFT's adapter layout cannot hold them (the first: {lost[0]})")
    return peft_name


def gathered_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict | AdapterWeights:
    """What `save_checkpoint` / `save_weights` take in place of `model` once its `weights_to_save`
    are gathered whole (FSDP): for a LoRA policy its adapter in PEFT's layout, else the tensors."""
    return adapter_weights(model, tensors) if _adapter_only(model) else tensors


def adapter_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor] | None = None) -> AdapterWeights:
    """The LoRA policy `model`'s adapter as PEFT saves it. `tensors`: its adapter weights under the
    names `weights_to_save` gives (e.g. gathered whole from shards); by default, its own parameters."""
    if tensors is None:
        tensors = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    names = _peft_names(model)
    config = copy.deepcopy(model.model.peft_config[_ADAPTER_NAME])
    config.inference_mode = True  # as PeftModel.save_pretrained writes it; from_pretrained sets it on load
    return AdapterWeights({names[n]: t for n, t in tensors.items()}, config)


def whole_weights(module: torch.nn.Module) -> dict | AdapterWeights:
    """What a checkpoint writes for the FSDP-sharded `module`: its `weights_to_save` gathered whole
    (every rank takes part; rank 0 gets the tensors), a LoRA policy's as its PEFT adapter."""
    from ..parallel.fsdp import full_state_dict

    return gathered_weights(module, full_state_dict(module, weights_to_save(module)))


def whole_training_state(model: torch.nn.Module, optimizer=None, modules: dict | None = None):
    """(model, optimizer, modules) as `save_checkpoint` takes them for FSDP-sharded ones: the model's
    and each module's weights gathered whole (`whole_weights`), the optimizer's state dict gathered
    whole. Every rank calls it, in the same order."""
    from ..parallel.fsdp import full_optimizer_state

    model = whole_weights(model)
    modules = {name: whole_weights(m) for name, m in modules.items()} if modules else None
    optimizer = full_optimizer_state(optimizer) if optimizer is not None else None
    return model, optimizer, modules


def weights_file(path: Path) -> Path:
    """The file holding the model's weights in checkpoint dir `path`: adapter_model.safetensors for a
    LoRA policy's adapter in PEFT's layout, else model.safetensors (which may not exist)."""
    path = Path(path)
    return path / ADAPTER_FILE if (path / ADAPTER_FILE).is_file() else path / MODEL_FILE


def save_model_weights(model: torch.nn.Module | dict | AdapterWeights, directory: Path) -> list[Path]:
    """Write the model's weights into the checkpoint dir `directory` and return the files written:
    a LoRA policy's adapter (or `AdapterWeights`) as adapter_model.safetensors + adapter_config.json,
    anything else (a gathered dict included) as model.safetensors."""
    directory = Path(directory)
    if isinstance(model, torch.nn.Module) and _adapter_only(model):
        model = adapter_weights(model)
    if not isinstance(model, AdapterWeights):
        save_weights_file(model, directory / MODEL_FILE)
        return [directory / MODEL_FILE]
    save_file({n: t.contiguous() for n, t in model.tensors.items()}, str(directory / ADAPTER_FILE),
              metadata={"format": "pt"})  # the metadata PEFT writes
    model.config.save_pretrained(str(directory))  # adapter_config.json
    return [directory / ADAPTER_FILE, directory / ADAPTER_CONFIG_FILE]


def save_weights_file(model: torch.nn.Module | dict, file: Path) -> None:
    """Write `model`'s weights (or a dict of them) as one safetensors file under the names
    `weights_to_save` gives: a LoRA policy's adapter weights only, else its state dict."""
    if isinstance(model, dict):  # already gathered, named as `weights_to_save` names them
        save_file({n: t.contiguous() for n, t in model.items()}, str(file))
    elif _adapter_only(model):
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}, str(file))
    else:
        save_model(model, str(file))


def load_weights(model: torch.nn.Module, file: Path, map_location: str | torch.device = "cpu") -> None:
    """Load a safetensors file, or the weights of a checkpoint dir (`weights_file`), into `model`,
    every key matching exactly (for a LoRA policy: every adapter weight, and nothing else). A LoRA
    policy reads PEFT's adapter_model.safetensors or, from checkpoints saved before that layout, a
    model.safetensors holding its adapter; a checkpoint dir reads the weights file it holds. A
    sharded model takes its shard of each tensor on every rank."""
    file = Path(file)
    if file.is_dir():
        file = weights_file(file)
    try:
        _load_weights(model, file, map_location)
    except (SafetensorError, OSError) as e:  # every tensor is read before any reaches the model
        raise CheckpointError(f"{file} does not load ({one_line(e)})") from None


def _load_weights(model: torch.nn.Module, file: Path, map_location) -> None:
    sharded = _sharded(model)
    if file.name == ADAPTER_FILE:
        if not _adapter_only(model):
            raise CheckpointError(f"{file} holds a LoRA adapter, and {type(model).__name__} has none to load it "
                                  f"into (build the policy with the LoRA settings of the run that saved it)")
        state = load_file(str(file), device="cpu" if sharded else str(map_location))
        name_of = {peft: name for name, peft in _peft_names(model).items()}
        missing, unexpected = set(name_of) - set(state), set(state) - set(name_of)
        if missing or unexpected:  # named as in the file
            raise CheckpointError(f"{file} does not match the LoRA adapter of {type(model).__name__}: "
                                  f"missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}")
        state = {name_of[k]: t for k, t in state.items()}
        params = dict(model.named_parameters())
        for name, t in state.items():
            if tuple(t.shape) != tuple(params[name].shape):
                raise CheckpointError(f"{file}: {name} has shape {tuple(t.shape)}, the model's is "
                                      f"{tuple(params[name].shape)} (saved with another lora.r?)")
        if sharded:
            from ..parallel.fsdp import load_full_state_dict

            load_full_state_dict(model, state)
        else:
            model.load_state_dict(state, strict=False)
        return
    if _adapter_only(model) or sharded:
        state = load_file(str(file), device="cpu" if sharded else str(map_location))
        expected = set(weights_to_save(model))
        for names in _tied_names(model):  # a saved tied weight may be stored under any of its names
            present = [n for n in names if n in state]
            if present and expected & set(names):
                expected = expected - set(names) | {present[0]}
        missing, unexpected = expected - set(state), set(state) - expected
        if not (missing or unexpected):
            if sharded:
                from ..parallel.fsdp import load_full_state_dict

                load_full_state_dict(model, state)
            else:
                model.load_state_dict(state, strict=False)
            return
        if not missing and not sharded and _lora_reward_model(model):
            # the whole model, frozen base and all: how LoRA reward models were saved before PEFT's layout
            missing, unexpected = load_model(model, file, strict=False, device=str(map_location))
    else:
        missing, unexpected = load_model(model, file, strict=False, device=str(map_location))
    if missing or unexpected:
        raise CheckpointError(f"{file} does not match {type(model).__name__}: "
                              f"missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}")


def load_initial_weights(model: torch.nn.Module, source: str, device) -> None:
    """`model.init_from`: a checkpoint dir (its model.safetensors or adapter_model.safetensors) or a
    .safetensors file."""
    path = Path(source)
    file = weights_file(path) if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"model.init_from={source!r}: no such file (expected a checkpoint dir holding "
                                f"{MODEL_FILE} or {ADAPTER_FILE}, or a .safetensors file)")
    try:
        load_weights(model, file, device)
    except CheckpointError as e:
        raise CheckpointError(f"model.init_from={source!r}: {e}") from None


