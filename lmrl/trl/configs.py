"""TRL's config classes, as lmrl takes them: `GRPOConfig`, `RLOOConfig`, `DPOConfig`, `SFTConfig` and
`RewardConfig` are TRL's own dataclasses (subclassed), so `TrlParser`, `HfArgumentParser`,
`--config file.yaml`, `to_dict()` and every default are TRL's. `args.to_config(model_path=, train_rows=)`
turns one into the lmrl `Config` of the run, field by field as `lmrl.trl.fields` says: carried into
lmrl's keys, listed in `args.ignored` (no effect; the trainer names them in the run log), or refused
with the field, its value and the reason. `args.notes` are the run log's lines where lmrl's defaults differ
from TRL's and why."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

try:
    import trl
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("lmrl.trl runs TRL's scripts and configs on lmrl and needs TRL itself: "
                      "pip install 'lmrl[trl]'") from e

from ..algos.losses import RATIO_LEVELS
from ..config import Config, config_from_dict
from ..common.errors import ConfigError
from . import fields as table

_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant",
              "cosine_with_min_lr": "cosine", "warmup_stable_decay": "wsd"}
# lr_scheduler_kwargs each schedule takes (transformers' names), at transformers' defaults where lmrl has no choice
_SCHEDULE_KWARGS = {"cosine": {"num_cycles"}, "cosine_with_min_lr": {"num_cycles", "min_lr", "min_lr_rate"},
                    "warmup_stable_decay": {"num_cycles", "num_decay_steps", "num_stable_steps", "warmup_type",
                                            "decay_type", "min_lr_ratio"}}
_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
_GRPO_LOSSES = {"grpo": "sequence", "dapo": "token", "bnpo": "token", "dr_grpo": "constant"}
# GRPOConfig.importance_sampling_level values (lmrl's ratio levels but RLOO's sequence_sum)
_IMPORTANCE_SAMPLING_LEVELS = tuple(level for level in RATIO_LEVELS if level != "sequence_sum")
_DPO_LOSSES = ("sigmoid", "ipo", "hinge", "robust")
_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "auto": "fp32", None: "fp32"}
_NEVER = 10**9  # a step interval no run reaches: "only at the end"
# GRPOConfig.generation_kwargs keys lmrl has (transformers' and vLLM's names) -> (section, key)
_GENERATION_KWARGS = {"temperature": ("train", "temperature"), "top_k": ("train", "top_k"),
                      "top_p": ("train", "top_p"), "min_p": ("train", "min_p"),
                      "repetition_penalty": ("train", "repetition_penalty"),
                      "max_new_tokens": ("task", "max_new_tokens"), "max_tokens": ("task", "max_new_tokens")}


def _text(value) -> object:
    """An enum's value (transformers stores strategies and names as str enums), else the value."""
    return getattr(value, "value", value)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def _bf16_hardware() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


class _LmrlArgs:
    """What lmrl adds to TRL's config classes (a mixin before TRL's class in the bases)."""

    kind = ""

    def __post_init__(self):
        # the fields set away from TRL's defaults, before TRL's post-init derives values of its own
        self.given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                      if f.init and _default(f) is not dataclasses.MISSING and _differs(getattr(self, f.name),
                                                                                         _default(f))}
        self.notes: list[str] = []
        if self.bf16 is None and not self.fp16:  # TRL: on unless fp16; lmrl: only where the hardware has it
            self.bf16 = bool(self.use_cpu) or _bf16_hardware()
            if not self.bf16:
                self.notes.append("bf16 is off: this machine has no bf16 GPU (TRL would stop here and ask for "
                                  "use_cpu=True; lmrl trains in float32)")
        super().__post_init__()
        self.ignored = sorted(name for name in self.given if table.rules(self.kind)[name].effect == table.NO_EFFECT)

    # -- the lmrl config -------------------------------------------------------------------------------
    def to_config(self, *, model_path: str, train_rows: int, peft_config=None) -> Config:
        """The lmrl Config these arguments describe, for a model at `model_path` and a training set of
        `train_rows` rows (see lmrl.trl.fields for each field)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self._refuse(world)
        ga = int(self.gradient_accumulation_steps)
        batch = int(self.per_device_train_batch_size) * ga * world
        steps, per_epoch = self._length(batch, train_rows, world)
        data: dict[str, dict] = {
            "run": {"dir": self.output_dir, "seed": self.seed, "name": self.run_name or Path(self.output_dir).name,
                    "progress": not self.disable_tqdm},
            "model": {"type": "hf", "path": model_path, "dtype": self._dtype(),
                      "gradient_checkpointing": bool(self.gradient_checkpointing if self.activation_checkpointing
                                                     is None else self.activation_checkpointing)},
            "optim": {"lr": self.learning_rate, "weight_decay": self.weight_decay,
                      "betas": [self.adam_beta1, self.adam_beta2], "eps": self.adam_epsilon},
            "schedule": self._schedule(steps),
            "train": {"ga_steps": ga, "grad_clip": self.max_grad_norm, "disable_dropout": bool(getattr(self, "disable_dropout", False)),
                      "log_every": max(1, _steps(self.logging_steps, steps)),
                      "keep_checkpoints": self.save_total_limit or 0},
            "eval": {"batch_size": self.per_device_eval_batch_size},
        }
        data["run"].update(self._trackers())
        if self.bf16:  # transformers' "bf16 (mixed) precision": autocast over the model's weights
            data["run"]["mixed_precision"] = "bf16"
        if self.use_cpu:
            data["run"]["device"] = "cpu"
        if self.fsdp:
            data["distributed"] = {"strategy": "fsdp"}
        if _text(self.eval_strategy) == "no" and not isinstance(self, _SampledArgs):  # rows only for evaluate()
            data["train"]["evaluate"] = False
        data["train"]["eval_every"] = self._interval(_text(self.eval_strategy), self.eval_steps or self.logging_steps,
                                                     steps, per_epoch, "eval")
        data["train"]["ckpt_every"] = self._interval(_text(self.save_strategy), self.save_steps, steps, per_epoch,
                                                     "save")
        if self.metric_for_best_model:
            data["train"]["best_metric"] = self._best_metric()
        if peft_config is not None:
            data["lora"] = lora_section(peft_config, model_path)
        self._shape(data, batch=batch, steps=steps, world=world)
        return config_from_dict(data, where=f"{type(self).__name__}(...)")

    def _shape(self, data: dict, *, batch: int, steps: int, world: int) -> None:
        """The kind's own sections."""
        raise NotImplementedError

    samples_per_row = 1  # what one data row is per step: a row, or GRPO's group of completions

    def _length(self, batch: int, rows: int, world: int) -> tuple[int, float]:
        """(optimizer steps of the run, steps per pass over the data)."""
        per_epoch = rows * self.samples_per_row / batch
        steps = int(self.max_steps) if self.max_steps > 0 else math.ceil(float(self.num_train_epochs) * per_epoch)
        return max(steps, 1), per_epoch

    def _refuse(self, world: int) -> None:
        rules = table.rules(self.kind)
        for name, value in self.given.items():
            rule = rules[name]
            if rule.effect == table.REFUSED and value not in rule.accepts:
                raise ConfigError(f"{type(self).__name__}({name}={value!r}): {rule.how}")
        optim = _text(self.optim)
        if optim not in _OPTIMIZERS:
            raise ConfigError(f"{type(self).__name__}(optim={optim!r}): lmrl trains with AdamW ({', '.join(_OPTIMIZERS)})")

    def _dtype(self) -> str:
        kwargs = dict(self.model_init_kwargs or {})
        dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
        dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
        if dtype not in _DTYPES:
            raise ConfigError(f"{type(self).__name__}(model_init_kwargs={{'dtype': {dtype!r}}}): lmrl loads models in "
                              f"bfloat16 or float32")
        others = sorted(k for k, v in kwargs.items() if v not in (None, False) and (k, v) != ("revision", "main"))
        if others:
            self.notes.append(f"model_init_kwargs {', '.join(others)}: no effect here (lmrl loads the local model "
                              f"with its own settings)")
        return _DTYPES[dtype]

    def _schedule(self, steps: int) -> dict:
        """lmrl's schedule section for lr_scheduler_type and its lr_scheduler_kwargs, as transformers'
        get_scheduler would build it for a run of `steps` optimizer steps."""
        name = _text(self.lr_scheduler_type)
        if name not in _SCHEDULES:
            raise ConfigError(f"lr_scheduler_type={name!r} is not one of {', '.join(_SCHEDULES)}")
        kwargs = self.lr_scheduler_kwargs or {}
        if isinstance(kwargs, str):  # a JSON string, as a command line gives it
            import json

            kwargs = json.loads(kwargs)
        where = f"{type(self).__name__}(lr_scheduler_type={name!r}, lr_scheduler_kwargs={kwargs!r})"
        unknown = sorted(set(kwargs) - _SCHEDULE_KWARGS.get(name, set()))
        if unknown:
            raise ConfigError(f"{where}: {', '.join(unknown)} is not an argument lmrl's {_SCHEDULES[name]} schedule "
                              f"takes (it takes {', '.join(sorted(_SCHEDULE_KWARGS.get(name, ()))) or 'none'})")
        if kwargs.get("num_cycles", 0.5) != 0.5 or kwargs.get("warmup_type", "linear") != "linear":
            raise ConfigError(f"{where}: lmrl's schedules decay in half a cosine (num_cycles=0.5) after a linear "
                              f"warm-up (warmup_type='linear')")
        warmup = _steps(self.warmup_steps, steps)
        section = {"name": _SCHEDULES[name], "warmup_steps": warmup, "min_lr_ratio": 0.0}
        if name == "cosine_with_min_lr":
            if ("min_lr" in kwargs) == ("min_lr_rate" in kwargs):
                raise ConfigError(f"{where}: give one of min_lr and min_lr_rate, as transformers asks")
            section["min_lr_ratio"] = (kwargs["min_lr_rate"] if "min_lr_rate" in kwargs
                                       else kwargs["min_lr"] / self.learning_rate)
        if name == "warmup_stable_decay":
            if "num_decay_steps" not in kwargs:
                raise ConfigError(f"{where}: num_decay_steps is required, as transformers asks")
            decay = int(kwargs["num_decay_steps"])
            stable = kwargs.get("num_stable_steps")
            if stable is not None and warmup + int(stable) + decay != steps:
                raise ConfigError(f"{where}: lmrl's decay ends with the run: leave num_stable_steps unset or make "
                                  f"warm-up + stable + decay equal the run's {steps} steps")
            section.update(decay_steps=decay, decay_shape=kwargs.get("decay_type", "cosine"),
                           min_lr_ratio=kwargs.get("min_lr_ratio", 0.0))
        return section

    def _trackers(self) -> dict:
        report = self.report_to or []
        report = [report] if isinstance(report, str) else list(report)
        report = [r for r in report if r != "none"]
        unknown = sorted(set(report) - {"tensorboard", "wandb", "all"})
        if unknown:
            raise ConfigError(f"report_to={unknown}: lmrl reports to tensorboard and wandb")
        return {"tensorboard": "tensorboard" in report or "all" in report, "wandb": "wandb" in report}

    def _interval(self, strategy: str, every, steps: int, per_epoch: float, what: str) -> int:
        if strategy == "no":
            return _NEVER
        if strategy == "steps":
            return max(1, _steps(every, steps))
        if strategy == "epoch":
            return max(1, round(per_epoch))
        raise ConfigError(f"{what}_strategy={strategy!r}: lmrl takes steps, epoch or no")

    def _best_metric(self) -> str:
        from ..train.tracking import lower_is_better

        metric = self.metric_for_best_model.removeprefix("eval_").removeprefix("eval/")
        metric = f"eval/{metric}"
        if self.greater_is_better is not None and self.greater_is_better == lower_is_better(metric):
            raise ConfigError(f"greater_is_better={self.greater_is_better} for {self.metric_for_best_model!r}: lmrl "
                              f"minimises metrics named like a loss and maximises the others")
        return metric


# LoraConfig fields lmrl sets itself: the section's own keys, the task type (the trainer's), peft's bookkeeping
_LORA_OWN = {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type", "peft_type", "base_model_name_or_path",
             "revision", "inference_mode", "auto_mapping"}


def lora_section(peft_config, model_path: str | None = None) -> dict:
    """lmrl's `lora` section for a peft LoraConfig, so the run builds (and a resume rebuilds) the adapter the
    user's LoraConfig describes: r, alpha, dropout, target_modules (None: peft's default for the model's
    architecture, read from `model_path`'s config, as get_peft_model picks it), and every other field set away
    from peft's default in `peft` (use_rslora, use_dora, modules_to_save, bias, rank_pattern, ...). A value
    that is no plain data (so config.yaml cannot record it) or that needs peft's data-driven initialisation
    is refused with its name."""
    import peft

    if not isinstance(peft_config, peft.LoraConfig):
        raise ConfigError(f"peft_config={type(peft_config).__name__}(...): lmrl trains LoRA adapters only "
                          f"(peft.LoraConfig)")
    if peft_config.init_lora_weights == "eva":
        raise ConfigError("LoraConfig(init_lora_weights='eva'): EVA initialises the adapter from data "
                          "(peft.initialize_lora_eva_weights), which lmrl does not run; use another init_lora_weights")
    defaults = peft.LoraConfig()
    extra = {}
    for f in dataclasses.fields(peft_config):
        value = getattr(peft_config, f.name)
        if f.name in _LORA_OWN or not f.init or not _differs(value, getattr(defaults, f.name)):
            continue
        value = sorted(value) if isinstance(value, set) else value
        if not _plain(value):
            raise ConfigError(f"LoraConfig({f.name}={value!r}): lmrl records the adapter's settings in config.yaml "
                              f"and takes plain values only (numbers, strings, lists, dicts)")
        extra[f.name] = value
    targets = peft_config.target_modules
    if targets is None:
        targets = _peft_default_targets(model_path, peft_config)
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    return {"r": int(peft_config.r), "alpha": float(peft_config.lora_alpha),
            "dropout": float(peft_config.lora_dropout), "target_modules": targets, "peft": extra}


def _peft_default_targets(model_path, peft_config) -> list[str]:
    """peft's default LoRA targets for the architecture of the model at `model_path` (or of a loaded model's
    config), what get_peft_model uses when target_modules is None."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if getattr(peft_config, "target_parameters", None):  # adapters on parameters only, as peft allows
        return []
    try:
        from transformers import AutoConfig

        model_type = (AutoConfig.from_pretrained(model_path) if isinstance(model_path, (str, os.PathLike))
                      else model_path).model_type
    except Exception as e:
        raise ConfigError(f"LoraConfig(target_modules=None): peft's default targets depend on the architecture, and "
                          f"{model_path!r} has no config transformers reads ({type(e).__name__}); name target_modules") from None
    if model_type not in DEFAULTS:
        raise ConfigError(f"LoraConfig(target_modules=None): peft has no default targets for model_type "
                          f"{model_type!r} (as get_peft_model would say); name target_modules")
    return sorted(DEFAULTS[model_type])


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    return isinstance(value, dict) and all(isinstance(k, str) and _plain(v) for k, v in value.items())


def _empty(value) -> bool:
    return value is None or (isinstance(value, (str, list, tuple, dict)) and not value)


def _differs(value, default) -> bool:
    """Set away from its default: command-line parsing spells some defaults differently (None for "",
    False for "no"), which is no change."""
    if _empty(value) and _empty(default):
        return False
    if value is False and default == "no":
        return False
    try:
        return bool(value != default)
    except Exception:  # e.g. arrays: compared by identity
        return value is not default


def _steps(value, total: int) -> int:
    """A step count given as TRL's fields give it: a fraction of the run below 1, else steps."""
    value = float(value or 0)
    return math.ceil(value * total) if 0 < value < 1 else int(value)


class _SampledArgs(_LmrlArgs):
    """What GRPOConfig and RLOOConfig share: groups of num_generations completions per prompt, sampled and
    scored by lmrl's RL trainer and trained with the clipped surrogate. Each class adds its algorithm's
    own keys (`_algorithm`)."""

    @property
    def samples_per_row(self) -> int:
        return int(self.num_generations)

    def _length(self, batch: int, rows: int, world: int) -> tuple[int, float]:
        if batch % self.samples_per_row:
            raise ConfigError(f"per_device_train_batch_size x gradient_accumulation_steps x {world} process(es) = "
                              f"{batch} completions per step must be a multiple of "
                              f"num_generations={self.samples_per_row}")
        # TRL's optimizer steps: each pass over the data samples every prompt's group once and trains on it
        # num_iterations times
        per_epoch = rows * self.samples_per_row / batch * int(self.num_iterations)
        steps = int(self.max_steps) if self.max_steps > 0 else math.ceil(float(self.num_train_epochs) * per_epoch)
        return max(steps, 1), per_epoch

    def _per_generation(self) -> int:
        """TRL's optimizer steps per generation: steps_per_generation micro-batches of the generated batch,
        gradient_accumulation_steps to an optimizer step, num_iterations passes. lmrl's RL step is one
        generation and these updates (algo.ppo_epochs passes of minibatches)."""
        per_step, ga = int(self.steps_per_generation), int(self.gradient_accumulation_steps)
        if per_step % ga:
            raise ConfigError(f"{type(self).__name__}(steps_per_generation={per_step}, gradient_accumulation_steps="
                              f"{ga}): lmrl trains each generation in whole optimizer steps: steps_per_generation "
                              f"must be a multiple of gradient_accumulation_steps")
        return per_step // ga * int(self.num_iterations)

    def _in_generations(self, data: dict, steps: int) -> None:
        """TRL counts the run, its warm-up, decay and logging, evaluation and saving intervals in optimizer
        steps; lmrl's RL trainer in RL steps, each one generation: the same points of the run, as close as
        whole generations allow (lmrl's LR moves once per generation)."""
        k = self._per_generation()
        if k == 1:
            return
        train, schedule = data["train"], data["schedule"]
        train["steps"] = math.ceil(steps / k)
        for key in ("log_every", "eval_every", "ckpt_every"):
            if train[key] != _NEVER:
                train[key] = max(1, round(train[key] / k))
        for key in ("warmup_steps", "decay_steps"):
            if key in schedule:
                schedule[key] = math.ceil(schedule[key] / k)
        self.notes.append(f"one lmrl RL step is one generation, {k} of TRL's optimizer steps (steps_per_generation / "
                          f"gradient_accumulation_steps x num_iterations): max_steps, warm-up and the logging, "
                          f"evaluation and saving steps are counted in generations ({steps} optimizer steps: "
                          f"{train['steps']} RL steps); the LR changes once per generation")

    def _generation_kwargs(self, data: dict) -> None:
        """generation_kwargs over the fields they name, as TRL updates its GenerationConfig or SamplingParams
        with them: the sampling options and the completion length; any other key is refused."""
        kwargs = self.generation_kwargs or {}  # TRL's post-init parsed a JSON string
        where = type(self).__name__
        for key, value in kwargs.items():
            if key not in _GENERATION_KWARGS:
                raise ConfigError(f"{where}(generation_kwargs={{{key!r}: {value!r}}}): lmrl takes "
                                  f"{', '.join(_GENERATION_KWARGS)} from generation_kwargs; {key} has no lmrl "
                                  f"equivalent")
            if value is None:  # the option off, as transformers reads None
                continue
            section, name = _GENERATION_KWARGS[key]
            data[section][name] = 0 if key == "top_k" and value == -1 else value  # -1: vLLM's top_k off
        lengths = {kwargs[k] for k in ("max_new_tokens", "max_tokens") if kwargs.get(k) is not None}
        if len(lengths) > 1:
            raise ConfigError(f"{where}(generation_kwargs={kwargs!r}): max_new_tokens and max_tokens both set "
                              f"the completion length; give one")

    def _algorithm(self, data: dict, algo: dict, world: int) -> None:
        """The algorithm's own keys, into `algo` (and any section of `data` they set)."""
        raise NotImplementedError

    def _shape(self, data, *, batch, steps, world):
        algo = {"group_size": int(self.num_generations), "kl_coef": float(self.beta),
                "ppo_epochs": int(self.num_iterations), "clip_range_left": float(self.epsilon),
                "clip_range_right": float(self.epsilon if self.epsilon_high is None else self.epsilon_high),
                "mask_truncated_completions": bool(self.mask_truncated_completions)}
        self._algorithm(data, algo, world)
        data["algo"] = algo
        data["run"]["trainer"] = "rl"
        # TRL 1.16 cuts no prompt (it has no max_prompt_length): neither does lmrl here
        data["task"] = {"name": "prompts", "chat": False, "max_new_tokens": int(self.max_completion_length),
                        "max_prompt_length": 0}
        data["sft"] = {"steps": 0}
        if _text(self.eval_strategy) == "no":  # lmrl's RL run is evaluated at its start and end: kept small here
            data["eval"]["size"] = int(self.per_device_eval_batch_size)
            self.notes.append(f"eval_strategy='no': the run is still evaluated at its start and end, on "
                              f"{self.per_device_eval_batch_size} held-out prompts (per_device_eval_batch_size; "
                              f"the first training prompts without an eval_dataset); TRL evaluates nothing")
        generated = int(self.steps_per_generation) // int(self.gradient_accumulation_steps) * batch
        data["train"].update(rollout_size=generated, steps=steps, temperature=float(self.temperature),
                             top_p=float(self.top_p), top_k=int(self.top_k or 0), min_p=float(self.min_p or 0.0),
                             repetition_penalty=float(self.repetition_penalty),
                             prompt_order="shuffled" if self.shuffle_dataset else "in_order")
        self._generation_kwargs(data)
        if generated > batch:  # each optimizer step trains on its share of the generation
            algo["minibatch_size"] = batch
        self._in_generations(data, steps)
        if self.log_completions:  # TRL prints num_completions_to_print of them, all where it is None
            to_print = self.num_completions_to_print
            data["train"].update(log_completions=True, completions_to_print=generated if to_print is None
                                 else to_print)
        # reward_weights weigh the trainer's reward_funcs (the trainer passes them on): reward.weights is for
        # reward.funcs named in the config, and would be refused beside functions given from Python
        if self.use_vllm:
            data["rollout"] = {"engine": "vllm", "gpu_memory_utilization": float(self.vllm_gpu_memory_utilization),
                               "max_model_len": int(self.vllm_max_model_length or 0)}
        data["model"]["chat_template_kwargs"] = self.chat_template_kwargs or {}  # TRL's post-init parsed a JSON string


@dataclass
class GRPOConfig(_SampledArgs, trl.GRPOConfig):
    """TRL's GRPOConfig (lmrl.trl.fields says what each field does here)."""

    kind = "grpo"

    def _algorithm(self, data, algo, world):
        loss = _text(self.loss_type)
        if loss not in _GRPO_LOSSES:
            raise ConfigError(f"GRPOConfig(loss_type={loss!r}): lmrl's losses are {', '.join(_GRPO_LOSSES)}")
        if loss == "bnpo" and data["train"]["ga_steps"] * world > 1:
            self.notes.append("loss_type='bnpo' normalises by the tokens of the whole accumulated batch here (as "
                              "dapo does); TRL divides each micro-batch by its own tokens")
        scale = self.scale_rewards
        scale = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else scale
        algo.update(name="grpo", scale_rewards=scale, loss_level=_GRPO_LOSSES[loss],
                    ent_coef=float(self.entropy_coef))
        level = _text(self.importance_sampling_level)
        if level not in _IMPORTANCE_SAMPLING_LEVELS:
            raise ConfigError(f"GRPOConfig(importance_sampling_level={level!r}): lmrl's levels are "
                              f"{', '.join(_IMPORTANCE_SAMPLING_LEVELS)}")
        algo.update(ratio_level=level, top_entropy_quantile=float(self.top_entropy_quantile),
                    kl_ratio_weighted=bool(self.use_bias_correction_kl))
        if self.delta is not None:
            if self.delta <= 1 + algo["clip_range_right"]:  # TRL takes it, and then caps the ratio inside the clip
                raise ConfigError(f"GRPOConfig(delta={self.delta!r}): must be > 1 + epsilon_high = "
                                  f"{1 + algo['clip_range_right']:g} (it caps the ratio above the clip, lmrl's "
                                  f"algo.clip_ratio_max)")
            algo["clip_ratio_max"] = float(self.delta)
        if self.off_policy_mask_threshold is not None:
            algo["off_policy_mask_threshold"] = float(self.off_policy_mask_threshold)
        if self.max_tool_calling_iterations is not None:  # tool calls answered, then the turn that answers
            data["env"] = {"max_turns": int(self.max_tool_calling_iterations) + 1}


@dataclass
class RLOOConfig(_SampledArgs, trl.RLOOConfig):
    """TRL's RLOOConfig (lmrl.trl.fields says what each field does here): lmrl's rloo with TRL's RLOOTrainer
    loss, one clipped ratio per completion, exp(sum of its token log-ratios) (ratio_level=sequence_sum),
    averaged over completions (loss_level=sequence); beta's KL, k1 summed over the completion, comes off
    the reward (kl_in_reward) before the leave-one-out baselines, after reward_clip_range clamps it."""

    kind = "rloo"

    def _algorithm(self, data, algo, world):
        algo.update(name="rloo", ratio_level="sequence_sum", loss_level="sequence", kl_in_reward=True,
                    kl_estimator="k1", normalize_advantages=bool(self.normalize_advantages))
        clip = self.reward_clip_range
        if clip is not None:
            numbers = (isinstance(clip, (list, tuple)) and len(clip) == 2
                       and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                               for x in clip))
            if not numbers or not clip[0] < clip[1]:
                raise ConfigError(f"RLOOConfig(reward_clip_range={clip!r}): lmrl takes two finite numbers (low, "
                                  f"high) with low < high (reward.clip); TRL's command line splits the value into "
                                  f"characters, so give it in a --config YAML file")
            data["reward"] = {"clip": [float(clip[0]), float(clip[1])]}
        if self.normalize_advantages:
            self.notes.append("normalize_advantages=True whitens the advantages with the population std + 1e-8 of "
                              "the whole batch (algo.normalize_advantages); TRL divides by the sample (Bessel) "
                              "std + 1e-4, a factor sqrt((B - 1) / B) apart")


class _OfflineArgs(_LmrlArgs):
    trainer = ""

    def _shape(self, data, *, batch, steps, world):
        data["run"]["trainer"] = self.trainer
        max_length = _NEVER if self.max_length is None else int(self.max_length)  # None: TRL cuts no row
        data["data"] = {"batch_size": batch, "epochs": float(self.num_train_epochs), "max_length": max_length,
                        "chat": False}
        data["train"]["max_steps"] = max(int(self.max_steps), 0)


@dataclass
class DPOConfig(_OfflineArgs, trl.DPOConfig):
    """TRL's DPOConfig (lmrl.trl.fields says what each field does here)."""

    kind, trainer = "dpo", "dpo"

    def _shape(self, data, *, batch, steps, world):
        super()._shape(data, batch=batch, steps=steps, world=world)
        losses = [self.loss_type] if isinstance(self.loss_type, str) else list(self.loss_type)
        if len(losses) != 1 or losses[0] not in _DPO_LOSSES:
            raise ConfigError(f"DPOConfig(loss_type={self.loss_type!r}): lmrl takes one of {', '.join(_DPO_LOSSES)}")
        smoothing = float(self.label_smoothing)
        if smoothing and losses[0] != "robust":  # TRL's sigmoid, ipo and hinge do not read it (lmrl's sigmoid would)
            self.notes.append(f"label_smoothing={smoothing} changes nothing with loss_type={losses[0]!r}, as in TRL "
                              f"(it is the label-flip chance of loss_type='robust')")
            smoothing = 0.0
        data["dpo"] = {"beta": float(self.beta), "loss_type": losses[0], "label_smoothing": smoothing}


@dataclass
class SFTConfig(_OfflineArgs, trl.SFTConfig):
    """TRL's SFTConfig (lmrl.trl.fields says what each field does here)."""

    kind, trainer = "sft", "sft"

    def _shape(self, data, *, batch, steps, world):
        super()._shape(data, batch=batch, steps=steps, world=world)
        if self.packing and self.max_length is None:
            raise ConfigError("SFTConfig(packing=True, max_length=None): packing needs max_length, the length of the "
                              "packed sequences (as TRL asks)")
        data["data"].update(text_field=self.dataset_text_field, truncation_mode=self.truncation_mode,
                            packing=bool(self.packing), packing_strategy=self.packing_strategy,
                            padding_free=bool(self.padding_free))
        smoothing = float(self.label_smoothing_factor)
        if smoothing and self.loss_type == "dft":  # TRL smooths the nll loss only
            self.notes.append(f"label_smoothing_factor={smoothing} changes nothing with loss_type='dft', as in TRL")
            smoothing = 0.0
        data["sft"] = {"loss_type": self.loss_type, "label_smoothing": smoothing,
                       "completion_only_loss": self.completion_only_loss is not False,
                       "assistant_only_loss": bool(self.assistant_only_loss),
                       "neftune_noise_alpha": float(self.neftune_noise_alpha or 0.0)}
        fractions = [name for name in ("warmup_steps", "logging_steps", "save_steps", "eval_steps")
                     if 0 < float(getattr(self, name) or 0) < 1]
        epochs = [f"{what}_strategy" for what in ("eval", "save") if _text(getattr(self, f"{what}_strategy")) == "epoch"]
        if self.packing and self.max_steps <= 0 and fractions + epochs:
            self.notes.append(f"packing=True: {', '.join(fractions + epochs)} count steps of the unpacked rows (lmrl packs "
                              f"them after the config is made); the run's length counts packed sequences, as TRL's")


@dataclass
class RewardConfig(_OfflineArgs, trl.RewardConfig):
    """TRL's RewardConfig (lmrl.trl.fields says what each field does here)."""

    kind, trainer = "reward", "reward"


# the carried fields the translation above reads (tests/test_trl_fields.py checks the table against it):
# _LmrlArgs's, _SampledArgs's, and each class's own
_SAMPLED = {"num_generations", "max_completion_length", "temperature", "top_p", "top_k", "beta", "num_iterations",
            "epsilon", "epsilon_high", "mask_truncated_completions", "reward_weights", "use_vllm",
            "vllm_gpu_memory_utilization", "vllm_max_model_length", "log_completions", "num_completions_to_print",
            "chat_template_kwargs", "steps_per_generation", "generation_batch_size", "min_p", "repetition_penalty",
            "generation_kwargs", "shuffle_dataset"}
TRANSLATED = {
    "common": {"output_dir", "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs",
               "max_steps", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "weight_decay",
               "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "optim", "bf16", "gradient_checkpointing",
               "activation_checkpointing", "use_cpu", "seed", "logging_steps", "eval_strategy", "eval_steps",
               "save_strategy", "save_steps", "save_total_limit", "report_to", "run_name", "disable_tqdm",
               "per_device_eval_batch_size", "metric_for_best_model", "greater_is_better", "fsdp",
               "model_init_kwargs", "disable_dropout", "resume_from_checkpoint"},
    "grpo": _SAMPLED | {"scale_rewards", "loss_type", "entropy_coef", "max_tool_calling_iterations",
                        "importance_sampling_level", "delta", "top_entropy_quantile", "off_policy_mask_threshold",
                        "use_bias_correction_kl"},
    "rloo": _SAMPLED | {"normalize_advantages", "reward_clip_range"},
    "dpo": {"beta", "loss_type", "label_smoothing", "max_length"},
    "sft": {"max_length", "assistant_only_loss", "completion_only_loss", "dataset_text_field", "truncation_mode",
            "packing", "packing_strategy", "padding_free", "loss_type", "neftune_noise_alpha", "label_smoothing_factor"},
    "reward": {"max_length"},
}
