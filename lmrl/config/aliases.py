"""Other tools' names for lmrl's keys: TRL's (GRPOConfig, DPOConfig, TrainingArguments), verl's (its
Hydra paths, `actor_rollout_ref.rollout.n`) and OpenRLHF's (its flags, `n_samples_per_prompt`).

A name whose meaning and unit are lmrl's sets that key (`translate`), with its value mapped where the
two spell it differently, and leaves one line on `cfg.aliases` saying what it set; a name lmrl does
not take as it is (another unit, another formula, no such feature) is refused in one line saying what
to write instead. docs/from-verl-openrlhf.md holds the verl and OpenRLHF tables as `write_doc` writes
them (tests/test_verl_aliases.py keeps the two equal).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from .schema import Config, ConfigError, suggest


@dataclasses.dataclass(frozen=True)
class Alias:
    """A name of another tool's config and the lmrl key it sets."""
    key: str | None               # the lmrl key it sets (None: no single key; `note` says what to set)
    source: str                   # the TRL class it comes from, or verl, or OpenRLHF
    values: dict | None = None    # its value -> lmrl's, or -> {key: value, ...} for several keys (the only values
                                  # taken, unless `others`)
    others: bool = False          # values not in `values` are carried as they are
    refused: dict | None = None   # its values lmrl does not take -> what to write instead
    matches: tuple = ()           # its values that ask for what lmrl does anyway: nothing is set
    also: str | None = None       # a second key set to the same value...
    implies: dict | None = None   # ...or to these values: keys that, like `also`, give way to the same file or
                                  # command line setting them otherwise
    pair: bool = False            # the value is [key's, also's]
    bare: bool = True             # TRL: False where the bare name means a different key in another TRL config
    head: str = ""                # OpenRLHF: the flag's dotted name in OpenRLHF's newer releases
    offline: str | None = None    # the key it sets instead in an offline trainer's run (run.trainer sft, dpo, reward):
                                  # verl and OpenRLHF name the prompt's column alike for RL and for SFT
    note: str = ""                # key None: why and what to write ({value} stands for the value given);
                                  # otherwise a remark said with the translation and in the docs
    caveat: str = ""              # where lmrl differs once translated, said with the translation
    missing: bool = False         # lmrl has no such feature (the docs' status)

    @property
    def owner(self) -> str:
        return "TRL" if self.source in _TRL_SECTIONS else self.source


# -- TRL -----------------------------------------------------------------------------------------
# TRL's names, each with the lmrl key it sets. A name is written bare (`num_generations: 8`, as in
# TRL), under the section of the key it sets (`task.max_completion_length`), or under the section that
# stands for its TRL config: algo for GRPOConfig, dpo for DPOConfig, either for TrainingArguments
# (`algo.learning_rate`). A spelling that is itself an lmrl key (`train.top_p`, `dpo.beta`) is that key.
TRL_ALIASES: dict[str, Alias] = {
    "num_generations": Alias("algo.group_size", "GRPOConfig"),
    "beta": Alias("algo.kl_coef", "GRPOConfig", bare=False, note="DPOConfig's beta is dpo.beta"),
    # epsilon sets both clip ranges, as TRL's epsilon_high defaults to epsilon, unless the same file or
    # command line sets the upper one (by either name)
    "epsilon": Alias("algo.clip_range_left", "GRPOConfig", also="algo.clip_range_right"),
    "epsilon_high": Alias("algo.clip_range_right", "GRPOConfig"),
    # TRL's normalisers: grpo divides each sequence by its length, then averages; bnpo and dapo divide
    # by the batch's token count (bnpo the local batch's, dapo the accumulated one's); dr_grpo by a
    # constant (max_completion_length; algo.loss_constant=0 means the completion budget)
    "loss_type": Alias("algo.loss_level", "GRPOConfig", bare=False, note="DPOConfig's loss_type is dpo.loss_type",
                       values={"grpo": "sequence", "bnpo": "token", "dr_grpo": "constant", "dapo": "token"}),
    "max_completion_length": Alias("task.max_new_tokens", "GRPOConfig"),
    "max_prompt_length": Alias("task.max_prompt_length", "GRPOConfig"),  # older GRPOConfigs: prompts cut from the left
    "num_iterations": Alias("algo.ppo_epochs", "GRPOConfig"),
    "scale_rewards": Alias("algo.scale_rewards", "GRPOConfig",
                           values={"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"}),
    "mask_truncated_completions": Alias("algo.mask_truncated_completions", "GRPOConfig"),
    "importance_sampling_level": Alias("algo.ratio_level", "GRPOConfig", values={
        "token": "token", "sequence": "sequence", "sequence_token": "sequence_token"}),
    "delta": Alias("algo.clip_ratio_max", "GRPOConfig"),
    "top_entropy_quantile": Alias("algo.top_entropy_quantile", "GRPOConfig"),
    "off_policy_mask_threshold": Alias("algo.off_policy_mask_threshold", "GRPOConfig"),
    "use_bias_correction_kl": Alias("algo.kl_ratio_weighted", "GRPOConfig"),
    "reward_weights": Alias("reward.weights", "GRPOConfig"),
    "disable_dropout": Alias("train.disable_dropout", "GRPOConfig"),
    "log_completions": Alias("train.log_completions", "GRPOConfig"),
    "num_completions_to_print": Alias("train.completions_to_print", "GRPOConfig"),
    "temperature": Alias("train.temperature", "GRPOConfig"),
    "top_p": Alias("train.top_p", "GRPOConfig"),
    "top_k": Alias("train.top_k", "GRPOConfig"),
    "min_p": Alias("train.min_p", "GRPOConfig", values={None: 0.0}, others=True),  # TRL's None: off
    "repetition_penalty": Alias("train.repetition_penalty", "GRPOConfig"),
    "chat_template_kwargs": Alias("model.chat_template_kwargs", "GRPOConfig"),
    "max_length": Alias("data.max_length", "DPOConfig"),
    "learning_rate": Alias("optim.lr", "TrainingArguments"),
    "weight_decay": Alias("optim.weight_decay", "TrainingArguments"),
    "adam_epsilon": Alias("optim.eps", "TrainingArguments"),
    "max_grad_norm": Alias("train.grad_clip", "TrainingArguments"),
    "warmup_steps": Alias("schedule.warmup_steps", "TrainingArguments"),
    "gradient_accumulation_steps": Alias("train.ga_steps", "TrainingArguments"),
    "num_train_epochs": Alias("data.epochs", "TrainingArguments"),
    "seed": Alias("run.seed", "TrainingArguments"),
    "output_dir": Alias("run.dir", "TrainingArguments"),
    "logging_steps": Alias("train.log_every", "TrainingArguments"),
    "eval_steps": Alias("train.eval_every", "TrainingArguments"),
    "save_steps": Alias("train.ckpt_every", "TrainingArguments"),
    "save_total_limit": Alias("train.keep_checkpoints", "TrainingArguments"),
    "per_device_train_batch_size": Alias(None, "TrainingArguments", note=(
        "lmrl sizes a whole update: an RL step samples train.rollout_size completions (TRL's "
        "per_device_train_batch_size x gradient_accumulation_steps x processes), in train.ga_steps micro-batches; "
        "an offline trainer takes data.batch_size rows per optimizer step")),
}
_TRL_SECTIONS = {"GRPOConfig": ("algo",), "DPOConfig": ("dpo",), "TrainingArguments": ("algo", "dpo")}


# -- verl and OpenRLHF: what their names share -----------------------------------------------------
_ROLLOUT_SIZE = ("counts prompts per step, lmrl's train.rollout_size completions: set train.rollout_size = {value} x "
                 "algo.group_size")
_GA_STEPS = ("is a micro-batch's size, lmrl's train.ga_steps a count of micro-batches: set train.ga_steps = "
             "minibatch / ({value} x processes), the minibatch being algo.minibatch_size (0: train.rollout_size)")
_KL_SUM = ("is a per-token mean of the KL; lmrl's algo.kl_target is a per-completion sum (the KL summed over a "
           "completion's tokens): set algo.kl_target = {value} x the mean completion length in tokens")
_WARMUP_RATIO = "is a fraction of the run; lmrl counts warm-up steps: set schedule.warmup_steps = {value} x train.steps"
_GAE = {"algo.name": "ppo", "algo.value_model": "separate", "algo.normalize_advantages": True}
_VERL_GRPO = {"algo.name": "grpo", "algo.adv_eps": 1e-6}
_STRAIGHT_THROUGH = ("is a straight-through estimate (its value, k2's gradient), which lmrl does not have: "
                     "algo.kl_estimator=k2 has k2's value and gradient")
_VERL_K3 = {"algo.kl_estimator": "k3", "algo.kl_clamp": 10.0}  # verl bounds its k3 (low_var_kl) to [-10, 10]
_KL_NAMES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": _VERL_K3, "k3": _VERL_K3}
_OVERLONG = ("is DAPO's overlong penalty, which lmrl has as a reward function: bind "
             "lmrl.tasks.rewards.overlong_penalty(max_completion_length, buffer_len, penalty_factor) in a module of "
             "your own and list it in reward.funcs beside the answer's reward")
_VERL_KL = dict(values=_KL_NAMES, refused={
    "abs": "is |log ratio|, which lmrl does not estimate: algo.kl_estimator is k1, k2 or k3",
    **{f"{name}+": _STRAIGHT_THROUGH for name in ("kl", "k1", "low_var_kl", "k3")}},
    note="low_var_kl and k3 are lmrl's k3 bounded to [-10, 10] (algo.kl_clamp=10), as verl's")
_CRITIC_CLIP = ("is the critic's own clip; lmrl clips the critic's gradients on their own to the policy's "
                "train.grad_clip")
_CRITIC_MODEL = ("names the critic's own model; lmrl's algo.value_model=separate starts the critic as a copy of the "
                 "policy, or of reward.model where one is set")
_EPOCHS = ("counts passes over the training prompts; lmrl counts RL steps, each of train.rollout_size completions: set "
           "train.steps = {value} x training prompts / prompts per step")

# verl's names, each under its full Hydra path (`actor_rollout_ref.actor.clip_ratio_low=0.28`, or nested
# in YAML), which may also be written without its leading sections (`actor.clip_ratio_low`,
# `rollout.n`) or under the section of the lmrl key it sets (`algo.clip_ratio_low`).
VERL_ALIASES: dict[str, Alias] = {
    "data.train_batch_size": Alias(None, "verl", note=_ROLLOUT_SIZE),
    "data.max_prompt_length": Alias("task.max_prompt_length", "verl", caveat=(
        "lmrl keeps a longer prompt's last max_prompt_length tokens and names it; verl's data.truncation=error refuses "
        "it")),
    "data.max_response_length": Alias("task.max_new_tokens", "verl"),
    "data.train_files": Alias("task.train_file", "verl", offline="data.train_file",
                              note="one file, parquet or JSONL, its rows as verl's"),
    "data.val_files": Alias("task.test_file", "verl", offline="data.eval_file",
                            note="one file, parquet or JSONL, its rows as verl's"),
    # in an offline run data.prompt_key is lmrl's own key: the same column, of the offline trainers' rows
    "data.prompt_key": Alias("task.prompt_key", "verl", offline="data.prompt_key"),
    "data.multiturn.messages_key": Alias("data.messages_key", "verl"),
    "data.shuffle": Alias("train.prompt_order", "verl", values={True: "shuffled", False: "in_order"}),
    "actor_rollout_ref.rollout.n": Alias("algo.group_size", "verl"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": Alias(None, "verl", note=(
        "counts prompts, lmrl's algo.minibatch_size completions: set algo.minibatch_size = {value} x "
        "algo.group_size")),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": Alias(None, "verl", note=_GA_STEPS),
    "actor_rollout_ref.actor.ppo_micro_batch_size": Alias(None, "verl", note=(
        "is a micro-batch's size over all processes, lmrl's train.ga_steps a count of micro-batches: set "
        "train.ga_steps = minibatch / {value}, the minibatch being algo.minibatch_size (0: train.rollout_size)")),
    "actor_rollout_ref.actor.use_dynamic_bsz": Alias(None, "verl", matches=(False,), missing=True, note=(
        "sizes micro-batches by tokens; lmrl's are train.ga_steps equal shares of the minibatch")),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": Alias(None, "verl", missing=True, note=(
        "sizes micro-batches by tokens; lmrl's are train.ga_steps equal shares of the minibatch")),
    "actor_rollout_ref.actor.ppo_epochs": Alias("algo.ppo_epochs", "verl"),
    "algorithm.adv_estimator": Alias("algo.name", "verl", values={
        "grpo": _VERL_GRPO, "grpo_vectorized": _VERL_GRPO, "rloo": "rloo", "rloo_vectorized": "rloo", "gae": _GAE,
        "reinforce_plus_plus": "reinforce_plus_plus", "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
        "remax": "remax", "grpo_passk": {**_VERL_GRPO, "algo.adv_mode": "passk"}, "opo": {"algo.name": "grpo", "algo.adv_mode": "opo"},
        "gpg": {"algo.name": "grpo", "algo.adv_mode": "gpg"}},
        refused={**{name: "has no lmrl estimator (lmrl has reinforce, rloo, grpo with algo.adv_mode grpo, passk, "
                          "opo or gpg, ppo, reinforce_plus_plus[_baseline] and remax: algo.name)"
           for name in ("optimal_token_baseline", "tir_optimal_token_baseline")}},
        note="grpo with verl's eps, 1e-6 (lmrl's default 1e-4); the _vectorized estimators are the same numbers; gae "
             "is ppo with a critic of its own and whitened advantages, as verl's; reinforce_plus_plus_baseline "
             "centres the reward on its group before the per-token KL is subtracted (as OpenRLHF's), where verl "
             "centres the KL-shaped sum, the same without algo.kl_in_reward; gpg's α is B over the completions in "
             "groups whose rewards differ (the GPG paper's), where verl divides B by its count of non-zero rewards; remax "
             "decodes each prompt greedily once a step and subtracts that completion's reward from every token's "
             "return, as verl's"),
    "algorithm.norm_adv_by_std_in_grpo": Alias("algo.scale_rewards", "verl", values={True: "group", False: "none"}),
    "actor_rollout_ref.actor.use_kl_loss": Alias("algo.kl_in_reward", "verl", values={True: False}, refused={
        False: "has no lmrl switch: the KL is in the loss while algo.kl_coef > 0 (kl_loss_coef) and off at "
               "algo.kl_coef=0, the default; leave use_kl_loss and kl_loss_coef out for no KL"}),
    "actor_rollout_ref.actor.kl_loss_coef": Alias("algo.kl_coef", "verl", caveat=(
        "lmrl's KL is on whenever algo.kl_coef > 0 (verl's loss KL only with use_kl_loss=true)")),
    "actor_rollout_ref.actor.kl_loss_type": Alias("algo.kl_estimator", "verl", **_VERL_KL),
    "algorithm.use_kl_in_reward": Alias("algo.kl_in_reward", "verl", values={
        True: {"algo.kl_in_reward": True, "algo.kl_estimator": "k1"}, False: False},
        note="the reward's KL is k1, as verl's algorithm.kl_penalty default (lmrl's algo.kl_estimator default: k3)"),
    "algorithm.kl_penalty": Alias("algo.kl_estimator", "verl", **_VERL_KL),
    "algorithm.kl_ctrl.kl_coef": Alias("algo.kl_coef", "verl", caveat=(
        "lmrl has one KL coefficient, in the loss or (algo.kl_in_reward=true) in the reward")),
    "algorithm.kl_ctrl.type": Alias("algo.kl_target", "verl", values={"fixed": 0.0}, refused={
        "adaptive": "steers the coefficient towards target_kl; lmrl does too, with algo.kl_target, a per-completion "
                    "sum of the KL where verl's target_kl is a per-token mean: set algo.kl_target = target_kl x the "
                    "mean completion length in tokens"}),
    "algorithm.kl_ctrl.target_kl": Alias(None, "verl", note=_KL_SUM),
    "algorithm.kl_ctrl.horizon": Alias("algo.kl_horizon", "verl"),
    "actor_rollout_ref.actor.clip_ratio": Alias("algo.clip_range_left", "verl", also="algo.clip_range_right"),
    "actor_rollout_ref.actor.clip_ratio_low": Alias("algo.clip_range_left", "verl"),
    "actor_rollout_ref.actor.clip_ratio_high": Alias("algo.clip_range_right", "verl"),
    "actor_rollout_ref.actor.clip_ratio_c": Alias("algo.clip_ratio_max", "verl", note=(
        "verl's dual clip is on by default (3.0), lmrl's cap off (null): set algo.clip_ratio_max=3 to match")),
    "actor_rollout_ref.actor.loss_agg_mode": Alias("algo.loss_level", "verl", values={
        "token-mean": "token", "seq-mean-token-mean": "sequence",
        "seq-mean-token-sum": {"algo.loss_level": "constant", "algo.loss_constant": 1.0}}, refused={
        "seq-mean-token-sum-norm": "divides the summed token losses by the response length only; lmrl's nearest, "
                                   "algo.loss_level=constant, divides by the minibatch's completions x "
                                   "algo.loss_constant, so its steps are that batch size smaller: set "
                                   "algo.loss_level=constant and scale optim.lr to match"}),
    "actor_rollout_ref.actor.policy_loss.loss_mode": Alias("algo.ratio_level", "verl", values={
        "vanilla": "token", "gspo": "sequence", "gpg": "token"}, note=(
        "gpg is the clipped surrogate, whose gradient is GPG's -A grad log pi while each batch is used once "
        "(algo.ppo_epochs=1, algo.minibatch_size=0: lmrl's defaults)")),
    "actor_rollout_ref.actor.entropy_coeff": Alias("algo.ent_coef", "verl"),
    "actor_rollout_ref.actor.grad_clip": Alias("train.grad_clip", "verl", note=(
        "under ppo the critic's gradients are clipped to it too, on their own")),
    "actor_rollout_ref.actor.optim.lr": Alias("optim.lr", "verl", note="lmrl's default is 1e-4 (verl's 1e-6)"),
    "actor_rollout_ref.actor.optim.weight_decay": Alias("optim.weight_decay", "verl"),
    "actor_rollout_ref.actor.optim.betas": Alias("optim.betas", "verl", note="lmrl's default is [0.9, 0.99] "
                                                                             "(verl's [0.9, 0.999])"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": Alias("schedule.warmup_steps", "verl", values={-1: 0},
                                                           others=True),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": Alias(None, "verl", matches=(0,), note=_WARMUP_RATIO),
    "actor_rollout_ref.actor.optim.warmup_style": Alias("schedule.name", "verl",
                                                        values={"constant": "constant", "cosine": "cosine"}),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": Alias("schedule.name", "verl",
                                                             values={"constant": "constant", "cosine": "cosine"}),
    "actor_rollout_ref.actor.optim.min_lr_ratio": Alias("schedule.min_lr_ratio", "verl", note=(
        "lmrl's default is 0.1 (verl's 0.0)")),
    "actor_rollout_ref.rollout.temperature": Alias("train.temperature", "verl"),
    "actor_rollout_ref.rollout.top_p": Alias("train.top_p", "verl"),
    "actor_rollout_ref.rollout.top_k": Alias("train.top_k", "verl", values={-1: 0}, others=True,
                                             note="verl's off is -1, lmrl's 0"),
    "actor_rollout_ref.rollout.name": Alias("rollout.engine", "verl", values={"vllm": "vllm", "hf": "local"}, refused={
        "sglang": "is not an lmrl engine: rollout.engine is local (the policy's own sampler) or vllm"},
        note="lmrl's vllm engine is one process beside the learner (no torchrun, no Ray workers)"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": Alias("rollout.gpu_memory_utilization", "verl"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": Alias(None, "verl", matches=(1,), missing=True, note=(
        "shards the rollout model; lmrl's vllm engine runs one unsharded engine")),
    "actor_rollout_ref.model.path": Alias("model.path", "verl", implies={"model.type": "hf"}),
    "actor_rollout_ref.model.lora_rank": Alias("lora.r", "verl"),
    "actor_rollout_ref.model.lora_alpha": Alias("lora.alpha", "verl"),
    "actor_rollout_ref.model.target_modules": Alias("lora.target_modules", "verl"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": Alias("model.gradient_checkpointing", "verl"),
    "critic.cliprange_value": Alias("algo.value_clip", "verl", note="lmrl's default is 0.2 (verl's 0.5)"),
    "critic.optim.lr": Alias("algo.critic_lr", "verl"),
    "critic.grad_clip": Alias(None, "verl", note=_CRITIC_CLIP),
    "critic.model.path": Alias(None, "verl", note=_CRITIC_MODEL),
    "algorithm.gamma": Alias("algo.gamma", "verl"),
    "algorithm.lam": Alias("algo.lam", "verl", note="lmrl's default is 0.95 (verl's 1.0)"),
    "algorithm.filter_groups.enable": Alias("algo.dynamic_sampling", "verl"),
    "algorithm.filter_groups.max_num_gen_batches": Alias("algo.max_sample_batches", "verl", note=(
        "lmrl's is at least 1 (verl's 0 or less: no limit); once they are sampled, groups that tied fill the "
        "batch where verl stops with an error")),
    "algorithm.filter_groups.metric": Alias(None, "verl", matches=("seq_reward", "seq_final_reward", "score"), note=(
        "picks what verl compares within a group; lmrl compares each completion's reward (verl's seq_reward)")),
    "custom_reward_function.path": Alias(None, "verl", note=(
        "names the file of a reward function; lmrl's reward.funcs names file and function at once: set "
        "reward.funcs=[{value}:compute_score] (verl's compute_score signature is taken as it is)")),
    "custom_reward_function.name": Alias(None, "verl", note=(
        "names a reward function in custom_reward_function.path; lmrl's reward.funcs names file and function at "
        "once: set reward.funcs=[path/to/file.py:{value}]")),
    "reward_model.overlong_buffer.enable": Alias(None, "verl", matches=(False,), note=_OVERLONG),
    "reward_model.overlong_buffer.len": Alias(None, "verl", note=_OVERLONG),
    "reward_model.overlong_buffer.penalty_factor": Alias(None, "verl", note=_OVERLONG),
    "trainer.total_training_steps": Alias("train.steps", "verl"),
    "trainer.total_epochs": Alias(None, "verl", note=_EPOCHS),
    "trainer.test_freq": Alias("train.eval_every", "verl", refused={
        -1: "turns evaluation off; an lmrl RL run evaluates at its start and end: set train.eval_every above "
            "train.steps"}),
    "trainer.save_freq": Alias("train.ckpt_every", "verl", refused={
        -1: "turns checkpoints off; an lmrl run saves at its end: set train.ckpt_every above train.steps"}),
    "trainer.max_actor_ckpt_to_keep": Alias("train.keep_checkpoints", "verl", values={None: 0}, others=True),
    "trainer.val_before_train": Alias(None, "verl", matches=(True,), missing=True, note=(
        "skips the evaluation before training; an lmrl RL run always evaluates before its first step")),
    "trainer.critic_warmup": Alias(None, "verl", matches=(0,), missing=True, note=(
        "trains the critic alone first; lmrl trains both from the first step")),
    "trainer.resume_mode": Alias("run.resume", "verl", values={"auto": "auto", "disable": "never"}, refused={
        "resume_path": "resumes from trainer.resume_from_path: set run.resume=auto run.resume_from=PATH"},
        note="lmrl's default is never (verl's auto)"),
    "trainer.resume_from_path": Alias("run.resume_from", "verl"),
    "trainer.default_local_dir": Alias("run.dir", "verl", caveat=(
        "lmrl writes checkpoints/step_N and checkpoints/best under it; `lmrl export` writes the Hugging Face model")),
    "trainer.experiment_name": Alias("run.name", "verl"),
    "trainer.project_name": Alias("run.wandb_project", "verl"),
    "trainer.logger": Alias(None, "verl", note=(
        "names the trackers; lmrl's console and TensorBoard are on by default (run.tensorboard), and for Weights & "
        "Biases set run.wandb=true run.wandb_mode=online")),
    "trainer.n_gpus_per_node": Alias(None, "verl", matches=(1,), note=(
        "runs a process per GPU; lmrl's are launched by torchrun: torchrun --nproc_per_node=N -m lmrl train ... "
        "(distributed.strategy=ddp or fsdp), or run as Ray rollout workers (rollout.workers)")),
    "trainer.nnodes": Alias(None, "verl", matches=(1,), note=(
        "spans several nodes; launch lmrl on each with torchrun --nnodes=N ... -m lmrl train ...")),
}

# OpenRLHF's flags (`--n_samples_per_prompt 8` is written n_samples_per_prompt=8), bare, under the section
# of the lmrl key it sets (`algo.eps_clip`), or under their dotted names in OpenRLHF's newer releases
# (`rollout.n_samples_per_prompt`).
OPENRLHF_ALIASES: dict[str, Alias] = {
    "n_samples_per_prompt": Alias("algo.group_size", "OpenRLHF", head="rollout.n_samples_per_prompt"),
    "rollout_batch_size": Alias(None, "OpenRLHF", head="rollout.batch_size", note=_ROLLOUT_SIZE),
    "micro_rollout_batch_size": Alias(None, "OpenRLHF", head="rollout.micro_batch_size", missing=True, note=(
        "splits generation into chunks; lmrl samples a step's prompts in one batch: leave it out")),
    "train_batch_size": Alias("algo.minibatch_size", "OpenRLHF", head="train.batch_size"),
    "micro_train_batch_size": Alias(None, "OpenRLHF", head="train.micro_batch_size", note=_GA_STEPS),
    "max_epochs": Alias("algo.ppo_epochs", "OpenRLHF", head="train.max_epochs"),
    "num_episodes": Alias(None, "OpenRLHF", head="train.num_episodes", note=_EPOCHS),
    "advantage_estimator": Alias("algo.name", "OpenRLHF", head="algo.advantage.estimator", values={
        "gae": _GAE, "rloo": "rloo", "group_norm": {"algo.name": "grpo", "algo.adv_eps": 1e-9},
        "dr_grpo": {"algo.name": "grpo", "algo.scale_rewards": "none"}, "reinforce": "reinforce_plus_plus",
        "reinforce_baseline": "reinforce_plus_plus_baseline"},
        note="gae is ppo with a critic of its own and whitened advantages, group_norm grpo with OpenRLHF's eps "
             "1e-9, dr_grpo grpo without the std, reinforce REINFORCE++ (lmrl's algo.name=reinforce is REINFORCE "
             "with a moving-average baseline, another estimator)"),
    "no_advantage_std_norm": Alias("algo.normalize_advantages_std", "OpenRLHF", head="algo.advantage.no_std_norm",
                                   values={True: False, False: True}),
    "init_kl_coef": Alias("algo.kl_coef", "OpenRLHF", head="algo.kl.init_coef",
                          implies={"algo.kl_in_reward": True, "algo.kl_estimator": "k1", "algo.kl_clamp": 10.0},
                          note="in the reward, k1 and bounded to [-10, 10], as OpenRLHF's without use_kl_loss and "
                               "kl_estimator",
                          caveat="OpenRLHF's default 0.01 is lmrl's 0 (no KL)"),
    "use_kl_loss": Alias("algo.kl_in_reward", "OpenRLHF", head="algo.kl.use_loss", values={True: False, False: True}),
    "kl_estimator": Alias("algo.kl_estimator", "OpenRLHF", head="algo.kl.estimator", implies={"algo.kl_clamp": 10.0},
                          note="bounded to [-10, 10] (algo.kl_clamp=10), as OpenRLHF bounds every estimate"),
    "kl_target": Alias(None, "OpenRLHF", head="algo.kl.target", note=_KL_SUM),
    "kl_horizon": Alias("algo.kl_horizon", "OpenRLHF", head="algo.kl.horizon"),
    "eps_clip": Alias("algo.clip_range_left", "OpenRLHF", head="actor.eps_clip", also="algo.clip_range_right"),
    "eps_clip_low_high": Alias("algo.clip_range_left", "OpenRLHF", head="actor.eps_clip_low_high",
                               also="algo.clip_range_right", pair=True),
    "dual_clip": Alias("algo.clip_ratio_max", "OpenRLHF", head="actor.dual_clip"),
    "value_clip": Alias("algo.value_clip", "OpenRLHF", head="critic.value_clip",
                        note="lmrl's default is 0.2 (OpenRLHF's 0.5)"),
    "gamma": Alias("algo.gamma", "OpenRLHF", head="algo.advantage.gamma"),
    "lambd": Alias("algo.lam", "OpenRLHF", head="algo.advantage.lambd", note="lmrl's default is 0.95 (OpenRLHF's 1)"),
    "entropy_loss_coef": Alias("algo.ent_coef", "OpenRLHF", head="actor.entropy_coef"),
    "policy_loss_type": Alias("algo.ratio_level", "OpenRLHF", head="actor.policy_loss_type",
                              values={"ppo": "token", "gspo": "sequence"}),
    "temperature": Alias("train.temperature", "OpenRLHF", head="rollout.temperature"),
    "top_p": Alias("train.top_p", "OpenRLHF", head="rollout.top_p"),
    "prompt_max_len": Alias("task.max_prompt_length", "OpenRLHF"),
    "generate_max_len": Alias("task.max_new_tokens", "OpenRLHF"),
    "max_new_tokens": Alias("task.max_new_tokens", "OpenRLHF", head="rollout.max_new_tokens"),
    "max_len": Alias(None, "OpenRLHF", head="data.max_len", note=(
        "caps prompt + response; lmrl caps each: task.max_prompt_length and task.max_new_tokens")),
    "actor_learning_rate": Alias("optim.lr", "OpenRLHF", head="actor.adam.lr"),
    "critic_learning_rate": Alias("algo.critic_lr", "OpenRLHF", head="critic.adam.lr"),
    "lr_warmup_ratio": Alias(None, "OpenRLHF", head="actor.lr_warmup_ratio", matches=(0,), note=_WARMUP_RATIO),
    "lr_scheduler": Alias("schedule.name", "OpenRLHF", head="actor.lr_scheduler",
                          values={"cosine_with_min_lr": "cosine", "constant_with_warmup": "constant"}),
    "adam_betas": Alias("optim.betas", "OpenRLHF", head="actor.adam.betas",
                        note="lmrl's default is [0.9, 0.99] (OpenRLHF's [0.9, 0.95])"),
    "l2": Alias("optim.weight_decay", "OpenRLHF", head="actor.adam.weight_decay"),
    "max_norm": Alias("train.grad_clip", "OpenRLHF", head="actor.max_norm"),
    "pretrain": Alias("model.path", "OpenRLHF", head="actor.model_name_or_path", implies={"model.type": "hf"}),
    "reward_pretrain": Alias("reward.model", "OpenRLHF", head="reward.model_name_or_path"),
    "critic_pretrain": Alias(None, "OpenRLHF", head="critic.model_name_or_path", note=_CRITIC_MODEL),
    "apply_chat_template": Alias("task.chat", "OpenRLHF", head="data.apply_chat_template",
                                 note="lmrl's default is on (OpenRLHF's off)"),
    "prompt_data": Alias("task.train_file", "OpenRLHF", head="data.prompt_dataset", note=(
        "a local file, parquet or JSONL (`lmrl prepare-data` converts a Hugging Face data set)")),
    "eval_dataset": Alias("task.test_file", "OpenRLHF", head="eval.dataset", note=(
        "a local file, parquet or JSONL")),
    "input_key": Alias("task.prompt_key", "OpenRLHF", head="data.input_key", offline="data.prompt_key", note=(
        "lmrl's default is prompt (OpenRLHF's input)")),
    "output_key": Alias("data.response_key", "OpenRLHF", head="data.output_key",
                        note="lmrl's default reads response or completion (TRL's)"),
    "prompt_key": Alias("task.prompt_key", "OpenRLHF", head="data.prompt_key", offline="data.prompt_key"),
    "chosen_key": Alias("data.chosen_key", "OpenRLHF", head="data.chosen_key"),
    "rejected_key": Alias("data.rejected_key", "OpenRLHF", head="data.rejected_key"),
    "label_key": Alias("task.label_key", "OpenRLHF", head="data.label_key"),
    "remote_rm_url": Alias(None, "OpenRLHF", head="reward.remote_url", note=(
        "names a reward server or a .py file; lmrl calls a file's function itself: set "
        "reward.funcs=[{value}:reward_func] (OpenRLHF's reward_func signature is taken as it is; a server has no "
        "lmrl counterpart)")),
    "overlong_buffer_len": Alias(None, "OpenRLHF", head="reward.overlong_buffer_len", note=_OVERLONG),
    "overlong_penalty_factor": Alias(None, "OpenRLHF", head="reward.overlong_penalty_factor", note=_OVERLONG),
    "input_template": Alias(None, "OpenRLHF", head="data.input_template", note=(
        "is written with {{}}; lmrl's task.prompt_template with {{prompt}} where the prompt goes")),
    "normalize_reward": Alias(None, "OpenRLHF", head="reward.normalize_enable", matches=(False,), missing=True,
                              note="normalises rewards with running statistics; lmrl does not"),
    "reward_clip_range": Alias("reward.clip", "OpenRLHF", head="reward.clip_range",
                               caveat="OpenRLHF's default [-10, 10] is lmrl's [] (not clamped)"),
    "dynamic_filtering": Alias("algo.dynamic_sampling", "OpenRLHF", head="algo.dynamic_filtering_enable", note=(
        "lmrl keeps the groups whose rewards differ, OpenRLHF those whose mean reward lies inside "
        "dynamic_filtering_reward_range: the same for rewards of 0 or 1 and its default range (0, 1)")),
    "packing_samples": Alias(None, "OpenRLHF", head="ds.packing_samples", matches=(False,), missing=True, note=(
        "packs RL samples; lmrl packs only run.trainer=sft's rows (data.packing)")),
    "zero_stage": Alias(None, "OpenRLHF", head="ds.zero_stage", note=(
        "is DeepSpeed's; under torchrun lmrl keeps a full copy per process (distributed.strategy=ddp) or shards "
        "parameters, gradients and optimizer state (fsdp, as ZeRO-3)")),
    "vllm_num_engines": Alias(None, "OpenRLHF", head="vllm.num_engines", matches=(1,), missing=True, note=(
        "runs several vLLM engines; lmrl's rollout.engine=vllm runs one")),
    "colocate_all_models": Alias(None, "OpenRLHF", head="train.colocate_all", note=(
        "puts every model on the same GPUs; lmrl shares a GPU between the learner and a Ray rollout worker with "
        "distributed.learner_gpus=0.5 rollout.worker_gpus=0.5")),
    "lora_rank": Alias("lora.r", "OpenRLHF", head="ds.lora.rank"),
    "lora_alpha": Alias("lora.alpha", "OpenRLHF", head="ds.lora.alpha"),
    "lora_dropout": Alias("lora.dropout", "OpenRLHF", head="ds.lora.dropout"),
    "target_modules": Alias("lora.target_modules", "OpenRLHF", head="ds.lora.target_modules"),
    "gradient_checkpointing": Alias("model.gradient_checkpointing", "OpenRLHF",
                                    head="actor.gradient_checkpointing_enable"),
    "save_steps": Alias("train.ckpt_every", "OpenRLHF", head="ckpt.save_steps",
                        note="OpenRLHF's -1 (never) is refused: an lmrl run saves at its end"),
    "eval_steps": Alias("train.eval_every", "OpenRLHF", head="eval.steps",
                        note="OpenRLHF's -1 (never) is refused: an lmrl RL run evaluates at its start and end"),
    "logging_steps": Alias("train.log_every", "OpenRLHF", head="logger.logging_steps"),
    "max_ckpt_num": Alias("train.keep_checkpoints", "OpenRLHF", head="ckpt.max_num"),
    "seed": Alias("run.seed", "OpenRLHF", head="train.seed"),
    "wandb_project": Alias("run.wandb_project", "OpenRLHF", head="logger.wandb.project"),
}

# verl's and OpenRLHF's sections that are not lmrl's, each with the lmrl sections that hold their settings
FOREIGN_SECTIONS = {
    "actor_rollout_ref": "verl's actor_rollout_ref is lmrl's model and lora (the model), optim (its optimizer), algo "
                         "(the actor's loss), train (sampling and the batch's shape) and rollout (the engine)",
    "actor": "verl's and OpenRLHF's actor is lmrl's optim (its optimizer), algo (its loss) and train (the batch's "
             "shape)",
    "algorithm": "verl's algorithm is lmrl's algo",
    "trainer": "verl's trainer is lmrl's train (steps, evaluation, checkpoints) and run (name, directory, trackers)",
    "critic": "verl's and OpenRLHF's critic is lmrl's algo.value_model (with algo.critic_lr, algo.vf_coef and "
              "algo.value_clip)",
    "reward_model": "verl's reward_model is lmrl's reward section",
    "custom_reward_function": "verl's custom_reward_function is lmrl's reward.funcs",
    "ckpt": "OpenRLHF's ckpt is lmrl's train (ckpt_every, keep_checkpoints) and run (dir)",
    "logger": "OpenRLHF's logger is lmrl's run (wandb, tensorboard) and train (log_every)",
    "ds": "OpenRLHF's ds (DeepSpeed) is lmrl's distributed and lora sections",
    "vllm": "OpenRLHF's vllm is lmrl's rollout section (engine=vllm)",
}
_TABLES = (TRL_ALIASES, VERL_ALIASES, OPENRLHF_ALIASES)


# -- spellings -------------------------------------------------------------------------------------
def all_keys() -> list[str]:
    cfg = Config()
    return [f"{s.name}.{f.name}" for s in dataclasses.fields(cfg) for f in dataclasses.fields(getattr(cfg, s.name))]


def _spellings_of(name: str, alias: Alias) -> list[str]:
    """The ways `name` may be written besides itself."""
    home = list(dict.fromkeys(k.partition(".")[0] for k in (alias.key, alias.offline) if k))
    last = name.rpartition(".")[2]
    if alias.source in _TRL_SECTIONS:
        return [f"{s}.{name}" for s in list(_TRL_SECTIONS[alias.source]) + home]
    parts = name.split(".")
    tails = [".".join(parts[i:]) for i in range(1, len(parts) - 1)]  # actor.clip_ratio_low, rollout.n
    return tails + ([alias.head] if alias.head else []) + [f"{s}.{last}" for s in home if len(last) > 1]


def _same(a: Alias, b: Alias) -> bool:
    """Whether two names set the same keys to the same values (TRL's temperature and OpenRLHF's)."""
    fields = ("key", "values", "others", "refused", "matches", "also", "implies", "pair", "offline")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def _alias_spellings() -> dict[str, tuple[str, Alias]]:
    """Each way a name may be written -> (the name, its Alias). A name is itself a spelling (TRL's bare
    where `bare`); a spelling that is an lmrl key is that key, and one that two names with different
    meanings would share is left out (both names still work)."""
    keys = set(all_keys())
    out: dict[str, tuple[str, Alias]] = {}
    for table in _TABLES:
        for name, alias in table.items():
            if name in out and not _same(out[name][1], alias):
                raise ValueError(f"{alias.owner}'s {name} means something else already ({out[name][1].owner}'s)")
            if alias.bare and name not in keys:
                out.setdefault(name, (name, alias))
    shared: set[str] = set()
    for table in _TABLES:
        for name, alias in table.items():
            for spelling in _spellings_of(name, alias):
                if spelling in keys or spelling in shared:
                    continue
                if spelling in out and not _same(out[spelling][1], alias):
                    if out[spelling][0] != spelling:  # a name itself keeps its spelling
                        shared.add(spelling)
                        del out[spelling]
                    continue
                out.setdefault(spelling, (name, alias))
    return out


SPELLINGS = _alias_spellings()
# An offline trainer's key that is, in an RL run, another tool's name for an RL key (verl's data.prompt_key:
# task.prompt_key) -> (the name, its Alias); verl's where OpenRLHF's newer dotted name is the same.
RL_SPELLINGS = {alias.offline: (name, alias) for table in (OPENRLHF_ALIASES, VERL_ALIASES)
                for name, alias in table.items() if alias.offline in (name, alias.head)}


def spelling(written: str, offline: bool, keys_written=()) -> tuple[str, Alias] | None:
    """(the name, its Alias) that `written` is in one source (a YAML file, the command line) of an RL run or,
    `offline`, of an offline trainer's; None where it is an lmrl key or no name at all. An offline
    trainer's key that verl spells alike for an RL key (data.prompt_key) is verl's name in an RL run
    unless the source writes that RL key itself (`keys_written`): a saved config.yaml, or `lmrl config`'s
    output, holds every key under its own name."""
    if written in SPELLINGS:
        return SPELLINGS[written]
    found = None if offline else RL_SPELLINGS.get(written)
    return None if found is None or found[1].key in keys_written else found


# -- translating -----------------------------------------------------------------------------------
def _shown(value: Any) -> str:
    """A value as it is written on the command line (true, low_var_kl, [0.2, 0.28])."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).split("\n")[0].removesuffix(" ...")


def _find(table: dict | tuple, value: Any) -> tuple[bool, Any]:
    """(found, the entry) for `value` among a table's keys, where 1 is not true."""
    for k in table:
        if isinstance(k, bool) == isinstance(value, bool) and k == value:
            return True, (table[k] if isinstance(table, dict) else k)
    return False, None


def translate(written: str, value: Any, where: str, offline: bool = False) -> tuple[list[tuple[str, Any]], str]:
    """The (lmrl key, value) pairs a name written as `written` sets in an RL run or, `offline`, in an
    offline trainer's, its own key first (the others give way to the same file or command line
    setting them otherwise: `lmrl.config._apply_items`), and what the note on the translation adds; a
    ConfigError where lmrl does not take it as it is."""
    name, alias = SPELLINGS.get(written) or RL_SPELLINGS[written]
    shown = _shown(value)
    said = f"{alias.owner}'s {written}={shown}" if written == name else f"{written}={shown} ({alias.owner}'s {name})"
    found, why = _find(alias.refused or {}, value)
    if found:
        raise ConfigError(f"{said} {why.format(value=shown)} (from {where})")
    if _find(alias.matches, value)[0]:
        return [], f"{said} asks for what lmrl does anyway: nothing to set"
    if alias.key is None:
        if alias.owner == "TRL":
            raise ConfigError(f"{written} (TRL's {alias.source}) has no single lmrl key in {where}: {alias.note}")
        raise ConfigError(f"{said} {alias.note.format(value=shown)} (from {where})")
    several = False
    if alias.values is not None:
        found, mapped = _find(alias.values, value)
        if found:
            value, several = mapped, isinstance(mapped, dict)
        elif not alias.others:
            taken = ", ".join(_shown(v) for v in list(alias.values) + list(alias.matches))
            raise ConfigError(f"{written}={value!r} is not one of {taken} ({alias.owner}'s {name}, which sets "
                              f"{alias.key}; from {where}){suggest(str(value), [str(v) for v in alias.values])}")
    key, kind = alias.key, ""
    if alias.offline:  # the same name for an RL key and an offline trainer's
        key, other = (alias.offline, alias.key) if offline else (alias.key, alias.offline)
        kind = f"run.trainer=rl's is {other}" if offline else f"the offline trainers' is {other}"
    if alias.pair:
        if not (isinstance(value, list) and len(value) == 2):
            raise ConfigError(f"{said} takes two numbers, [{key}, {alias.also}] (from {where})")
        pairs = [(key, value[0]), (alias.also, value[1])]
    elif several:
        pairs = list(value.items())
    else:
        pairs = [(key, value)] + ([(alias.also, value)] if alias.also else [])
    return pairs + list((alias.implies or {}).items()), "".join(
        f"; {t}" for t in (kind, alias.note, alias.caveat) if t)


def suggest_key(written: str, options: list[str], cutoff: float = 0.5) -> str:
    """The nearest of `options` (lmrl's names and the other tools') to an unknown name, as "; did you
    mean 'x'?", naming the key another tool's name sets."""
    near = difflib.get_close_matches(written, options, n=1, cutoff=cutoff)
    if not near:
        return ""
    _, alias = SPELLINGS.get(near[0], (None, None))
    what = f" ({alias.owner}'s name for {alias.key})" if alias and alias.key else ""
    return f"; did you mean {near[0]!r}{what}?"


def foreign_section_problem(section: str, written: str, where: str) -> str | None:
    """The line for an unknown name under verl's or OpenRLHF's own section (`actor_rollout_ref...`),
    naming the lmrl sections that hold its settings; None for another section."""
    if section not in FOREIGN_SECTIONS:
        return None
    names = [s for s in SPELLINGS if s.startswith(f"{section}.")]
    return (f"unknown key {written!r} in {where}: {FOREIGN_SECTIONS[section]} (lmrl's names for verl's and OpenRLHF's "
            f"settings: docs/from-verl-openrlhf.md){suggest_key(written, names, cutoff=0.8)}")


# -- the reference and the docs ----------------------------------------------------------------------
def _status(name: str, alias: Alias) -> str:
    """same / differs / missing, with how, for the docs' tables."""
    last = name.rpartition(".")[2]
    parts = []
    if alias.key is None:
        parts.append(f"{'missing' if alias.missing else 'differs'}: it {alias.note.format(value=last)}")
    elif alias.caveat:
        parts.append(f"differs: {alias.caveat}")
    else:
        parts.append("same" + (f"; {alias.note}" if alias.note else ""))
    reasons: dict[str, list[str]] = {}  # why -> the values refused for it
    for value, why in (alias.refused or {}).items():
        reasons.setdefault(why.format(value=last), []).append(f"`{_shown(value)}`")
    parts += [f"{', '.join(values)} refused: it {why}" for why, values in reasons.items()]
    parts += [f"`{_shown(v)}`: what lmrl does anyway" for v in alias.matches]
    return "; ".join(parts)


def _target(alias: Alias) -> str:
    """The lmrl keys a name sets, with its values where they are spelled differently."""
    if alias.key is None:
        return "—"
    text = f"`{alias.key}`" + (f" + `{alias.also}`" if alias.also else "")
    if alias.offline:
        text += f" (run.trainer=rl); `{alias.offline}` (sft, dpo, reward)"
    text += "".join(f" + `{k}={_shown(v)}`" for k, v in (alias.implies or {}).items())
    if alias.values:
        text += " (" + ", ".join(
            f"`{_shown(k)}` → " + (", ".join(f"`{kk}={_shown(vv)}`" for kk, vv in v.items()) if isinstance(v, dict)
                                   else f"`{_shown(v)}`")
            for k, v in alias.values.items()) + (", others as they are" if alias.others else "") + ")"
    return text


def markdown_tables() -> str:
    """The verl and OpenRLHF tables of docs/from-verl-openrlhf.md, as the alias tables have them."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["### verl → lmrl", "", "| verl key | lmrl key | status |", "|---|---|---|"]
    lines += [f"| `{name}` | {cell(_target(a))} | {cell(_status(name, a))} |" for name, a in VERL_ALIASES.items()]
    lines += ["", "### OpenRLHF → lmrl", "",
              "| OpenRLHF flag (newer releases) | lmrl key | status |", "|---|---|---|"]
    lines += [f"| `--{name}`" + (f" (`--{a.head}`)" if a.head else "") + f" | {cell(_target(a))} | "
              f"{cell(_status(name, a))} |" for name, a in OPENRLHF_ALIASES.items()]
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- BEGIN generated from lmrl/config/aliases.py -->", "<!-- END generated -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "from-verl-openrlhf.md"


def with_tables(text: str) -> str:
    """docs/from-verl-openrlhf.md's text with its generated block made anew."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown_tables()}{END}{tail}"


def write_doc() -> None:
    """Rewrites docs/from-verl-openrlhf.md's tables from the alias tables."""
    DOC.write_text(with_tables(DOC.read_text()))
