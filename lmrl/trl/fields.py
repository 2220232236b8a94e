"""What lmrl does with every field of TRL's `GRPOConfig`, `RLOOConfig`, `DPOConfig`, `SFTConfig` and
`RewardConfig` (and the `transformers.TrainingArguments` under them): one rule per field, the single
source of `docs/trl-fields.md` (`python -m lmrl.trl.fields > docs/trl-fields.md`; a test compares the
two and walks the installed TRL's fields for any the table does not cover).

- carried: the value reaches lmrl's run (`lmrl.trl.configs` translates it; `how` says into what);
- no effect: accepted, and named in one line of the run log when set away from its default;
- refused: accepted at its default (and at the values in `accepts`); any other value is refused,
  with `how` as the reason, when the config is made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

CARRIED, NO_EFFECT, REFUSED = "carried", "no effect", "refused"
KINDS = ("grpo", "rloo", "dpo", "sft", "reward")
NAMES = {"grpo": "GRPOConfig", "rloo": "RLOOConfig", "dpo": "DPOConfig", "sft": "SFTConfig",
         "reward": "RewardConfig"}  # each kind's TRL class


@dataclass(frozen=True)
class Rule:
    effect: str
    how: str
    accepts: tuple = ()  # refused: values besides the default that lmrl honours


def _rules(effect: str, names: str, how: str, accepts: tuple = ()) -> dict[str, Rule]:
    return {name: Rule(effect, how, accepts) for name in names.split()}


# -- transformers.TrainingArguments (every TRL config) ---------------------------------------------------
COMMON: dict[str, Rule] = {
    "output_dir": Rule(CARRIED, "run.dir (a new run never overwrites one: train(resume_from_checkpoint=) "
                                "continues it)"),
    "per_device_train_batch_size": Rule(CARRIED, "x gradient_accumulation_steps x processes: one optimizer "
                                                  "step's completions (GRPO, RLOO: train.rollout_size) or rows "
                                                  "(data.batch_size)"),
    "gradient_accumulation_steps": Rule(CARRIED, "train.ga_steps micro-batches per optimizer step"),
    "num_train_epochs": Rule(CARRIED, "the run's length when max_steps <= 0 (passes over the data)"),
    "max_steps": Rule(CARRIED, "train.steps (GRPO, RLOO) / train.max_steps (offline trainers)"),
    "learning_rate": Rule(CARRIED, "optim.lr"),
    "lr_scheduler_type": Rule(CARRIED, "schedule.name: linear, cosine, constant, constant_with_warmup (decaying "
                                       "to 0 as transformers' do), cosine_with_min_lr (cosine to "
                                       "schedule.min_lr_ratio), warmup_stable_decay (wsd); other schedules are "
                                       "refused"),
    "warmup_steps": Rule(CARRIED, "schedule.warmup_steps (a value below 1 is a fraction of the steps)"),
    "weight_decay": Rule(CARRIED, "optim.weight_decay"),
    "adam_beta1": Rule(CARRIED, "optim.betas[0]"),
    "adam_beta2": Rule(CARRIED, "optim.betas[1]"),
    "adam_epsilon": Rule(CARRIED, "optim.eps"),
    "max_grad_norm": Rule(CARRIED, "train.grad_clip"),
    "optim": Rule(CARRIED, "adamw_torch / adamw_torch_fused: lmrl's AdamW (fused where the device allows); "
                           "other optimizers are refused"),
    "bf16": Rule(CARRIED, "run.mixed_precision=bf16 (autocast over the model's weights); unset: on where the "
                          "hardware has bf16 (a GPU that supports it, or use_cpu=True), as in TRL"),
    "gradient_checkpointing": Rule(CARRIED, "model.gradient_checkpointing (TRL's default: on)"),
    "activation_checkpointing": Rule(CARRIED, "model.gradient_checkpointing (transformers' new name)"),
    "use_cpu": Rule(CARRIED, "run.device=cpu"),
    "seed": Rule(CARRIED, "run.seed"),
    "logging_steps": Rule(CARRIED, "train.log_every (a value below 1 is a fraction of the steps)"),
    "eval_strategy": Rule(CARRIED, "no: offline trainers evaluate only when evaluate() is called (train.evaluate="
                                   "false), GRPO and RLOO evaluate per_device_eval_batch_size held-out prompts "
                                   "at the run's start and end only; steps: every eval_steps; epoch: once per "
                                   "pass over the data"),
    "eval_steps": Rule(CARRIED, "train.eval_every with eval_strategy=steps (unset: logging_steps)"),
    "save_strategy": Rule(CARRIED, "steps: every save_steps and the last step; no: only the last step, lmrl's "
                                   "resume point (no on_save: transformers saves nothing); other values are refused"),
    "save_steps": Rule(CARRIED, "train.ckpt_every (a value below 1 is a fraction of the steps)"),
    "save_total_limit": Rule(CARRIED, "train.keep_checkpoints (unset: all)"),
    "report_to": Rule(CARRIED, "run.tensorboard / run.wandb (trackio, mlflow, ... are refused)"),
    "run_name": Rule(CARRIED, "run.name"),
    "disable_tqdm": Rule(CARRIED, "run.progress"),
    "per_device_eval_batch_size": Rule(CARRIED, "eval.batch_size"),
    "metric_for_best_model": Rule(CARRIED, "train.best_metric (eval_x is eval/x; with eval_dataset={name: ...}, "
                                           "eval_<name>_x names one set's)"),
    "greater_is_better": Rule(CARRIED, "checked against train.best_metric's direction (a loss is minimised, "
                                       "anything else maximised); the other direction is refused"),
    "resume_from_checkpoint": Rule(CARRIED, "what TRL's scripts pass to train(resume_from_checkpoint=): True "
                                            "continues output_dir's newest good checkpoint, a path that one"),
    "fsdp": Rule(CARRIED, "any sharding option: distributed.strategy=fsdp under torchrun"),
    "fp16": Rule(REFUSED, "lmrl's mixed precision is bf16 (bf16=True)"),
    "deepspeed": Rule(REFUSED, "lmrl shards with FSDP (fsdp=full_shard under torchrun), not DeepSpeed"),
    "label_smoothing_factor": Rule(REFUSED, "label smoothing is SFT's only (SFTConfig's: sft.label_smoothing)"),
    "neftune_noise_alpha": Rule(REFUSED, "NEFTune noise is SFT's only (SFTConfig's: sft.neftune_noise_alpha)"),
    "lr_scheduler_kwargs": Rule(CARRIED, "cosine_with_min_lr: min_lr_rate or min_lr -> schedule.min_lr_ratio; "
                                         "warmup_stable_decay: num_decay_steps -> schedule.decay_steps, decay_type "
                                         "-> schedule.decay_shape, min_lr_ratio; num_cycles only at 0.5, "
                                         "warmup_type only linear; other arguments are refused"),
    "optim_args": Rule(REFUSED, "lmrl's AdamW takes its settings from the adam_* fields"),
    "optim_target_modules": Rule(REFUSED, "only for GaLore-style optimizers, which lmrl does not have"),
    "auto_find_batch_size": Rule(REFUSED, "lmrl does not search for a batch size"),
    "use_liger_kernel": Rule(REFUSED, "no Liger kernels in lmrl"),
    "liger_kernel_config": Rule(REFUSED, "no Liger kernels in lmrl"),
    "load_best_model_at_end": Rule(NO_EFFECT, "lmrl always keeps checkpoints/best and exports the best model"),
}
COMMON.update(_rules(NO_EFFECT, """
    average_tokens_across_devices bf16_full_eval fp16_full_eval tf32 activation_checkpointing_kwargs
    gradient_checkpointing_kwargs torch_compile torch_compile_backend torch_compile_mode use_cache
    torch_empty_cache_steps logging_strategy logging_first_step log_on_each_node logging_nan_inf_filter
    include_num_input_tokens_seen log_level log_level_replica project trackio_space_id trackio_bucket_id
    trackio_static_space_id eval_delay prediction_loss_only eval_on_start eval_do_concat_batches
    eval_use_gather_object eval_accumulation_steps include_for_metrics batch_eval_metrics save_only_model
    save_on_each_node enable_jit_checkpoint push_to_hub hub_token hub_private_repo hub_model_id hub_strategy
    hub_always_push hub_revision ignore_data_skip restore_callback_states_from_checkpoint full_determinism
    data_seed accelerator_config parallelism_config dataloader_drop_last dataloader_num_workers
    dataloader_pin_memory dataloader_persistent_workers dataloader_prefetch_factor
    dataloader_multiprocessing_context dataloader_in_order remove_unused_columns label_names
    train_sampling_strategy length_column_name ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers
    ddp_static_graph ddp_backend ddp_timeout fsdp_config debug skip_memory_metrics do_train do_eval do_predict
    local_rank logging_dir overwrite_output_dir""",
    "logging, hub, data-loader, compilation and launcher settings: lmrl's own do the job (push_to_hub: call "
    "trainer.push_to_hub())"))

# -- what every TRL config adds --------------------------------------------------------------------------
_TRL_SHARED = {
    "model_init_kwargs": Rule(CARRIED, "dtype: model.dtype (bfloat16 -> bf16; float32/auto -> fp32); other keys "
                                       "have no effect"),
    "trust_remote_code": Rule(NO_EFFECT, "lmrl loads local transformers architectures"),
    "router_aux_loss_coef": Rule(NO_EFFECT, "mixture-of-experts auxiliary loss: not added"),
    "dataset_num_proc": Rule(NO_EFFECT, "lmrl tokenises in-process"),
    "pad_to_multiple_of": Rule(NO_EFFECT, "lmrl pads to the batch's longest row"),
    "pad_token": Rule(NO_EFFECT, "the tokenizer's pad token (else its eos) is used"),
    "eos_token": Rule(NO_EFFECT, "the tokenizer's eos token is used"),
    "activation_offloading": Rule(NO_EFFECT, "activations stay on the device"),
    "disable_dropout": Rule(CARRIED, "train.disable_dropout"),
    "max_length": Rule(CARRIED, "data.max_length (rows longer are truncated, counted in the log; None: no row is cut)"),
    "chat_template_path": Rule(REFUSED, "the tokenizer's own chat template is used (pass processing_class= "
                                        "with the template you want)"),
    "sync_ref_model": Rule(REFUSED, "the reference model stays the starting policy (TR-DPO's syncing is not "
                                    "in lmrl)"),
    "ref_model_mixup_alpha": Rule(NO_EFFECT, "only with sync_ref_model, which lmrl refuses"),
    "ref_model_sync_steps": Rule(NO_EFFECT, "only with sync_ref_model, which lmrl refuses"),
}

GRPO: dict[str, Rule] = {
    "num_generations": Rule(CARRIED, "algo.group_size"),
    "max_completion_length": Rule(CARRIED, "task.max_new_tokens"),
    "temperature": Rule(CARRIED, "train.temperature"),
    "top_p": Rule(CARRIED, "train.top_p"),
    "top_k": Rule(CARRIED, "train.top_k"),
    "beta": Rule(CARRIED, "algo.kl_coef (KL to the starting policy, k3 estimator, in the loss)"),
    "use_bias_correction_kl": Rule(CARRIED, "algo.kl_ratio_weighted (TRL's default True: with beta > 0 each token's "
                                            "KL in the loss is weighted by its importance ratio)"),
    "num_iterations": Rule(CARRIED, "algo.ppo_epochs (TRL's optimizer steps count each pass: max_steps and the "
                                    "other step counts become generations, lmrl's RL steps)"),
    "epsilon": Rule(CARRIED, "algo.clip_range_left (and right, unless epsilon_high)"),
    "epsilon_high": Rule(CARRIED, "algo.clip_range_right"),
    "scale_rewards": Rule(CARRIED, "algo.scale_rewards: group / batch / none (True: group, False: none)"),
    "loss_type": Rule(CARRIED, "algo.loss_level: grpo -> sequence, dapo -> token (over the accumulated batch), "
                               "bnpo -> token (the run log says where it differs from TRL's per-micro-batch "
                               "count: with gradient accumulation), dr_grpo -> constant; others are refused"),
    "mask_truncated_completions": Rule(CARRIED, "algo.mask_truncated_completions"),
    "reward_weights": Rule(CARRIED, "the weights of reward_funcs (lmrl's reward_weights=); an environment's "
                                     "get_reward keeps weight 1"),
    "entropy_coef": Rule(CARRIED, "algo.ent_coef"),
    "use_vllm": Rule(CARRIED, "rollout.engine=vllm"),
    "vllm_gpu_memory_utilization": Rule(CARRIED, "rollout.gpu_memory_utilization"),
    "vllm_max_model_length": Rule(CARRIED, "rollout.max_model_len"),
    "max_tool_calling_iterations": Rule(CARRIED, "env.max_turns (the tool calls plus the answering turn)"),
    "chat_template_kwargs": Rule(CARRIED, "model.chat_template_kwargs: passed to the chat template wherever a prompt, "
                                          "an episode's turns or a reward model's text is rendered"),
    "importance_sampling_level": Rule(CARRIED, "algo.ratio_level: token, sequence (GSPO: one ratio per completion; "
                                               "the clip_ratio/* metrics then count completions, as TRL's), "
                                               "sequence_token (GSPO-token, as trl.experimental.gspo_token computes "
                                               "it; TRL 1.16's own GRPOTrainer refuses it)"),
    "multi_objective_aggregation": Rule(REFUSED, "rewards are summed, then normalised"),
    "generation_batch_size": Rule(CARRIED, "train.rollout_size (as steps_per_generation)"),
    "steps_per_generation": Rule(CARRIED, "train.rollout_size = the completions of steps_per_generation / "
                                          "gradient_accumulation_steps optimizer steps, each an algo.minibatch_size "
                                          "share of it (a multiple of gradient_accumulation_steps)"),
    "min_p": Rule(CARRIED, "train.min_p (None: 0, off)"),
    "repetition_penalty": Rule(CARRIED, "train.repetition_penalty"),
    "generation_kwargs": Rule(CARRIED, "over the fields, as TRL: temperature, top_k, top_p, min_p, "
                                       "repetition_penalty -> train.*; max_new_tokens (transformers) or max_tokens "
                                       "(vLLM) -> task.max_new_tokens; any other key is refused"),
    "delta": Rule(CARRIED, "algo.clip_ratio_max (INTELLECT-2's cap on the unclipped ratio); a delta not above "
                           "1 + epsilon_high is refused"),
    "top_entropy_quantile": Rule(CARRIED, "algo.top_entropy_quantile: the entropy threshold over a micro-batch's "
                                          "valid tokens, as TRL's in one process (under torchrun each process takes "
                                          "its own; TRL's is over every process's tokens)"),
    "off_policy_mask_threshold": Rule(CARRIED, "algo.off_policy_mask_threshold: the drift is measured against the "
                                               "old log-probs (the learner's own: lmrl has no vLLM sampling "
                                               "log-probs to use instead)"),
    "cast_lm_head_to_fp32": Rule(REFUSED, "the head runs in the model's dtype"),
    "use_adaptive_entropy": Rule(REFUSED, "a fixed entropy_coef only"),
    "use_transformers_paged": Rule(REFUSED, "lmrl samples with its own loop (or vLLM)"),
    "use_transformers_continuous_batching": Rule(REFUSED, "lmrl samples with its own loop (or vLLM)"),
    "num_generations_eval": Rule(NO_EFFECT, "evaluation decodes one greedy completion per prompt"),
    "shuffle_dataset": Rule(CARRIED, "train.prompt_order: shuffled (every prompt once per epoch, in a seeded order "
                                     "drawn per epoch; an epoch's last partial batch is not dropped) or in_order"),
    "ds3_gather_for_generation": Rule(NO_EFFECT, "DeepSpeed only"),
    "cache_implementation": Rule(NO_EFFECT, "lmrl's sampling loop keeps its own KV cache"),
    "log_completions": Rule(CARRIED, "train.log_completions: each logged step's completions, with their rewards, "
                                     "advantages and log_extra columns, to completions.jsonl in output_dir and to "
                                     "wandb as the table 'completions'"),
    "num_completions_to_print": Rule(CARRIED, "train.completions_to_print, with log_completions (None: all of "
                                              "each logged step's)"),
}
GRPO.update(_rules(NO_EFFECT, """
    vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url
    vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port vllm_tensor_parallel_size
    vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max
    vllm_importance_sampling_clip_min vllm_importance_sampling_cap""",
    "vLLM runs colocated in lmrl, its log-probs recomputed by the policy (no importance-sampling correction)"))
GRPO.update(_rules(NO_EFFECT, """sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg
    vespo_lambda_neg entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target""",
    "only with a loss type or adaptive entropy that lmrl refuses"))
GRPO.update(_rules(NO_EFFECT, """log_multimodal log_unique_prompts log_completions_hub_repo
    transformers_continuous_batching_config""", "logging and sampling-backend settings lmrl does not use"))

DPO: dict[str, Rule] = {
    "beta": Rule(CARRIED, "dpo.beta"),
    "loss_type": Rule(CARRIED, "dpo.loss_type: one of sigmoid, ipo, hinge, robust (a list of several is refused)"),
    "loss_weights": Rule(REFUSED, "one loss type, weight 1", accepts=([1.0], [1])),
    "label_smoothing": Rule(CARRIED, "dpo.label_smoothing with loss_type=robust; with sigmoid, ipo and hinge it "
                                      "changes nothing, as in TRL (the run log says so)"),
    "truncation_mode": Rule(REFUSED, "an over-long pair loses its prompt's oldest tokens first, then its "
                                     "response's end (keep_start cuts the whole sequence's end); keep_end, "
                                     "deprecated in TRL, is refused"),
    "precompute_ref_log_probs": Rule(NO_EFFECT, "the reference's log-probs are computed with each batch"),
    "precompute_ref_batch_size": Rule(NO_EFFECT, "the reference's log-probs are computed with each batch"),
    "padding_free": Rule(NO_EFFECT, "rows are padded to the batch's longest"),
    "use_weighting": Rule(REFUSED, "no WPO weighting"),
    "ld_alpha": Rule(REFUSED, "no LD-DPO length desensitisation"),
    "f_divergence_type": Rule(REFUSED, "the reverse KL of DPO only"),
    "f_alpha_divergence_coef": Rule(NO_EFFECT, "only with an f_divergence_type lmrl refuses"),
    "discopop_tau": Rule(NO_EFFECT, "only with the discopop loss, which lmrl refuses"),
}

SFT: dict[str, Rule] = {
    "dataset_text_field": Rule(CARRIED, "data.text_field: the column a language-modelling row's text is read from"),
    "dataset_kwargs": Rule(NO_EFFECT, "rows are read by their columns"),
    "truncation_mode": Rule(CARRIED, "data.truncation_mode: keep_end keeps every row's last max_length tokens, as "
                                     "TRL; keep_start keeps a conversation's or text's start, but a prompt/completion "
                                     "row loses its prompt's start first (TRL cuts its end, and drops a row left "
                                     "with no completion token: lmrl drops no row)"),
    "shuffle_dataset": Rule(NO_EFFECT, "rows are always shuffled (seeded); packing packs them in data order"),
    "packing": Rule(CARRIED, "data.packing: rows packed into sequences of max_length (required), positions "
                             "restarting at each row, as TRL packs them (tests compare with pack_dataset; bfd cuts "
                             "an over-long row as truncation_mode says)"),
    "packing_strategy": Rule(CARRIED, "data.packing_strategy: bfd, bfd_split or wrapped"),
    "padding_free": Rule(CARRIED, "data.padding_free: a micro-batch as one row of its rows' tokens (packed rows "
                                  "are laid out one per batch row under sdpa and eager attention, where that is "
                                  "cheaper and gives the same numbers, and as one row otherwise)"),
    "eval_packing": Rule(NO_EFFECT, "held-out rows are packed as the training rows are (data.packing)"),
    "completion_only_loss": Rule(CARRIED, "sft.completion_only_loss (None: True; False also trains the prompt)"),
    "assistant_only_loss": Rule(CARRIED, "sft.assistant_only_loss: False (TRL's default) trains every token of a "
                                         "conversation, True its assistant turns and their end-of-turn tokens"),
    "loss_type": Rule(CARRIED, "sft.loss_type: nll or dft"),
    "neftune_noise_alpha": Rule(CARRIED, "sft.neftune_noise_alpha (None: 0, off)"),
    "label_smoothing_factor": Rule(CARRIED, "sft.label_smoothing with loss_type=nll; with dft it changes nothing, as "
                                            "in TRL (the run log says so)"),
}

# RLOOConfig: GRPOConfig's fields it has mean what they mean there, but for these
RLOO: dict[str, Rule] = {
    "beta": Rule(CARRIED, "algo.kl_coef with algo.kl_in_reward=true and algo.kl_estimator=k1: beta times the k1 KL "
                          "to the starting policy, summed over the completion, comes off its reward before the "
                          "leave-one-out baselines (TRL's default 0.05)"),
    "normalize_advantages": Rule(CARRIED, "algo.normalize_advantages: the advantages whitened over the whole batch, "
                                          "with the population std + 1e-8 (TRL: the sample std + 1e-4, a factor "
                                          "sqrt((B - 1) / B) apart; the run log says so)"),
    "reward_clip_range": Rule(CARRIED, "reward.clip: each completion's weighted reward clamped to [low, high] before "
                                       "the KL comes off it; the logged rewards stay unclamped (TRL's command line "
                                       "cannot give it: use a --config YAML file)"),
}

REWARD: dict[str, Rule] = {
    "center_rewards_coefficient": Rule(REFUSED, "no reward-centring term in the loss"),
}

TABLES = {"grpo": {**COMMON, **_TRL_SHARED, **GRPO}, "rloo": {**COMMON, **_TRL_SHARED, **GRPO, **RLOO},
          "dpo": {**COMMON, **_TRL_SHARED, **DPO},
          "sft": {**COMMON, **_TRL_SHARED, **SFT}, "reward": {**COMMON, **_TRL_SHARED, **REWARD}}


def rules(kind: str) -> dict[str, Rule]:
    """Every rule of one config kind (grpo, rloo, dpo, sft, reward), by field name."""
    return TABLES[kind]


def trl_fields(kind: str) -> list[dataclasses.Field]:
    """The fields of the installed TRL's config class for `kind`."""
    import trl

    cls = getattr(trl, NAMES[kind])
    return [f for f in dataclasses.fields(cls) if f.init]


def counts(kind: str) -> dict[str, int]:
    """How many of the installed TRL's fields of `kind` are carried / have no effect / are refused."""
    table = rules(kind)
    out = {CARRIED: 0, NO_EFFECT: 0, REFUSED: 0}
    for f in trl_fields(kind):
        out[table[f.name].effect] += 1
    return out


def markdown() -> str:
    """docs/trl-fields.md: every field of the installed TRL's five configs and what lmrl does with it."""
    import trl

    lines = ["# TRL's config fields in lmrl", "",
             f"Generated from `lmrl/trl/fields.py` for trl {trl.__version__} by `python -m lmrl.trl.fields > "
             f"docs/trl-fields.md` (tests/test_trl_fields.py keeps the two equal).", "",
             "- **carried**: the value reaches lmrl's run;",
             "- **no effect**: accepted, named in one line of the run log when set away from its default;",
             "- **refused**: accepted at its default; any other value is refused with the reason given.", ""]
    for kind in KINDS:
        table, name = rules(kind), NAMES[kind]
        c = counts(kind)
        lines += [f"## {name}", "", f"{sum(c.values())} fields: {c[CARRIED]} carried, {c[NO_EFFECT]} no effect, "
                  f"{c[REFUSED]} refused.", "", "| field | lmrl | what lmrl does |", "|---|---|---|"]
        for f in trl_fields(kind):
            rule = table[f.name]
            lines.append(f"| `{f.name}` | {rule.effect} | {rule.how.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
