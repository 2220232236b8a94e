"""Atomic, resumable checkpoints: weights, optimizer, scheduler, RNG and trainer state.

Layout of one checkpoint, `<run_dir>/checkpoints/step_<N>/`:

    model.safetensors    model.state_dict(), tied tensors stored once (safetensors save_model)
    adapter_model.safetensors, adapter_config.json
                         in place of model.safetensors for a policy with a LoRA adapter: its
                         adapter only, in PEFT's own layout (the names and config PeftModel's
                         save_pretrained writes), so `PeftModel.from_pretrained(base, step_dir)`
                         loads it; the frozen base is the model.path it was loaded from. Checkpoints
                         saved before this layout hold the adapter in model.safetensors, under the
                         policy's parameter names; they still load
    <name>.safetensors   further modules the trainer needs back (PPO's `value`, the KL `reference`,
                         the weight average `ema` of `train.ema_decay`)
    optimizer.pt         optimizer.state_dict()            (only if an optimizer was given)
    scheduler.pt         scheduler.state_dict()            (only if a scheduler was given)
    rng.pt               python / numpy / torch / CUDA / named-generator RNG states
    manifest.json        the name and size in bytes of every file above, so a missing or cut-short
                         file is found without guessing which files this checkpoint should hold
    trainer_state.json   whatever the trainer needs to resume; written last, so its presence
                         marks a complete checkpoint

A model sharded by FSDP (`lmrl.parallel.fsdp`) is written in the same layout: every rank joins the
gathers (`lmrl.parallel.fsdp.full_state_dict`, `full_optimizer_state`) and rank 0 passes the whole
tensors here in place of the model and optimizer (`gathered_weights` turns a LoRA policy's into its
PEFT adapter; a plain dict of them is written as model.safetensors); loading gives each rank its shard.

Every save goes into `.tmp-<name>-<pid>/` next to its final name, is fsynced, and is then
renamed into place, so a killed run leaves either the old checkpoint or the new one, never half
of one. A full disk (ENOSPC or a quota, inside torch's or safetensors' writer) removes the temporary
folder and raises `TrainingError` in one line naming the checkpoint and the previous one, intact.
Everything is loaded with `torch.load(weights_only=True)`: no pickled code runs on load.
One process (rank 0) writes to a checkpoints dir at a time (the run dir's lock, train/run_dir.py, sees to it).

A file can still be damaged after its save (a full disk, a copy cut short, a hand edit).
`check_checkpoint` reads every file of a checkpoint without touching a model and says which one
does not load; `resume_checkpoint` picks the newest checkpoint that loads, moves each newer damaged
one aside to `damaged-step_<N>` (kept, never deleted or overwritten) and says why it was skipped.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import random
import re
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from .common.errors import TrainingError
from .models.reference import has_lora_adapter

MODEL_FILE = "model.safetensors"
# PEFT's file names (peft.utils.SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME): a LoRA policy's checkpoint
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.pt"
TRAINER_STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"

_STEP_DIR = re.compile(r"step_(\d+)")
_TMP_PREFIX = ".tmp-"
_DAMAGED_PREFIX = "damaged-"


class CheckpointError(RuntimeError):
    """A checkpoint on disk is damaged, or does not match what it is being loaded into."""


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


# --- listing ---------------------------------------------------------------------------------

def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.fullmatch(path.name)
    return int(m.group(1)) if m else None


def _step_dirs(ckpt_dir: Path) -> list[Path]:
    """Every `step_<N>` dir in `ckpt_dir`, complete or not, sorted by N (numerically, not by name)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted((p for p in ckpt_dir.iterdir() if p.is_dir() and _step_of(p) is not None), key=_step_of)


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete `step_<N>` dirs in `ckpt_dir` (holding trainer_state.json), sorted by N. Their files
    are not read: `find_resume_checkpoint` checks that they load."""
    return [p for p in _step_dirs(ckpt_dir) if (p / TRAINER_STATE_FILE).is_file()]


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The complete `step_<N>` dir with the highest N, or None if there is none."""
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


# --- checking --------------------------------------------------------------------------------

def _one_line(e: BaseException) -> str:
    """`Type: first sentence of the message`, at most 160 characters of it (torch's messages go on
    with advice, such as loading with weights_only=False, that does not fit a damaged file)."""
    lines = str(e).strip().splitlines()
    line = lines[0].strip() if lines else ""
    end = line.find(". ")
    if end >= 0:
        line = line[: end + 1]
    if len(line) > 160:
        line = line[:157] + "..."
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def _read_safetensors(file: Path) -> None:
    """Open `file` and read every tensor in it, keeping none."""
    with safe_open(str(file), framework="pt", device="cpu") as f:
        for key in f.keys():
            f.get_tensor(key)


def _read_torch(file: Path) -> None:
    torch.load(file, map_location="cpu", weights_only=True)


def check_checkpoint(path: Path) -> str | None:
    """None if every file of the checkpoint dir `path` loads; otherwise one line naming the first
    file that does not and why. Reads the files only, touching no model or optimizer:

    - trainer_state.json is present and a JSON object whose "step" is an int (N, in `step_<N>`);
    - each file manifest.json lists is present with the size it lists (checkpoints saved before
      manifests existed skip this check);
    - the model's weights are present: model.safetensors, or a LoRA adapter's
      adapter_model.safetensors with its adapter_config.json (a JSON object naming a peft_type);
    - every *.safetensors opens and each of its tensors reads (safetensors.safe_open);
    - every *.pt loads with torch.load(weights_only=True) (optimizer.pt, scheduler.pt, rng.pt).

    It cannot tell whether the tensors match the model they will be loaded into; `load_checkpoint`
    checks that.
    """
    try:
        return _check(Path(path))
    except OSError as e:  # the dir or a file went away or cannot be read while being checked
        return f"cannot be read ({_one_line(e)})"


def _check(path: Path) -> str | None:
    if not path.is_dir():
        return "is not a directory"
    state_file = path / TRAINER_STATE_FILE
    if not state_file.is_file():
        return f"{TRAINER_STATE_FILE} is missing (a save that did not finish, or a removed file)"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"{TRAINER_STATE_FILE} is not valid JSON ({_one_line(e)})"
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        return f"{TRAINER_STATE_FILE} holds no integer \"step\""
    if _step_of(path) is not None and step != _step_of(path):
        return f"{TRAINER_STATE_FILE} says step {step}, the dir is {path.name}"

    manifest_file = path / MANIFEST_FILE
    if manifest_file.exists():
        try:
            listed = json.loads(manifest_file.read_text(encoding="utf-8"))["files"]
            listed = {str(name): int(size) for name, size in listed.items()}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{MANIFEST_FILE} is not valid ({_one_line(e)})"
        for name, size in listed.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing ({MANIFEST_FILE} lists it, {size:,} bytes)"
            actual = file.stat().st_size
            if actual != size:
                what = "empty" if actual == 0 else "cut short" if actual < size else "longer than saved"
                return f"{name} is {what}: {actual:,} bytes, {MANIFEST_FILE} lists {size:,}"
    problem = _check_model_files(path)
    if problem:
        return problem

    for file in sorted(path.iterdir()):
        reader = {".safetensors": _read_safetensors, ".pt": _read_torch}.get(file.suffix)
        if reader is None or not file.is_file():
            continue
        if file.stat().st_size == 0:
            return f"{file.name} is empty (0 bytes)"
        try:
            reader(file)
        except Exception as e:  # whatever the reader raises, the file does not load
            return f"{file.name} does not load ({_one_line(e)})"
    return None


def _check_model_files(path: Path) -> str | None:
    """Why the model's weights files of checkpoint dir `path` are incomplete, or None."""
    adapter, config = path / ADAPTER_FILE, path / ADAPTER_CONFIG_FILE
    if not (adapter.is_file() or config.is_file()):
        return None if (path / MODEL_FILE).is_file() else f"{MODEL_FILE} is missing"
    if not adapter.is_file():
        return f"{ADAPTER_FILE} is missing ({ADAPTER_CONFIG_FILE} is there)"
    if not config.is_file():
        return f"{ADAPTER_CONFIG_FILE} is missing ({ADAPTER_FILE} is there)"
    try:
        loaded = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return f"{ADAPTER_CONFIG_FILE} is not valid JSON ({_one_line(e)})"
    if not isinstance(loaded, dict) or "peft_type" not in loaded:
        return f"{ADAPTER_CONFIG_FILE} holds no \"peft_type\" (not a PEFT adapter config)"
    return None


def find_resume_checkpoint(ckpt_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest `step_<N>` dir in `ckpt_dir` that `check_checkpoint` passes (None if none does),
    and (path, reason) for each newer one that did not, newest first. Unlike `latest_checkpoint`, a
    step dir without trainer_state.json counts as damaged: atomic saves never leave one. Changes
    nothing on disk."""
    skipped: list[tuple[Path, str]] = []
    for path in reversed(_step_dirs(ckpt_dir)):
        reason = check_checkpoint(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def _set_aside(path: Path) -> Path:
    """Rename the checkpoint dir `path` to `damaged-<name>` (then -2, -3, ...) beside it: a name
    that pruning, stale-temp cleanup and later saves of the same step never touch."""
    n, dest = 1, path.with_name(f"{_DAMAGED_PREFIX}{path.name}")
    while dest.exists():
        n += 1
        dest = path.with_name(f"{_DAMAGED_PREFIX}{path.name}-{n}")
    os.rename(path, dest)
    return dest


def resume_checkpoint(ckpt_dir: Path, *, set_aside: bool = True) -> tuple[Path | None, list[str]]:
    """The checkpoint a resumed run loads: the newest in `ckpt_dir` that `check_checkpoint` passes,
    or None when `ckpt_dir` holds no `step_<N>` dir (start from step 0). Also returns one warning
    line per newer damaged checkpoint skipped. With `set_aside` (one process only: rank 0) each
    skipped one is renamed to `damaged-step_<N>`, so the resumed run neither prunes it nor
    overwrites it when it saves step N again; nothing is deleted.

    Raises CheckpointError, one line naming `ckpt_dir` and each checkpoint's reason, when step
    dirs exist but none loads; nothing is moved then.
    """
    found, skipped = find_resume_checkpoint(ckpt_dir)
    if found is None and skipped:
        reasons = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise CheckpointError(f"no checkpoint in {ckpt_dir} loads ({reasons}); repair one, or move them out of "
                              f"{ckpt_dir} to start again from step 0")
    lines = []
    for path, why in skipped:
        kept = f"moved to {_set_aside(path).name}" if set_aside else "left in place"
        lines.append(f"skipped damaged checkpoint {path}: {why}; {kept} (not deleted); resuming from {found.name}")
    return found, lines


# --- saving ----------------------------------------------------------------------------------

def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # works for dirs too, on POSIX
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_atomically(final: Path, write_files) -> Path:
    """Run `write_files(tmp_dir)`, then swap `tmp_dir` in as `final` (replacing any old one)."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f"{_TMP_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_files(tmp)
        _fsync(tmp)
        if final.exists():
            # rename() cannot replace a non-empty dir: move the old one aside first. A crash
            # between the two renames loses this step, and resume falls back to the one before.
            old = parent / f"{_TMP_PREFIX}{final.name}-{os.getpid()}-old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old)
        else:
            os.rename(tmp, final)
        _fsync(parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if _disk_full(e):
            previous = final if final.exists() else latest_checkpoint(parent)
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            raise TrainingError(f"no space left on device writing checkpoint {final}: {kept}; free space and run "
                                f"again with --resume") from None
        raise
    return final


def _disk_full(e: BaseException | None) -> bool:
    """Whether `e` (or an error it was raised from or while handling) says the disk or a quota is full:
    torch.save raises its own RuntimeError with the OSError as context, safetensors names the OS error."""
    for _ in range(8):
        if e is None:
            return False
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "os error 28" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_model_and_state(tmp: Path, model: torch.nn.Module | dict | AdapterWeights, state_json: str) -> None:
    for file in save_model_weights(model, tmp):
        _fsync(file)
    # The manifest lists every file written so far with its size: what check_checkpoint compares.
    sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    _write_text(tmp / MANIFEST_FILE, json.dumps({"files": sizes}, indent=2))
    # trainer_state.json goes last: its presence is what marks the checkpoint complete.
    _write_text(tmp / TRAINER_STATE_FILE, state_json)


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
    if ckpt_dir.is_dir():
        for stale in ckpt_dir.glob(f"{_TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)

    def write_files(tmp: Path) -> None:
        if optimizer is not None:  # an optimizer, or its gathered state dict (FSDP)
            _torch_save(optimizer if isinstance(optimizer, dict) else optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if scheduler is not None:
            _torch_save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        _torch_save(capture_rng_state(generators), tmp / RNG_FILE)
        for name, module in (modules or {}).items():
            save_weights_file(module, tmp / f"{name}.safetensors")
            _fsync(tmp / f"{name}.safetensors")
        _write_model_and_state(tmp, model, state_json)

    path = _write_atomically(ckpt_dir / f"step_{step}", write_files)
    if keep > 0:
        others = [p for p in list_checkpoints(ckpt_dir) if p != path]
        for old in others[: max(len(others) - (keep - 1), 0)]:
            shutil.rmtree(old)
    return path


def save_weights(path: Path, model: torch.nn.Module | dict | AdapterWeights, *, trainer_state: dict) -> Path:
    """Atomically write a weights-only checkpoint (e.g. `checkpoints/best/`): the model's weights (a
    LoRA policy's in PEFT's layout; or its gathered weights) + manifest.json + trainer_state.json."""
    path = Path(path)
    state_json = _to_json(trainer_state)
    return _write_atomically(path, lambda tmp: _write_model_and_state(tmp, model, state_json))


# --- loading ---------------------------------------------------------------------------------

def _require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise CheckpointError(f"{path} not found: cannot restore the {what} from this checkpoint "
                              f"(files present: {sorted(p.name for p in path.parent.iterdir())})")
    return path


def _torch_load(file: Path, map_location) -> Any:
    """torch.load(weights_only=True), any failure to read turned into one line naming the file."""
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated, empty or foreign file: each reader raises its own type
        raise CheckpointError(f"{file} does not load ({_one_line(e)})") from None


def _adapter_only(model: torch.nn.Module) -> bool:
    """A LoRA policy: only its adapter trains, so only the adapter is saved."""
    return has_lora_adapter(model)


def _sharded(model: torch.nn.Module) -> bool:
    """Sharded by FSDP (checked without importing FSDP, a second's work, when nothing has)."""
    if "lmrl.parallel.fsdp" not in sys.modules:
        return False
    from .parallel.fsdp import is_sharded

    return is_sharded(model)


def _sharded_optimizer(optimizer) -> bool:
    if "lmrl.parallel.fsdp" not in sys.modules:
        return False
    from .parallel.fsdp import is_sharded_optimizer

    return is_sharded_optimizer(optimizer)


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
        raise CheckpointError(f"{file} does not load ({_one_line(e)})") from None


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
            from .parallel.fsdp import load_full_state_dict

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
                from .parallel.fsdp import load_full_state_dict

                load_full_state_dict(model, state)
            else:
                model.load_state_dict(state, strict=False)
            return
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
        raise CheckpointError(f"{state_file} is not valid JSON ({_one_line(e)})") from None

    load_weights(model, _require(weights_file(path), "model"), map_location)
    for name, module in (modules or {}).items():
        load_weights(module, _require(path / f"{name}.safetensors", name), map_location)
    if optimizer is not None:
        saved = _torch_load(_require(path / OPTIMIZER_FILE, "optimizer"), map_location)
        if _sharded_optimizer(optimizer):
            from .parallel.fsdp import load_optimizer_state

            load_optimizer_state(optimizer, saved)  # each rank keeps its shard of Adam's moments
        else:
            optimizer.load_state_dict(saved)
    if scheduler is not None:
        scheduler.load_state_dict(_torch_load(_require(path / SCHEDULER_FILE, "scheduler"), map_location))
    if restore_rng:
        # RNG states are CPU byte tensors whatever the device: torch.set_rng_state insists.
        rng = _torch_load(_require(path / RNG_FILE, "RNG state"), "cpu")
        restore_rng_state(rng, generators)
    return trainer_state
