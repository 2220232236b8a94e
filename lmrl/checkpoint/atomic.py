"""Writing a checkpoint so that a killed run leaves either the old one or the new one, never half of
one: every file is fsynced as it is written, the whole dir is written as `.tmp-<name>-<pid>/` beside
its final name and then renamed into place (an old one it replaces is first renamed aside to
`.tmp-<name>-<pid>-old/`, which the next start puts back if the kill came between the two renames:
`directory.restore_swapped_out`). A full disk (ENOSPC or a quota, inside torch's or
safetensors' writer) removes the temporary dir and raises `TrainingError` in one line naming the
checkpoint and the previous one, intact."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ..common.errors import TrainingError
from .directory import latest_checkpoint
from .layout import TMP_PREFIX


def fsync(path: Path) -> None:
    """Flush the file or dir `path` to disk."""
    fd = os.open(path, os.O_RDONLY)  # works for dirs too, on POSIX
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_save(obj: Any, path: Path) -> None:
    """torch.save `obj` to `path`, fsynced."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path`, fsynced."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_atomically(final: Path, write_files: Callable[[Path], None]) -> Path:
    """Run `write_files(tmp_dir)`, then swap `tmp_dir` in as `final` (replacing any old one)."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_files(tmp)
        fsync(tmp)
        if final.exists():
            # rename() cannot replace a non-empty dir: move the old one aside first. After a crash
            # between the two renames the next start puts the old one back (`restore_swapped_out`).
            old = parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}-old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old)
        else:
            os.rename(tmp, final)
        fsync(parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(e):
            previous = final if final.exists() else latest_checkpoint(parent)
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            raise TrainingError(f"no space left on device writing checkpoint {final}: {kept}; free space and run "
                                f"again with --resume") from None
        raise
    return final


def disk_full(e: BaseException | None) -> bool:
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
