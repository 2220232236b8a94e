"""Atomic, resumable checkpoints: weights, optimizer, scheduler, RNG and trainer state.

Layout of one checkpoint, `<run_dir>/checkpoints/step_<N>/`:

    model.safetensors    model.state_dict(), tied tensors stored once (safetensors save_model)
    adapter_model.safetensors, adapter_config.json
                         in place of model.safetensors for a policy or reward model with a LoRA
                         adapter: its adapter only (a reward model's with its score head), in PEFT's
                         own layout (the names and config PeftModel's save_pretrained writes), so
                         `PeftModel.from_pretrained(base, step_dir)` loads it; the frozen base is
                         the model.path it was loaded from. Checkpoints saved before this layout
                         hold a policy's adapter (a reward model's whole model) in
                         model.safetensors; they still load
    <name>.safetensors   further modules the trainer needs back (PPO's `value`, the KL `reference`,
                         the weight average `ema` of `train.ema_decay`)
    optimizer.pt         optimizer.state_dict()            (only if an optimizer was given)
    scheduler.pt         scheduler.state_dict()            (only if a scheduler was given)
    rng.pt               python / numpy / torch / CUDA / named-generator RNG states
    manifest.json        the name and size in bytes of every file above, so a missing or cut-short
                         file is found without guessing which files this checkpoint should hold
    trainer_state.json   whatever the trainer needs to resume; written last, so its presence
                         marks a complete checkpoint

One module per part: `layout` (the names), `formats` (what each file holds, written and read),
`atomic` (every save goes into `.tmp-<name>-<pid>/`, is fsynced, then renamed into place; a full disk
is one line), `directory` (listing, the latest checkpoint, checking a checkpoint's files, the resume
fallback past damaged ones, pruning) and `store` (a whole checkpoint saved and loaded). This module
re-exports their public names.

One process (rank 0) writes to a checkpoints dir at a time (the run dir's lock, train/run_dir.py, sees to it).
"""

from .atomic import write_atomically
from .directory import (check_checkpoint, find_resume_checkpoint, holds_optimizer, is_latest, latest_checkpoint,
                        list_checkpoints, named_resume_checkpoint, prune, remove_stale_temps, restore_swapped_out,
                        resume_checkpoint)
from .formats import (AdapterWeights, adapter_weights, capture_rng_state, gathered_weights, load_initial_weights,
                      load_optimizer_state, load_weights, restore_rng_state, save_model_weights, save_weights_file,
                      weights_file, weights_to_save, whole_training_state, whole_weights)
from .layout import (ADAPTER_CONFIG_FILE, ADAPTER_FILE, BEST_DIR, MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE, RNG_FILE,
                     SCHEDULER_FILE, TRAINER_STATE_FILE, CheckpointError, step_dir, step_of)
from .store import load_checkpoint, save_checkpoint, save_weights

__all__ = [
    "ADAPTER_CONFIG_FILE", "ADAPTER_FILE", "BEST_DIR", "MANIFEST_FILE", "MODEL_FILE", "OPTIMIZER_FILE", "RNG_FILE",
    "SCHEDULER_FILE", "TRAINER_STATE_FILE", "AdapterWeights", "CheckpointError", "adapter_weights",
    "capture_rng_state", "check_checkpoint", "find_resume_checkpoint", "gathered_weights", "holds_optimizer",
    "is_latest", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "load_initial_weights",
    "named_resume_checkpoint",
    "load_optimizer_state", "load_weights", "prune", "remove_stale_temps", "restore_rng_state", "restore_swapped_out",
    "resume_checkpoint",
    "save_checkpoint", "save_model_weights", "save_weights", "save_weights_file", "step_dir", "step_of",
    "weights_file", "weights_to_save", "whole_training_state", "whole_weights", "write_atomically",
]
