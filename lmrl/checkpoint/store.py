"""One checkpoint as a whole, written and read: `save_checkpoint` (a step's weights, extra modules,
optimizer, scheduler, RNG, manifest and trainer state, then pruning), `save_weights` (a weights-only
checkpoint such as `best/`) and `load_checkpoint`.

A save writes every file (`formats`), then manifest.json (each file's name and size, so a missing
or cut-short file is found without guessing which files the checkpoint should hold), then
trainer_state.json last, whose presence marks a complete checkpoint; all of it atomically (`atomic`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .atomic import fsync, torch_save, write_atomically, write_text
from .directory import prune, remove_stale_temps
from .formats import (AdapterWeights, capture_rng_state, load_optimizer_state, load_weights, restore_rng_state,
                      save_model_weights, save_weights_file, torch_load, weights_file)
from .layout import (MANIFEST_FILE, OPTIMIZER_FILE, RNG_FILE, SCHEDULER_FILE, TRAINER_STATE_FILE, CheckpointError,
                     one_line, step_dir)


# --- saving ----------------------------------------------------------------------------------

def _write_model_and_state(tmp: Path, model: torch.nn.Module | dict | AdapterWeights, state_json: str) -> None:
    for file in save_model_weights(model, tmp):
        fsync(file)
    # The manifest lists every file written so far with its size: what check_checkpoint compares.
    sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    write_text(tmp / MANIFEST_FILE, json.dumps({"files": sizes}, indent=2))
    # trainer_state.json goes last: its presence is what marks the checkpoint complete.
    write_text(tmp / TRAINER_STATE_FILE, state_json)


def _to_json(trainer_state: dict) -> str:
    try:
        return json.dumps(trainer_state, indent=2)
    except TypeError as e:
        raise TypeError(f"trainer_state must be JSON-serialisable (plain numbers, str, lists, dicts; "
                        f"call .item() on tensors): {e}") from None


def save_checkpoint(ckpt_dir: Path, step: int, *, model: torch.nn.Module | dict | AdapterWeights, optimizer=None,
                    scheduler=None,
                    generators: dict[str, torch.Generator] | None = None, trainer_state: dict,
                    keep: int = 2, modules: dict[str, torch.nn.Module] | None = None) -> Path:
    """Atomically write `ckpt_dir/step_<step>/`, then prune to the `keep` newest (keep<=0: keep all).
    `model` and each of `modules` may be the weights to write instead (what `weights_to_save` names,
    gathered whole; for `model`, what `gathered_weights` makes of them), and `optimizer` its state
    dict: how a sharded model is saved.

    The checkpoint just written always survives pruning, even if higher steps exist (a run restarted
    from scratch in the same dir); the other `keep - 1` slots go to the highest steps. `best/` and
    anything not named `step_<N>` is never pruned. Stale `.tmp-*` dirs of killed saves are removed.
    """
    ckpt_dir = Path(ckpt_dir)
    state_json = _to_json(trainer_state)  # fail before touching the disk
    remove_stale_temps(ckpt_dir)

    def write_files(tmp: Path) -> None:
        if optimizer is not None:  # an optimizer, or its gathered state dict (FSDP)
            torch_save(optimizer if isinstance(optimizer, dict) else optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if scheduler is not None:
            torch_save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        torch_save(capture_rng_state(generators), tmp / RNG_FILE)
        for name, module in (modules or {}).items():
            save_weights_file(module, tmp / f"{name}.safetensors")
            fsync(tmp / f"{name}.safetensors")
        _write_model_and_state(tmp, model, state_json)

    path = write_atomically(step_dir(ckpt_dir, step), write_files)
    prune(ckpt_dir, keep, path)
    return path


def save_weights(path: Path, model: torch.nn.Module | dict | AdapterWeights, *, trainer_state: dict) -> Path:
    """Atomically write a weights-only checkpoint (e.g. `checkpoints/best/`): the model's weights (a
    LoRA policy's in PEFT's layout; or its gathered weights) + manifest.json + trainer_state.json."""
    path = Path(path)
    state_json = _to_json(trainer_state)
    return write_atomically(path, lambda tmp: _write_model_and_state(tmp, model, state_json))


# --- loading ---------------------------------------------------------------------------------

def _require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise CheckpointError(f"{path} not found: cannot restore the {what} from this checkpoint "
                              f"(files present: {sorted(p.name for p in path.parent.iterdir())})")
    return path


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer=None, scheduler=None,
                    generators: dict[str, torch.Generator] | None = None,
                    map_location: str | torch.device = "cpu", restore_rng: bool = True,
                    modules: dict[str, torch.nn.Module] | None = None) -> dict:
    """Restore everything given from the checkpoint dir `path`; return its trainer_state.

    Model keys are checked strictly. A weights-only save (`best/`) has no rng.pt: load it with
    `restore_rng=False`.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint dir {path} does not exist")
    state_file = path / TRAINER_STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path} is incomplete (no {TRAINER_STATE_FILE}); probably a save that was "
                              f"killed. Use latest_checkpoint() to find a complete one.")
    try:
        trainer_state = json.loads(state_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{state_file} is not valid JSON ({one_line(e)})") from None

    load_weights(model, _require(weights_file(path), "model"), map_location)
    for name, module in (modules or {}).items():
        load_weights(module, _require(path / f"{name}.safetensors", name), map_location)
    if optimizer is not None:
        load_optimizer_state(optimizer, torch_load(_require(path / OPTIMIZER_FILE, "optimizer"), map_location))
    if scheduler is not None:
        scheduler.load_state_dict(torch_load(_require(path / SCHEDULER_FILE, "scheduler"), map_location))
    if restore_rng:
        # RNG states are CPU byte tensors whatever the device: torch.set_rng_state insists.
        rng = torch_load(_require(path / RNG_FILE, "RNG state"), "cpu")
        restore_rng_state(rng, generators)
    return trainer_state
