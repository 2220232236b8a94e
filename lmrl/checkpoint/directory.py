"""A checkpoints dir as a whole: listing its `step_<N>` dirs, the latest one, checking a checkpoint,
resuming past damaged ones, pruning old checkpoints and cleaning up after killed saves (a checkpoint
swapped out put back, temporary dirs removed).

A file can still be damaged after its save (a full disk, a copy cut short, a hand edit).
`check_checkpoint` reads every file of a checkpoint without touching a model and says which one
does not load; `resume_checkpoint` picks the newest checkpoint that loads, moves each newer damaged
one aside to `damaged-step_<N>` (kept, never deleted or overwritten) and says why it was skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from .layout import (ADAPTER_CONFIG_FILE, ADAPTER_FILE, DAMAGED_PREFIX, MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE,
                     RNG_FILE, SWAPPED_OUT, TMP_PREFIX, TRAINER_STATE_FILE, CheckpointError, one_line, step_dir,
                     step_of)


# --- listing ---------------------------------------------------------------------------------

def _step_dirs(ckpt_dir: Path) -> list[Path]:
    """Every `step_<N>` dir in `ckpt_dir`, complete or not, sorted by N (numerically, not by name)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted((p for p in ckpt_dir.iterdir() if p.is_dir() and step_of(p) is not None), key=step_of)


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete `step_<N>` dirs in `ckpt_dir` (holding trainer_state.json), sorted by N. Their files
    are not read: `find_resume_checkpoint` checks that they load."""
    return [p for p in _step_dirs(ckpt_dir) if (p / TRAINER_STATE_FILE).is_file()]


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The complete `step_<N>` dir with the highest N, or None if there is none."""
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def is_latest(ckpt_dir: Path, step: int) -> bool:
    """Whether the newest complete checkpoint in `ckpt_dir` is the one of step `step`."""
    latest = latest_checkpoint(ckpt_dir)
    return latest is not None and latest.name == step_dir(ckpt_dir, step).name


def holds_optimizer(path: Path) -> bool:
    """Whether the checkpoint dir `path` holds an optimizer's state: a checkpoint saved within a
    stage does, one saved between stages (or a weights-only one) does not."""
    return (Path(path) / OPTIMIZER_FILE).exists()


# --- checking --------------------------------------------------------------------------------

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
        return f"cannot be read ({one_line(e)})"


def _check(path: Path) -> str | None:
    if not path.is_dir():
        return "is not a directory"
    state_file = path / TRAINER_STATE_FILE
    if not state_file.is_file():
        return f"{TRAINER_STATE_FILE} is missing (a save that did not finish, or a removed file)"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"{TRAINER_STATE_FILE} is not valid JSON ({one_line(e)})"
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        return f"{TRAINER_STATE_FILE} holds no integer \"step\""
    if step_of(path) is not None and step != step_of(path):
        return f"{TRAINER_STATE_FILE} says step {step}, the dir is {path.name}"

    manifest_file = path / MANIFEST_FILE
    if manifest_file.exists():
        try:
            listed = json.loads(manifest_file.read_text(encoding="utf-8"))["files"]
            listed = {str(name): int(size) for name, size in listed.items()}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{MANIFEST_FILE} is not valid ({one_line(e)})"
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
            return f"{file.name} does not load ({one_line(e)})"
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
        return f"{ADAPTER_CONFIG_FILE} is not valid JSON ({one_line(e)})"
    if not isinstance(loaded, dict) or "peft_type" not in loaded:
        return f"{ADAPTER_CONFIG_FILE} holds no \"peft_type\" (not a PEFT adapter config)"
    return None


# --- resuming past damaged checkpoints -------------------------------------------------------

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
    n, dest = 1, path.with_name(f"{DAMAGED_PREFIX}{path.name}")
    while dest.exists():
        n += 1
        dest = path.with_name(f"{DAMAGED_PREFIX}{path.name}-{n}")
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


def named_resume_checkpoint(path: Path) -> Path:
    """`path` when it is a checkpoint a run can resume from (`run.resume_from`, `--resume_from_checkpoint`):
    one that `check_checkpoint` passes and that holds a run's state (RNG, trainer state), not a
    weights-only one such as `best/`. Otherwise CheckpointError in one line; there is no fallback,
    since the user named this one."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"cannot resume from {path}: no such checkpoint dir")
    reason = check_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"cannot resume from {path}: {reason}")
    if not (path / RNG_FILE).is_file():
        step_dirs = list_checkpoints(path.parent)
        example = f" such as {step_dirs[-1]}" if step_dirs else ""
        raise CheckpointError(f"{path} is a weights-only checkpoint (the best evaluation's weights, without the "
                              f"optimizer, RNG and trainer state a run resumes from): resume from a step_N "
                              f"checkpoint{example}, or start a new run from these weights with "
                              f"model.init_from={path}")
    return path


# --- housekeeping ----------------------------------------------------------------------------

def restore_swapped_out(ckpt_dir: Path) -> list[Path]:
    """Put back each checkpoint that a save replacing it was killed in the middle of swapping out:
    `write_atomically` renames `X` to `.tmp-X-<pid>-old` before renaming the new `X` in, so an old
    copy whose `X` is missing is the last complete `X` (the newest such copy, if several). Returns
    the dirs restored."""
    restored = []
    if not Path(ckpt_dir).is_dir():
        return restored
    olds = sorted(Path(ckpt_dir).glob(f"{TMP_PREFIX}*-old"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in olds:
        m = SWAPPED_OUT.fullmatch(old.name)
        if m and old.is_dir() and not (old.parent / m.group(1)).exists():
            os.rename(old, old.parent / m.group(1))
            restored.append(old.parent / m.group(1))
    return restored


def remove_stale_temps(ckpt_dir: Path) -> list[Path]:
    """Remove the `.tmp-*` dirs that killed saves left in `ckpt_dir`, after putting back any checkpoint
    a killed save had swapped out (`restore_swapped_out`, whose result it returns)."""
    restored = restore_swapped_out(ckpt_dir)
    if ckpt_dir.is_dir():
        for stale in ckpt_dir.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
    return restored


def prune(ckpt_dir: Path, keep: int, newest: Path) -> None:
    """Keep the `keep` newest complete checkpoints of `ckpt_dir` (keep<=0: keep all), `newest` (the
    one just written) always among them, even if higher steps exist; the other `keep - 1` slots go
    to the highest steps. `best/` and anything not named `step_<N>` is never touched."""
    if keep > 0:
        others = [p for p in list_checkpoints(ckpt_dir) if p != newest]
        for old in others[: max(len(others) - (keep - 1), 0)]:
            shutil.rmtree(old)
