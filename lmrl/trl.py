"""TRL's trainer calls, unchanged but for the import: a script written for TRL's `GRPOTrainer` or
`DPOTrainer` runs on lmrl when `from trl import ...` becomes `from lmrl.trl import ...`.

    from lmrl.trl import GRPOConfig, GRPOTrainer          # was: from trl import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) for c in completions]

    args = GRPOConfig(output_dir="runs/grpo", learning_rate=1e-5, num_generations=4, max_steps=50)
    trainer = GRPOTrainer(model="path/to/model", reward_funcs=reward_len, args=args, train_dataset=dataset)
    trainer.train()

`GRPOConfig(**kwargs)` / `DPOConfig(**kwargs)` take TRL's argument names and start from TRL's own
defaults (TRL 1.16's: learning rate 1e-6, linear decay to 0, no weight decay, Adam betas
(0.9, 0.999), seed 42, ...), so a script that leaves an argument out gets what TRL would use. The
trainer turns them into an lmrl `Config` (`args.to_config(...)`) once it knows the model and the
data: each name through lmrl's table of TRL's names (`lmrl.config.TRL_ALIASES`, the same as in YAML),
plus the ones that need the data or several values at once:

- the batch: TRL's `per_device_train_batch_size` x `gradient_accumulation_steps` x processes is one
  optimizer step's completions (GRPO: `train.rollout_size`, `train.ga_steps` micro-batches; DPO:
  `data.batch_size` pairs);
- the length: `max_steps`, else `num_train_epochs` passes over the data set (GRPO: each prompt
  sampled `num_generations` times per pass);
- `lr_scheduler_type` linear / cosine / constant(_with_warmup), decaying to 0 as TRL's do;
  `adam_beta1` / `adam_beta2`; `bf16` (`run.mixed_precision`); `use_cpu`; `report_to` (wandb, tensorboard); `use_vllm`;
  `gradient_checkpointing`; `eval_strategy` "no" (evaluation at the start and the end only);
- `peft_config` (a `peft.LoraConfig`): its rank, alpha, dropout and target modules.

Names that change nothing in lmrl (logging and saving strategies, hub settings, data-loader workers,
...) are accepted and listed once in the run's log; any other name is refused with the nearest
lmrl or TRL name, as a typo in YAML is. The model is a path (a local directory, a .gguf file, or a
packaged name such as smollm2-135m-instruct) or a loaded transformers model with its tokenizer as
`processing_class`; data sets are `datasets.Dataset`s or lists of dicts in TRL's formats."""

from __future__ import annotations

import math
import os
from typing import Any

from .config import Config, config_from_dict
from .errors import ConfigError
from .train.dpo_trainer import DPOTrainer as _LmrlDPOTrainer
from .train.trainers import GRPOTrainer as _LmrlGRPOTrainer

# TRL 1.16's defaults for the arguments lmrl maps (the rest of lmrl's defaults already equal TRL's).
TRL_DEFAULTS = {
    "common": {"learning_rate": 1e-6, "lr_scheduler_type": "linear", "warmup_steps": 0, "weight_decay": 0.0,
               "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0, "seed": 42,
               "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_train_epochs": 3.0,
               "max_steps": -1, "logging_steps": 10, "save_steps": 500, "eval_strategy": "no"},
    "grpo": {"num_generations": 8, "max_completion_length": 512, "beta": 0.0, "loss_type": "dapo",
             "scale_rewards": "group", "epsilon": 0.2, "temperature": 1.0, "disable_dropout": False},
    "dpo": {"beta": 0.1, "loss_type": "sigmoid", "max_length": 1024},
}
# TrainingArguments / GRPOConfig / DPOConfig names that change nothing in how lmrl trains.
NO_EFFECT = {"logging_strategy", "save_strategy", "logging_first_step", "logging_dir", "run_name", "push_to_hub",
             "hub_model_id", "hub_strategy", "hub_token", "dataloader_num_workers", "dataloader_pin_memory",
             "remove_unused_columns", "overwrite_output_dir", "do_train", "do_eval", "log_completions",
             "num_completions_to_print", "disable_tqdm", "log_level", "save_only_model", "ddp_find_unused_parameters",
             "model_init_kwargs", "dataset_num_proc", "padding_value", "report_to_hub", "eval_on_start"}
_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}


class TRLArgs:
    """TRL's arguments for one trainer, kept as given until the trainer knows its model and data."""

    kind = ""

    def __init__(self, output_dir: str | None = None, **kwargs: Any):
        self.output_dir = output_dir or f"runs/trl-{self.kind}"
        self.kwargs = kwargs

    def __getattr__(self, name: str):
        values = {**TRL_DEFAULTS["common"], **TRL_DEFAULTS[self.kind], **self.__dict__.get("kwargs", {})}
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no argument {name!r}")

    def to_config(self, *, model_path: str, train_rows: int, peft_config=None) -> Config:
        """The lmrl Config these arguments describe, for a model at `model_path` and a training set of
        `train_rows` rows (handed to the trainer as a data set)."""
        given = {**TRL_DEFAULTS["common"], **TRL_DEFAULTS[self.kind], **self.kwargs}
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ga = int(given.pop("gradient_accumulation_steps"))
        batch = int(given.pop("per_device_train_batch_size")) * ga * world
        max_steps, epochs = int(given.pop("max_steps")), float(given.pop("num_train_epochs"))
        schedule = given.pop("lr_scheduler_type")
        if schedule not in _SCHEDULES:
            raise ConfigError(f"lr_scheduler_type={schedule!r} is not one of {', '.join(_SCHEDULES)}")
        data: dict[str, dict] = {
            "run": {"dir": self.output_dir, "seed": given.pop("seed")},
            "model": {"type": "hf", "path": model_path},
            "optim": {"betas": [given.pop("adam_beta1"), given.pop("adam_beta2")]},
            "schedule": {"name": _SCHEDULES[schedule], "min_lr_ratio": 0.0},
            "train": {"ga_steps": ga},
        }
        if given.pop("bf16", None):  # transformers' "bf16 (mixed) precision": autocast over fp32 weights
            data["run"]["mixed_precision"] = "bf16"
        if given.pop("use_cpu", None):
            data["run"]["device"] = "cpu"
        if given.pop("gradient_checkpointing", None):
            data["model"]["gradient_checkpointing"] = True
        report = given.pop("report_to", None) or []
        report = [report] if isinstance(report, str) else list(report)
        data["run"].update(wandb="wandb" in report or "all" in report,
                           tensorboard="tensorboard" in report or "all" in report)
        if given.pop("use_vllm", None):
            data["rollout"] = {"engine": "vllm"}
        if given.pop("eval_strategy") in ("no", None):
            given.pop("eval_steps", None)
            data["train"]["eval_every"] = 10**9  # evaluated at the start and the end only
        if peft_config is not None:
            targets = peft_config.target_modules
            data["lora"] = {"r": peft_config.r, "alpha": float(peft_config.lora_alpha),
                            "dropout": float(peft_config.lora_dropout),
                            "target_modules": ["all-linear"] if targets in (None, "all-linear") else
                            [targets] if isinstance(targets, str) else sorted(targets)}
        self.ignored = sorted(k for k in given if k in NO_EFFECT)
        section = "algo" if self.kind == "grpo" else "dpo"
        names = {k: v for k, v in given.items() if k not in NO_EFFECT}
        self._shape(data, names, batch=batch, max_steps=max_steps, epochs=epochs, train_rows=train_rows, world=world)
        data[section] = {**data.get(section, {}), **names}  # TRL's names, translated by lmrl's alias table
        return config_from_dict(data, where=f"{type(self).__name__}(...)")

    def _shape(self, data: dict, names: dict, **sizes) -> None:
        raise NotImplementedError


class GRPOConfig(TRLArgs):
    """TRL's GRPOConfig arguments (see the module docstring for how each reaches lmrl)."""

    kind = "grpo"

    def _shape(self, data, names, *, batch, max_steps, epochs, train_rows, world):
        group = int(names["num_generations"])
        iterations = names.pop("max_tool_calling_iterations", None)
        if iterations is not None:  # tool calls answered, then the turn that answers: one turn more
            data.setdefault("env", {})["max_turns"] = int(iterations) + 1
        if batch % group:
            raise ConfigError(f"per_device_train_batch_size x gradient_accumulation_steps x {world} process(es) = "
                              f"{batch} completions per step must be a multiple of num_generations={group}")
        steps = max_steps if max_steps > 0 else math.ceil(epochs * train_rows * group / batch)
        data["run"]["trainer"] = "rl"
        data["algo"] = {"name": "grpo"}
        data["task"] = {**data.get("task", {}), "name": "prompts", "chat": False}
        data["sft"] = {"steps": 0}
        data["train"].update(rollout_size=batch, steps=steps)


class DPOConfig(TRLArgs):
    """TRL's DPOConfig arguments (see the module docstring for how each reaches lmrl)."""

    kind = "dpo"

    def _shape(self, data, names, *, batch, max_steps, epochs, train_rows, world):
        data["run"]["trainer"] = "dpo"
        data["data"] = {**data.get("data", {}), "batch_size": batch, "epochs": epochs}
        data["train"]["max_steps"] = max(max_steps, 0)


def _model_path_and_policy(model, processing_class, peft_config):
    """(model path for the config, a ready lmrl policy or None). A path is loaded by the trainer; a
    loaded transformers model is wrapped with its tokenizer (and a LoRA adapter from peft_config)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model), None
    from .models.hf import HFPolicy

    if processing_class is None:
        raise ValueError("a loaded model needs its tokenizer: pass processing_class=tokenizer")
    policy = model if isinstance(model, HFPolicy) else HFPolicy(model, processing_class)
    if peft_config is not None:
        from .models.lora import add_lora

        targets = peft_config.target_modules
        add_lora(policy, r=peft_config.r, alpha=peft_config.lora_alpha, dropout=peft_config.lora_dropout,
                 target_modules="all-linear" if targets in (None, "all-linear") else targets)
    return str(policy.hf_model.config.name_or_path), policy


def _translate(args: TRLArgs, model, processing_class, peft_config, train_dataset, rows: str):
    """(args, the lmrl Config they describe, a ready policy or None) for a TRL-style trainer."""
    if train_dataset is None:
        raise ValueError(f"{type(args).__name__[:-6]}Trainer needs train_dataset= ({rows})")
    path, policy = _model_path_and_policy(model, processing_class, peft_config)
    size = len(train_dataset) if hasattr(train_dataset, "__len__") else sum(1 for _ in train_dataset)
    config = args.to_config(model_path=path, train_rows=size, peft_config=peft_config if policy is None else None)
    return args, config, policy


def _note_ignored(trainer) -> None:
    if trainer.args.ignored:
        trainer.info(f"TRL arguments that change nothing here: {', '.join(trainer.args.ignored)}")


class GRPOTrainer(_LmrlGRPOTrainer):
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
    ..., peft_config, tools, environment_factory)` on lmrl's GRPO (`lmrl.train.trainers.GRPOTrainer`).
    Prompts are TRL's: a text `prompt` is used as it is, a conversational one goes through the chat
    template; every other column reaches the reward functions. `tools=` and `environment_factory=`
    answer each prompt over several turns with tool calls, as TRL does (`lmrl.tasks.tool_task`;
    `max_tool_calling_iterations` bounds the turns). Without eval_dataset the first `eval.size` (1000)
    training prompts are evaluated (greedy, scored by the reward functions) at the start and the end."""

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), peft_config=None, tools=None, environment_factory=None):
        if optimizers != (None, None) or reward_processing_classes is not None:
            raise ValueError("optimizers= and reward_processing_classes= are not supported: lmrl builds AdamW from "
                             "the args, and reward models come through reward.model")
        if reward_funcs is None and environment_factory is None:
            raise ValueError("no reward source: pass reward_funcs=, or an environment_factory whose class defines "
                             "get_reward()")
        args = args or GRPOConfig()
        if train_dataset is None and environment_factory is not None:
            train_dataset = _environment_prompts(args)
        self.args, config, policy = _translate(args, model, processing_class, peft_config, train_dataset,
                                               "the prompts to sample from")
        super().__init__(config, model=policy, reward_funcs=reward_funcs, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, callbacks=callbacks, tools=tools,
                         environment_factory=environment_factory)
        _note_ignored(self)


def _environment_prompts(args: GRPOConfig) -> list[dict]:
    """The prompts of an environment that owns its data (TRL: no train_dataset, the environment's `reset()`
    text is the prompt): empty user turns, as many as one step's completions."""
    if int(args.max_steps) <= 0:
        raise ValueError("an environment_factory without train_dataset= needs max_steps= in the GRPOConfig (TRL's "
                         "rule: the environment's reset() makes each prompt, so there is no data set to count)")
    rows = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(max(rows, 1))]


class DPOTrainer(_LmrlDPOTrainer):
    """TRL's `DPOTrainer(model, ref_model, args, data_collator, train_dataset, eval_dataset,
    processing_class, ..., peft_config)` on lmrl's DPO (`lmrl.train.dpo_trainer.DPOTrainer`), rows in
    any of TRL's preference formats (explicit or implicit prompt, text or conversational)."""

    def __init__(self, model, ref_model=None, args: DPOConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None):
        if data_collator is not None or optimizers != (None, None):
            raise ValueError("data_collator= and optimizers= are not supported: lmrl batches pairs itself and "
                             "builds AdamW from the args")
        self.args, config, policy = _translate(args or DPOConfig(), model, processing_class, peft_config,
                                               train_dataset, "preference pairs")
        if ref_model is not None and not isinstance(ref_model, (str, os.PathLike)):
            from .models.hf import HFPolicy

            ref_model = ref_model if isinstance(ref_model, HFPolicy) else HFPolicy(ref_model, processing_class)
            ref_model.eval().requires_grad_(False)
        elif ref_model is not None:
            raise ValueError("ref_model= takes a loaded model (the default: the policy as training starts)")
        super().__init__(config, model=policy, tokenizer=processing_class if policy is not None else None,
                         reference=ref_model, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         callbacks=callbacks)
        _note_ignored(self)
