"""Names vulture cannot see used (`make deadcode`, tests/test_dead_code.py): each is called by name from
outside the code vulture reads (a library, a config string, a user), or fills a signature a protocol
fixes. Vulture reads this file; Python never runs it. A line marks its name used everywhere. Code that
only tests use does not belong here: remove it, or use it where it is meant to be used."""

# Module protocol: `lmrl.X`, `lmrl.tasks.X` and `lmrl.trl.X` loaded on first use.
__getattr__

# Public API with no caller inside the repo: lmrl's lazy exports (lmrl/__init__.py) and TRL-style names.
MultiplierRLConfig
ReinforceTrainer
RLOOTrainer
_.score_one  # MathReward: one completion scored
_.timeouts  # MathReward: rows whose check was stopped, for the user to read

# Run by hand: docs/from-verl-openrlhf.md's tables rewritten from the alias tables (tests/test_verl_aliases.py
# names the command when the two differ).
write_doc

# Named in a config or registry string, loaded by `importlib`.
NoScore  # lmrl/train/build.py: reward.cls of a rollout worker's task
DistinctCharacters  # scripts/gpu_check.py: reward.cls of the GPU check's GRPO stages
WeightSyncWorker  # vLLM's worker_extension_cls
_.lmrl_load_weights  # called through vLLM's collective_rpc

# Protocols other libraries call: torch's LR schedulers, transformers' Cache, PreTrainedModel and
# TrainerCallback, and the transformers.Trainer surface lmrl.trl's trainers keep.
_.get_last_lr
_.get_seq_length
_.batch_select_indices
_.batch_repeat_interleave
_.crop
_.is_quantized
_.on_train_begin
_.on_step_begin
_.num_processes
_.process_index
_.train_batch_size
_.is_world_process_zero
_.push_to_hub
_.best_global_step
_.best_model_checkpoint
_.wait_for_everyone
_.remove_callback
_.is_local_process_zero
_.save_metrics
_.save_state
_.create_model_card
_.get_train_dataloader
_.predict

# Parameters a signature must have: __exit__, signal handlers, sqlite3's authorizer, transformers.Trainer's.
exc
frame
signum
trigger
ignore_keys
ignore_keys_for_eval
test_dataset
start_time
blocking

# A declaration beside the code it describes: the fields the TRL translation reads, held to
# lmrl.trl.fields' table by tests/test_trl_fields.py.
TRANSLATED
