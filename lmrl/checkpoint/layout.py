"""What a checkpoints dir holds, by name: the files of one checkpoint, the names of its dirs
(`step_<N>`, `best`, `.tmp-*` of a save under way, `damaged-*` set aside), and `CheckpointError`."""

from __future__ import annotations

import re
from pathlib import Path

MODEL_FILE = "model.safetensors"
# PEFT's file names (peft.utils.SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME): a LoRA policy's checkpoint
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.pt"
TRAINER_STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
BEST_DIR = "best"  # the weights-only checkpoint of the best evaluation, beside the step dirs

STEP_DIR = re.compile(r"step_(\d+)")
TMP_PREFIX = ".tmp-"
SWAPPED_OUT = re.compile(r"\.tmp-(.+)-\d+-old")  # a checkpoint moved aside while its replacement is renamed in
DAMAGED_PREFIX = "damaged-"


class CheckpointError(RuntimeError):
    """A checkpoint on disk is damaged, or does not match what it is being loaded into."""


def step_dir(ckpt_dir: Path, step: int) -> Path:
    """The dir of the checkpoint after global step `step` in `ckpt_dir`."""
    return Path(ckpt_dir) / f"step_{step}"


def step_of(path: Path) -> int | None:
    """N for a dir named `step_<N>`, else None."""
    m = STEP_DIR.fullmatch(path.name)
    return int(m.group(1)) if m else None


def one_line(e: BaseException) -> str:
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
