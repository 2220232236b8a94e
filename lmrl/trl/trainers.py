"""TRL's trainers on lmrl's: `GRPOTrainer`, `RLOOTrainer`, `DPOTrainer`, `SFTTrainer`, `RewardTrainer`
take TRL's arguments and show the surface of a `transformers.Trainer` that TRL's scripts and users' code
touch, over an lmrl trainer built from the translated config (`trainer.config`, `trainer.task`, ... reach it):

- `train(resume_from_checkpoint=None | True | path) -> TrainOutput`; a new run never overwrites an
  output_dir that holds one (True continues it, a path continues from that checkpoint; transformers'
  output_dir/checkpoint-N is lmrl's output_dir/checkpoints/step_N);
- `state`: a `transformers.TrainerState` (`global_step`, `max_steps`, `epoch`, `log_history` with TRL's
  metric names and `eval_*` for evaluations, `best_metric`, `best_model_checkpoint`);
- `transformers.TrainerCallback`s, called with `(args, state, control)` at `on_init_end`,
  `on_train_begin`, `on_epoch_begin`, `on_step_begin`, `on_step_end`, `on_log`, `on_evaluate`, `on_save`,
  `on_epoch_end` and `on_train_end` (`control.should_training_stop` ends the run after the step,
  `control.should_save` writes a checkpoint; `on_save` follows the checkpoints transformers would
  write); lmrl's own `Callback`s go to the lmrl trainer;
- `evaluate()` (`eval_*` names; with eval_dataset={"a": ..., "b": ...} (SFT, DPO, reward model) one entry
  per set, `eval_a_loss`, ...), `save_model(dir)` (a directory `from_pretrained` loads, a PEFT
  adapter for LoRA, with the tokenizer), `push_to_hub()` (uploads output_dir; a one-line error
  without network), `log(logs)`, `accelerator.print`, `is_world_process_zero()`, `end()`;
- `processing_class` is the tokenizer used (also when the model is a path); `quantization_config`
  is refused with the reason (lmrl loads models in bfloat16 or float32).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_utils import TrainOutput

from ..common.errors import ConfigError
from ..train.callbacks import Callback
from ..train.dpo_trainer import DPOTrainer as _LmrlDPOTrainer
from ..train.offline import held_out_set
from ..train.reward_trainer import RewardTrainer as _LmrlRewardTrainer
from ..train.run_dir import holds_a_run
from ..train.sft_trainer import SFTTrainer as _LmrlSFTTrainer
from ..train.trainers import GRPOTrainer as _LmrlGRPOTrainer
from ..train.trainers import RLOOTrainer as _LmrlRLOOTrainer
from .configs import DPOConfig, GRPOConfig, RewardConfig, RLOOConfig, SFTConfig, _text

_PREFIXES = ("train/", "sft/", "dpo/", "rm/")  # lmrl's per-trainer prefixes; TRL's names have none
_HF_NAMES = {"lr": "learning_rate"}


def trl_logs(metrics: dict) -> dict:
    """One step's lmrl metrics under TRL's names: evaluation metrics as `eval_<name>`, a trainer's own
    prefix dropped (`dpo/loss` -> `loss`, `train/lr` -> `learning_rate`); names TRL's already are stay."""
    logs: dict = {}
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key.startswith("eval/"):
            logs[f"eval_{key[5:]}"] = value
        elif not key.startswith(_PREFIXES):
            logs[key] = value
    for key, value in metrics.items():
        prefix = next((p for p in _PREFIXES if key.startswith(p)), None)
        if prefix is not None and isinstance(value, (int, float)):
            name = key[len(prefix):]
            logs.setdefault(_HF_NAMES.get(name, name), value)
    return logs


class _Accelerator:
    """What TRL's scripts use of `trainer.accelerator`."""

    def __init__(self, dist, device):
        self.is_main_process = dist.is_main
        self.num_processes = dist.world_size
        self.process_index = dist.rank
        self.device = device

    def print(self, *args, **kwargs) -> None:
        if self.is_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()


class _Bridge(Callback):
    """lmrl's hooks, turned into the TRL trainer's state, log history and TrainerCallback events."""

    def __init__(self, outer):
        self.outer = outer

    def on_update_end(self, trainer, step) -> None:
        self.outer._update_end(step)

    def on_step_end(self, trainer, step, metrics) -> None:
        self.outer._step_end(step, metrics)

    def on_checkpoint(self, trainer, path) -> None:
        self.outer._saved(path)


class _TRLTrainer:
    """The transformers-Trainer surface over an lmrl trainer (`self.inner`); see the module docstring."""

    kind = ""

    def __init__(self, inner, args, *, processing_class, callbacks, train_rows: int):
        self.inner, self.args = inner, args
        if processing_class is None:  # the run's tokenizer: an offline trainer's own, GRPO's policy's
            own = getattr(inner, "tokenizer", None)
            processing_class = own if own is not None else getattr(inner.model, "tokenizer", None)
        self.processing_class = processing_class
        self.train_rows = train_rows
        self.callbacks: list[TrainerCallback] = []
        self._save_asked = False  # the checkpoint being written is one control.should_save asked for
        for cb in callbacks:
            self.add_callback(cb)
        inner.callbacks.callbacks.append(_Bridge(self))
        self.accelerator = _Accelerator(inner.dist, inner.device)
        self.control = TrainerControl()
        self.state = TrainerState(is_local_process_zero=inner.dist.is_main, is_world_process_zero=inner.dist.is_main)
        self.state.max_steps = inner.total_steps
        self.state.num_train_epochs = math.ceil(self.state.max_steps / max(self._steps_per_epoch(), 1e-9))
        self.state.logging_steps, self.state.save_steps = inner.config.train.log_every, inner.config.train.ckpt_every
        self.state.eval_steps = inner.config.train.eval_every
        self.state.train_batch_size = int(args.per_device_train_batch_size)
        self._check_best_metric()
        inner.data_notes.extend(args.notes)
        if args.ignored:
            inner.data_notes.append(f"TRL arguments that change nothing here: {', '.join(args.ignored)}")
        self._event("on_init_end")

    def __getattr__(self, name):  # the lmrl trainer's attributes: config, task, run_dir, ...
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        from transformers import Trainer

        if hasattr(Trainer, name):  # an HF Trainer method not provided here: never lmrl's same-named one
            raise AttributeError(f"{type(self).__name__}.{name}: transformers.Trainer's {name} is not supported by "
                                 f"lmrl.trl (the lmrl trainer is trainer.inner)")
        return getattr(inner, name)

    # -- what TRL's trainers expose --------------------------------------------------------------------
    @property
    def model(self):
        """The transformers model being trained (a peft model with LoRA)."""
        policy = self.inner.model
        return getattr(policy, "model", policy)

    @property
    def tokenizer(self):
        """transformers' older name for processing_class."""
        return self.processing_class

    @property
    def hub_model_id(self) -> str:
        return self.args.hub_model_id or Path(self.args.output_dir).name

    def add_callback(self, callback) -> None:
        """A `transformers.TrainerCallback` (class or instance) or an lmrl `Callback`."""
        callback = callback() if isinstance(callback, type) else callback
        if isinstance(callback, TrainerCallback):
            self.callbacks.append(callback)
        else:
            self.inner.callbacks.callbacks.append(callback)

    def remove_callback(self, callback) -> None:
        """Removes a TrainerCallback given as an instance or its class (the first of that class)."""
        self.pop_callback(callback)

    def pop_callback(self, callback):
        """Removes and returns a TrainerCallback given as an instance or its class (None where none is)."""
        for cb in self.callbacks:
            if cb is callback or (isinstance(callback, type) and type(cb) is callback):
                self.callbacks.remove(cb)
                return cb
        return None

    def is_world_process_zero(self) -> bool:
        return self.inner.dist.is_main

    def is_local_process_zero(self) -> bool:
        return self.inner.dist.is_main

    @property
    def lr_scheduler(self):
        """The LR schedule of the stage being trained (None outside train(): lmrl's trainer drops it at the end)."""
        return self.inner.scheduler

    def log_metrics(self, split: str, metrics: dict) -> None:
        """transformers' Trainer.log_metrics: prints `metrics` as a table (main process only)."""
        if not self.is_world_process_zero():
            return
        print(f"***** {split} metrics *****")
        width = max((len(k) for k in metrics), default=0)
        for key in sorted(metrics):
            print(f"  {key: <{width}} = {metrics[key]}")

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """transformers' Trainer.save_metrics: output_dir/<split>_results.json and, combined, all_results.json."""
        if not self.is_world_process_zero():
            return
        import json

        out = Path(self.args.output_dir)
        (out / f"{split}_results.json").write_text(json.dumps(metrics, indent=4, sort_keys=True))
        if combined:
            path = out / "all_results.json"
            everything = json.loads(path.read_text()) if path.is_file() else {}
            everything.update(metrics)
            path.write_text(json.dumps(everything, indent=4, sort_keys=True))

    def save_state(self) -> None:
        """transformers' Trainer.save_state: the TrainerState as output_dir/trainer_state.json."""
        if self.is_world_process_zero():
            self.state.save_to_json(str(Path(self.args.output_dir) / "trainer_state.json"))

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, **kwargs) -> None:
        """A minimal model card (output_dir/README.md): the model, its base, the data set and how it was trained."""
        if not self.is_world_process_zero():
            return
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        name = model_name or Path(self.args.output_dir).name
        lines = ["---", f"base_model: {self.inner.config.model.path}", "library_name: transformers",
                 f"tags: [{', '.join(['lmrl', 'trl', self.kind, *tags])}]", "---", "", f"# {name}", "",
                 f"Trained with lmrl's {type(self).__name__} (TRL's API) from {self.inner.config.model.path}"
                 + (f" on {dataset_name}" if dataset_name else "") + "."]
        (Path(self.args.output_dir) / "README.md").write_text("\n".join(lines) + "\n")

    def get_train_dataloader(self):
        raise NotImplementedError(f"{type(self).__name__}.get_train_dataloader(): lmrl batches the rows itself and "
                                  f"has no torch DataLoader; the rows are trainer.inner's")

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test"):
        raise NotImplementedError(f"{type(self).__name__}.predict(): not supported by lmrl.trl; use evaluate() for "
                                  f"metrics, or generate with trainer.model")

    def train(self, resume_from_checkpoint: bool | str | None = None, trial=None, ignore_keys_for_eval=None,
              **kwargs) -> TrainOutput:
        if trial is not None or kwargs:
            raise TypeError(f"train() takes resume_from_checkpoint only here (got {['trial'] * (trial is not None) + list(kwargs)})")
        self._resume_setting(resume_from_checkpoint)
        start = time.perf_counter()
        self._event("on_train_begin")
        self._event("on_epoch_begin")
        self._event("on_step_begin")
        summary = self.inner.train()
        self._event("on_epoch_end")
        runtime = time.perf_counter() - start
        losses = [e["loss"] for e in self.state.log_history if "loss" in e]
        steps = max(self.state.global_step, 1)
        metrics = {"train_runtime": round(runtime, 4),
                   "train_samples_per_second": round(steps * self._rows_per_step() / max(runtime, 1e-9), 3),
                   "train_steps_per_second": round(steps / max(runtime, 1e-9), 3), "total_flos": 0.0,
                   "train_loss": sum(losses) / len(losses) if losses else float("nan"), "epoch": self.state.epoch}
        self.log(metrics)  # transformers' last log: the run's totals, through on_log
        self._best(summary)
        self._event("on_train_end")
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """The held-out evaluation of the model as it is now, under `eval_*` names: with several held-out
        sets, one log entry and on_evaluate per set, the returned dict holding them all (see `_eval_entries`)."""
        if eval_dataset is not None:
            raise ValueError("evaluate(eval_dataset=) is not supported: pass eval_dataset= to the trainer")
        with torch.no_grad():
            metrics = self.inner.evaluate()
        out = {}
        for entry in self._eval_entries(metrics, metric_key_prefix):
            self.log(entry)
            self._event("on_evaluate", metrics=entry)
            out.update(entry)
        return out

    def log(self, logs: dict, start_time: float | None = None) -> None:
        entry = {**logs, "epoch": self.state.epoch, "step": self.state.global_step}
        self.state.log_history.append(entry)
        self._event("on_log", logs=entry)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Writes what transformers' Trainer.save_model writes to `output_dir` (default: args.output_dir): the
        model `from_pretrained` loads (with LoRA its PEFT adapter, adapter_config.json + adapter_model.safetensors;
        a reward model's trained score head among the adapter's modules_to_save, as peft saves a SEQ_CLS
        adapter), the tokenizer, and the arguments as training_args.bin. A LoRA reward model loads back as
        TRL's does: `AutoModelForSequenceClassification.from_pretrained(output_dir, num_labels=1)`, as a
        GRPOTrainer reward_funcs path, or as lmrl's `reward.model` (`load_reward_model`)."""
        if not self.inner.dist.is_main:
            return
        if getattr(self.inner, "fsdp", False):
            raise NotImplementedError("save_model under FSDP: the run exports its best model itself "
                                      f"({self.inner.run_dir}/model)")
        out = Path(output_dir or self.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out))
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(str(out))
        torch.save(self.args, out / "training_args.bin")

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, **kwargs) -> str:
        """Uploads args.output_dir (save_model's output) to the Hub repo `hub_model_id`."""
        try:
            from huggingface_hub import HfApi

            api = HfApi(token=token or self.args.hub_token)
            api.create_repo(self.hub_model_id, exist_ok=True, private=self.args.hub_private_repo)
            return str(api.upload_folder(repo_id=self.hub_model_id, folder_path=self.args.output_dir,
                                         commit_message=commit_message or "End of training", revision=revision))
        except Exception as e:  # offline, no token, no such repo: one line, nothing lost
            raise RuntimeError(f"push_to_hub({self.hub_model_id!r}) failed: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}. The model stays in "
                               f"{self.args.output_dir}; upload it later with `hf upload`") from None

    def end(self) -> None:
        """transformers' end of training (trackers and process group): lmrl's run closes its own."""

    # -- bridging ------------------------------------------------------------------------------------
    def _event(self, name: str, **kwargs) -> None:
        for cb in self.callbacks:
            getattr(cb, name)(self.args, self.state, self.control, model=self.model,
                              processing_class=self.processing_class, **kwargs)

    def _update_end(self, step: int) -> None:
        """transformers' `on_step_end`: after the optimizer step, before its evaluation and logs."""
        self.state.global_step = step
        self.state.epoch = step / max(self._steps_per_epoch(), 1e-9)
        self._event("on_step_end")

    def _step_end(self, step: int, metrics: dict) -> None:
        """The step's logs and evaluation as TRL reports them, then what the callbacks asked for."""
        every = self.inner.config.train.log_every
        evaluated = any(k.startswith("eval/") for k in metrics)
        if step % every == 0 or step == 1 or step == self.state.max_steps or evaluated:
            self.log({k: v for k, v in trl_logs(metrics).items() if not k.startswith("eval_")})
            for entry in self._eval_entries(metrics) if evaluated else ():
                self.log(entry)
                self._event("on_evaluate", metrics=entry)
        if self.control.should_save:
            self._save_asked = True
            self.inner.save_checkpoint()
        if self.control.should_training_stop and step < self.state.max_steps:
            self.inner.state["stopped_early"] = True
            self.inner.info(f"a callback stopped training at step {step} (control.should_training_stop)")
        self.control = TrainerControl(should_training_stop=self.control.should_training_stop)
        if step < self.state.max_steps and not self.control.should_training_stop:
            self._event("on_step_begin")

    def _eval_entries(self, metrics: dict, prefix: str = "eval") -> list[dict]:
        """One evaluation's lmrl metrics (eval/...) as transformers logs them, `prefix`_<name>: one entry for
        a single held-out set; with several (eval_dataset={"a": ..., "b": ...}), one per set in the dict's
        order, each metric as <prefix>_<set>_<name> (transformers' names for a set) and, all but the loss, also
        as <prefix>_<name>, as TRL's trainers log their own metrics beside <prefix>_<set>_loss (so the
        returned dict of evaluate() holds the last set's under those names, as TRL's does)."""
        values = {k[5:]: v for k, v in metrics.items()
                  if k.startswith("eval/") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        values.update(self._eval_extras())
        sets = self._eval_sets()
        if not sets:
            return [{f"{prefix}_{k}": v for k, v in values.items()}]
        entries = []
        for name in sets:
            own = {k[len(name) + 1:]: v for k, v in values.items() if held_out_set(k, sets) == name}
            entries.append({**{f"{prefix}_{name}_{k}": v for k, v in own.items()},
                            **{f"{prefix}_{k}": v for k, v in own.items() if k != "loss"}})
        return entries

    def _eval_extras(self) -> dict:
        """What TRL logs with an evaluation that the lmrl trainer's evaluation does not report (bare names)."""
        return {}

    def _eval_sets(self) -> list[str]:
        """The names of the held-out sets, where eval_dataset was a dict of them; [] for one set."""
        return [name for name in getattr(self.inner, "eval_sets", {}) if name]

    def _saved(self, path: Path) -> None:
        """transformers' on_save, after the checkpoints transformers writes: one a callback asked for
        (control.should_save), and with save_strategy steps (or epoch) every save_steps and the last step.
        lmrl's other checkpoints (save_strategy no's last step, the last step of a run stopped between saves,
        Ctrl-C's) are its resume points, which no callback hears of."""
        asked, self._save_asked = self._save_asked, False
        step, every = self.state.global_step, max(int(self.state.save_steps), 1)
        due = _text(self.args.save_strategy) != "no" and (step % every == 0 or step >= self.state.max_steps)
        if asked or due:
            self._event("on_save")

    def _best(self, summary: dict) -> None:
        best = self.inner.state.get("best", {})
        if best.get("value") is not None:
            self.state.best_metric = best["value"]
            self.state.best_global_step = best["step"]
            self.state.best_model_checkpoint = str(self.inner.ckpt_dir / "best")

    def _resume_setting(self, resume) -> None:
        run = self.inner.config.run
        if resume in (None, False):
            if self._held_a_run:
                latest = _latest_step(Path(run.dir))
                script = f" (a script: --resume_from_checkpoint {latest})" if latest else ""
                raise ConfigError(f"output_dir {run.dir} already holds a run: train(resume_from_checkpoint=True) "
                                  f"continues it{script}; another output_dir starts afresh (lmrl never overwrites "
                                  f"a run)")
            run.resume = "never"
            return
        if not self._held_a_run:
            raise ValueError(f"resume_from_checkpoint={resume!r}: no run to continue in output_dir {run.dir}")
        run.resume = "auto"
        if not isinstance(resume, bool):
            run.resume_from = str(_as_lmrl_checkpoint(resume, Path(run.dir)))

    def _steps_per_epoch(self) -> float:
        return self.train_rows / max(self._rows_per_step(), 1)

    def _eval_names(self) -> set[str] | None:
        """The names evaluate() reports (lmrl's eval/...), where the trainer alone says which; None: unknown
        until an evaluation runs (lmrl's trainer checks train.best_metric then)."""
        return None

    def _check_best_metric(self) -> None:
        """metric_for_best_model, TRL's name or lmrl's, checked as the trainer is built rather than at the
        first evaluation."""
        known, metric = self._eval_names(), self.inner.config.train.best_metric
        sets = self._eval_sets()
        if known is not None and sets:  # several held-out sets: each set's names
            known = {f"eval/{name}_{k[5:]}" for name in sets for k in known}
        if self.args.metric_for_best_model and known is not None and metric not in known:
            names = ", ".join(sorted(f"eval_{k[5:]}" for k in known))
            raise ConfigError(f"metric_for_best_model={self.args.metric_for_best_model!r} is not an evaluation "
                              f"metric of this {type(self).__name__}: it reports {names}")

    def _rows_per_step(self) -> int:
        world = self.inner.dist.world_size
        return int(self.args.per_device_train_batch_size) * int(self.args.gradient_accumulation_steps) * world


def _prepare(args, model, processing_class, peft_config, quantization_config, train_dataset, rows: str, kind: str):
    """(lmrl config, ready policy or None, whether output_dir already held a run, training rows)."""
    if quantization_config is not None:
        raise ValueError("quantization_config= is not supported: lmrl loads models in bfloat16 or float32 "
                         "(bitsandbytes' 4- and 8-bit kernels need a CUDA GPU and are not wired in)")
    if train_dataset is None:
        raise ValueError(f"{kind}Trainer needs train_dataset= ({rows})")
    if not hasattr(train_dataset, "__len__") and int(args.max_steps) <= 0:
        raise ValueError(f"train_dataset is a {type(train_dataset).__name__} without a length (streaming): set "
                         f"max_steps in the {type(args).__name__}, as transformers asks (num_train_epochs alone "
                         f"cannot size the run)")
    size = len(train_dataset) if hasattr(train_dataset, "__len__") else sum(1 for _ in train_dataset)
    path = str(model) if isinstance(model, (str, os.PathLike)) else str(model.config.name_or_path)
    loaded = not isinstance(model, (str, os.PathLike))
    config = args.to_config(model_path=path, train_rows=size, peft_config=None if loaded else peft_config)
    if kind not in ("GRPO", "RLOO") and size:  # TRL: conversations through the chat template, text rows as is
        config.data.chat = _conversational(_first_row(train_dataset))
    held = holds_a_run(Path(config.run.dir))
    _check_resume_path(args.resume_from_checkpoint, Path(config.run.dir))  # before any model loads
    if held:  # the trainer decides at train() whether this run continues it
        config.run.resume = "auto"
    policy = None
    if kind == "REWARD":
        if loaded:
            raise ValueError("RewardTrainer takes the model as a path (lmrl puts its own one-number head on the "
                             "model's trunk)")
    elif loaded or processing_class is not None:
        policy = _policy(model, processing_class, peft_config, config)
    return config, policy, held, size


def _latest_step(run_dir: Path) -> str:
    """The newest lmrl checkpoint of the run in `run_dir`, to name in an error ('' where none is)."""
    from ..checkpoint.directory import latest_checkpoint

    latest = latest_checkpoint(run_dir / "checkpoints")
    return str(latest) if latest is not None else ""


def _transformers_step(resume) -> int | None:
    """N for a path named as transformers names a checkpoint, checkpoint-N; else None."""
    name = Path(resume).name
    step = name.removeprefix("checkpoint-")
    return int(step) if name.startswith("checkpoint-") and step.isdigit() else None


def _as_lmrl_checkpoint(resume, run_dir: Path):
    """transformers' output_dir/checkpoint-N, which lmrl does not write, as lmrl's checkpoint of that step,
    output_dir/checkpoints/step_N, where that exists; any other value as it is."""
    if not isinstance(resume, (str, os.PathLike)) or Path(resume).exists():
        return resume
    step = _transformers_step(resume)
    ours = run_dir / "checkpoints" / f"step_{step}"
    same_run = Path(resume).parent.resolve() == run_dir.resolve()
    return str(ours) if step is not None and same_run and ours.is_dir() else resume


def _check_resume_path(resume, run_dir: Path) -> None:
    """A resume_from_checkpoint path that does not exist, refused in one line naming this run's newest
    checkpoint (transformers' output_dir/checkpoint-N is taken as lmrl's output_dir/checkpoints/step_N)."""
    if not isinstance(resume, (str, os.PathLike)) or str(resume).lower() in ("true", "false") or \
            Path(_as_lmrl_checkpoint(resume, run_dir)).exists():
        return
    if _transformers_step(resume) is not None:
        raise ConfigError(f"resume_from_checkpoint={str(resume)!r} does not exist, nor does lmrl's checkpoint of that "
                          f"step (output_dir/checkpoints/step_N); this run's newest is "
                          f"{_latest_step(run_dir) or 'none (nothing to resume)'}")
    raise ConfigError(f"resume_from_checkpoint={str(resume)!r} does not exist (lmrl's checkpoints are "
                      f"output_dir/checkpoints/step_N)")


def _first_row(dataset) -> dict:
    """A data set's first row: a map-style one's [0], a streaming (iterable) one's first yielded."""
    if isinstance(dataset, (list, tuple)) or (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        return dataset[0]
    return next(iter(dataset))


def _conversational(row: dict) -> bool:
    """TRL's test: a row whose text columns are message lists."""
    return any(isinstance(row.get(key), list) for key in ("messages", "conversations", "prompt", "chosen",
                                                           "completion"))


def _policy(model, processing_class, peft_config, config):
    """An lmrl policy over a loaded transformers model, or the model at config.model.path, with the
    given tokenizer and a LoRA adapter from peft_config."""
    from ..models import build_model
    from ..models.hf import HFPolicy
    from ..config.schema import LoraConfig as LoraSection
    from ..models.lora import add_lora, lora_config
    from .configs import lora_section

    if isinstance(model, (str, os.PathLike)):
        policy = build_model(config.model, lora=config.lora)  # the config's LoRA (from peft_config) included
        return HFPolicy(policy.model, processing_class)
    if processing_class is None and not isinstance(model, HFPolicy):
        processing_class = _saved_tokenizer(model)
    policy = model if isinstance(model, HFPolicy) else HFPolicy(model, processing_class)
    if peft_config is not None:  # the adapter to_config would describe, from the user's LoraConfig
        add_lora(policy, config=lora_config(LoraSection(**lora_section(peft_config, policy.model.config))))
    return policy


def _saved_tokenizer(model):
    """The tokenizer of a loaded model passed without processing_class: TRL's, loaded from the name in
    the model's config (a PeftModel's: its base model's)."""
    from transformers import AutoTokenizer

    where = getattr(model.config, "_name_or_path", "")
    try:
        return AutoTokenizer.from_pretrained(where)
    except Exception as e:
        raise ValueError(f"a loaded model needs its tokenizer: pass processing_class=tokenizer (none loads from "
                         f"the model's config name {where!r}: {type(e).__name__})") from None


def _split_callbacks(callbacks):
    """(transformers TrainerCallbacks, lmrl Callbacks)."""
    hf, own = [], []
    for cb in callbacks or []:
        (hf if isinstance(cb, TrainerCallback) or (isinstance(cb, type) and issubclass(cb, TrainerCallback))
         else own).append(cb)
    return hf, own


class GRPOTrainer(_TRLTrainer):
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ...,
    peft_config, tools, environment_factory)` on lmrl's GRPO. Prompts are TRL's: a text `prompt` is used
    as it is, a conversational one goes through the chat template; every other column reaches the
    reward functions. `tools=` and `environment_factory=` answer each prompt over several turns with
    tool calls (`lmrl.tasks.tool_task`; `max_tool_calling_iterations` bounds the turns)."""

    kind, lmrl_class, config_class = "grpo", _LmrlGRPOTrainer, GRPOConfig

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), peft_config=None, tools=None, environment_factory=None,
                 quantization_config=None, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(kwargs)}")
        if optimizers != (None, None) or reward_processing_classes is not None:
            raise ValueError("optimizers= and reward_processing_classes= are not supported: lmrl builds AdamW from "
                             "the args, and a reward model's own tokenizer comes with its path")
        if isinstance(environment_factory, dict):
            named = ", ".join(f"{name!r}: ..." for name in environment_factory)
            raise ValueError(f"environment_factory={{{named}}}: several environments picked by each row's "
                             f"'environment' column are not supported; pass one environment class (lmrl's tool task "
                             f"runs one kind of environment per trainer)")
        if reward_funcs is None and environment_factory is None:
            raise ValueError("no reward source: pass reward_funcs=, or an environment_factory whose class defines "
                             "get_reward()")
        if isinstance(eval_dataset, dict):
            named = ", ".join(f"{name!r}: ..." for name in eval_dataset)
            raise ValueError(f"eval_dataset={{{named}}}: several held-out sets are not supported by lmrl's "
                             f"{self.kind.upper()}, which evaluates one set of prompts; pass one data set "
                             f"(datasets.concatenate_datasets joins them)")
        args = args if args is not None else self.config_class(output_dir="trainer_output")
        _require(args, self.config_class)
        if train_dataset is None and environment_factory is not None:
            train_dataset = _environment_prompts(args)
        config, policy, held, rows = _prepare(args, model, processing_class, peft_config, quantization_config,
                                              train_dataset, "the prompts to sample from", self.kind.upper())
        hf_callbacks, own = _split_callbacks(callbacks)
        weights = None if args.reward_weights is None else [float(w) for w in args.reward_weights]
        reward_funcs, scorers = _reward_models(reward_funcs, train_dataset, config)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        inner = self.lmrl_class(config, model=policy, reward_funcs=reward_funcs, reward_weights=weights,
                                train_dataset=train_dataset, eval_dataset=eval_dataset, callbacks=own, tools=tools,
                                environment_factory=environment_factory)
        for scorer in scorers:
            scorer.to(inner.device)
        inner.eval_spread = True  # TRL's evaluation statistics: eval_reward_std, eval_completions/..., ...
        self._held_a_run = held
        super().__init__(inner, args, processing_class=processing_class, callbacks=hf_callbacks, train_rows=rows)


    def _steps_per_epoch(self) -> float:
        """RL steps per pass over the prompts: one RL step (a generation of train.rollout_size completions)
        samples rollout_size / num_generations prompts, so the epoch counts prompts, as TRL's does."""
        cfg = self.inner.config
        return self.train_rows / max(cfg.train.rollout_size / cfg.algo.group_size, 1e-9)

    def _eval_names(self) -> set[str] | None:
        from ..tasks.prompt_task import PromptTask
        from ..tasks.rewards import RewardFunctions
        from ..train.evaluate import SPREAD_METRICS, source_metric_names

        reward = getattr(self.inner.task, "reward", None)
        if type(self.inner.task) is not PromptTask or not isinstance(reward, RewardFunctions):
            return None
        return {"eval/accuracy", "eval/reward", "eval/length_mean", *(f"eval/{n}" for n in SPREAD_METRICS),
                *(f"eval/rewards/{n}/{s}" for n in reward.names for s in ("mean", "std")),
                *source_metric_names(self.inner.eval_sources)}

    def _eval_extras(self) -> dict:
        """TRL's eval_num_tokens: the training tokens so far."""
        return {"num_tokens": self.inner.state.get("num_input_tokens_seen", 0)}


class RLOOTrainer(GRPOTrainer):
    """TRL's `RLOOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ...,
    quantization_config, peft_config)` on lmrl's rloo: GRPOTrainer's prompts, reward functions and reward
    models, evaluation and transformers surface, trained as its `RLOOConfig` says (TRL's RLOO loss: one
    clipped ratio per completion, the KL to the reference in the reward, leave-one-out baselines). TRL's
    RLOOTrainer takes no tools= or environment_factory=, and neither does this one."""

    kind, lmrl_class, config_class = "rloo", _LmrlRLOOTrainer, RLOOConfig

    def __init__(self, model, reward_funcs, args: RLOOConfig | None = None, train_dataset=None, eval_dataset=None,
                 processing_class=None, reward_processing_classes=None, callbacks=None, optimizers=(None, None),
                 quantization_config=None, peft_config=None):
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
                         reward_processing_classes, callbacks, optimizers, peft_config=peft_config,
                         quantization_config=quantization_config)


def _reward_models(reward_funcs, train_dataset, config) -> tuple:
    """(reward_funcs with each reward model in it made a reward function, those scorers). A reward model is
    TRL's: a path (str or PathLike) or a loaded `AutoModelForSequenceClassification`, scored with its own
    tokenizer on prompt + completion (conversations through its chat template, texts joined) and named
    after its directory (`rewards/<name>/mean`), as TRL does; lmrl's `RewardModelScorer` scores it."""
    from ..tasks.rewards import RewardModelScorer

    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    models = [f for f in funcs if isinstance(f, (str, os.PathLike, torch.nn.Module))]
    if not models:
        return reward_funcs, []
    chat = train_dataset is not None and _conversational(_first_row(train_dataset))
    scorers = {id(m): RewardModelScorer(m, batch_size=config.reward.model_batch_size, chat=chat,
                                        chat_template_kwargs=config.model.chat_template_kwargs) for m in models}
    return [scorers.get(id(f), f) for f in funcs], list(scorers.values())


def _environment_prompts(args: GRPOConfig) -> list[dict]:
    """The prompts of an environment that owns its data (TRL: no train_dataset, the environment's `reset()`
    text is the prompt): empty user turns, as many as one step's completions."""
    if int(args.max_steps) <= 0:
        raise ValueError("an environment_factory without train_dataset= needs max_steps= in the GRPOConfig (TRL's "
                         "rule: the environment's reset() makes each prompt, so there is no data set to count)")
    rows = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(max(rows, 1))]


def _require(args, cls) -> None:
    if not isinstance(args, cls):
        raise TypeError(f"args must be lmrl.trl.{cls.__name__} (TRL's {cls.__name__} with lmrl's translation), got "
                        f"{type(args).__module__}.{type(args).__name__}: import it from lmrl.trl")


class _OfflineTRLTrainer(_TRLTrainer):
    lmrl_class = None
    config_class = None
    rows = ""

    def __init__(self, model, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None,
                 quantization_config=None, **extra):
        if data_collator is not None or optimizers != (None, None):
            raise ValueError("data_collator= and optimizers= are not supported: lmrl batches rows itself and "
                             "builds AdamW from the args")
        args = args if args is not None else self.config_class(output_dir="trainer_output")
        _require(args, self.config_class)
        config, policy, held, _ = _prepare(args, model, processing_class, peft_config, quantization_config,
                                           train_dataset, self.rows, self.kind.upper())
        hf_callbacks, own = _split_callbacks(callbacks)
        tokenizer = policy.tokenizer if policy is not None else processing_class
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        inner = self.lmrl_class(config, model=policy, tokenizer=tokenizer,
                                train_dataset=train_dataset, eval_dataset=eval_dataset, callbacks=own, **extra)
        self._held_a_run = held
        # the rows an epoch passes over: SFT's packed sequences where it packs
        super().__init__(inner, args, processing_class=processing_class, callbacks=hf_callbacks,
                         train_rows=len(inner.train_rows))


class DPOTrainer(_OfflineTRLTrainer):
    """TRL's `DPOTrainer(model, ref_model, args, data_collator, train_dataset, eval_dataset,
    processing_class, ..., peft_config)` on lmrl's DPO, rows in any of TRL's preference formats."""

    kind, lmrl_class, config_class, rows = "dpo", _LmrlDPOTrainer, DPOConfig, "preference pairs"

    def __init__(self, model, ref_model=None, args: DPOConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None,
                 quantization_config=None):
        reference = None
        if ref_model is not None:
            if isinstance(ref_model, (str, os.PathLike)):
                raise ValueError("ref_model= takes a loaded model (the default: the policy as training starts)")
            from ..models.hf import HFPolicy

            reference = ref_model if isinstance(ref_model, HFPolicy) else HFPolicy(ref_model, processing_class)
            reference.eval().requires_grad_(False)
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class, callbacks,
                         optimizers, peft_config, quantization_config, reference=reference)


class SFTTrainer(_OfflineTRLTrainer):
    """TRL's `SFTTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class, ...,
    peft_config)` on lmrl's SFT: rows {text} (dataset_text_field's column), {prompt, completion} or
    {messages} (TRL's formats), packed with packing=True."""

    kind, lmrl_class, config_class, rows = "sft", _LmrlSFTTrainer, SFTConfig, "text, prompt/completion or messages rows"


class RewardTrainer(_OfflineTRLTrainer):
    """TRL's `RewardTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class, ...,
    peft_config)` on lmrl's reward-model trainer: {chosen, rejected} pairs (with or without prompt)."""

    kind, lmrl_class, config_class, rows = "reward", _LmrlRewardTrainer, RewardConfig, "preference pairs"

    def _eval_names(self) -> set[str] | None:
        names = ("loss", "accuracy", "margin", "mean_reward", "min_reward", "max_reward", "margin_mean",
                 "chosen_mean", "rejected_mean", "num_tokens")
        return {f"eval/{name}" for name in names}
