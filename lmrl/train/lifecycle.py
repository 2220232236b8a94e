"""The run lifecycle every trainer shares, written once: a trainer says what one training step and
one evaluation are, and `Trainer` does the rest.

    class MyTrainer(Trainer):
        def stages(self):                  # the run's steps, in order
            return [Stage("train", steps=100, eval_every=10)]
        def run_stage(self, stage):        # one loop per stage: build the optimizer, then step
            self.make_optimizer(self.model, lr=..., ...)
            self.step_until_done(stage, self.train_step)
        def train_step(self, stage):       # forward, backward, self.optimizer_step(loss), self.end_step(...)
            ...
        def evaluate(self) -> dict:        # {"eval/...": value}
            ...

What `Trainer` owns:
- set-up: torchrun's process group and device, CPU threads, seeds, the run dir (never
  overwritten), per-rank named generators;
- mixed precision (`run.mixed_precision=bf16`): every step runs under `torch.autocast`, every
  held-out evaluation outside it, so the evaluation measures the saved weights as they are;
- the optimizer: AdamW on the trainable parameters, the LR schedule (every `schedule.*` key;
  plateau steered by `train.best_metric` in the direction the metric needs), DDP / FSDP wrapping,
  and the guarded step (clip; skip and count a non-finite update; stop after
  `train.max_nonfinite` in a row);
- the weight average (`train.ema_decay`, in the stages whose optimizer asks for it): updated after
  every update, evaluated, saved as best and exported in place of the trained weights, resumed;
- the end of every step: evaluation when due, the best model (`checkpoints/best/`, maximised or
  minimised as `train.best_metric` says), early stopping (`train.patience`, `train.stopping_threshold`),
  logging, callbacks, checkpoints;
- stopping: Ctrl-C or SIGTERM (finish the step, save, return; under torchrun every rank stops after
  the same step), `train.time_limit_min`, early stopping;
- exact resume: weights and state when training starts, optimizer, scheduler and every RNG once
  the stage has built them (`run.resume=auto`);
- the end: a final evaluation if the last step had none, the last checkpoint, the export of the best
  model (trainers that export one), and `summary.json`.

One global step counter runs through every stage (stage k's steps follow stage k-1's), so
metrics.jsonl, TensorBoard and checkpoint names share one axis; the console shows the step within
the stage.
"""

from __future__ import annotations

import difflib
import gc
import json
import os
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import Config, save_config, validate
from ..parallel.ddp import all_reduce_sum, barrier, broadcast_object, init_distributed
from ..common.errors import ConfigError, NonFiniteOutputs, TrainingError
from ..common.schedules import make_scheduler
from .. import checkpoint as ckpt
from .callbacks import CallbackList
from .run_dir import RunLog, prepare_run_dir, unlock_run_dir
from .tracking import EvalTracker, lower_is_better
from .weight_average import FILE as AVERAGE_FILE, NAME as AVERAGE, WeightAverage


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what `train` answers by finishing the step and saving


@dataclass
class Stage:
    """A run of `steps` consecutive global steps: `first` is the global step before its first one.

    `eval_every` > 0 evaluates every that many steps of the stage; the stage's last step is always
    evaluated. `clock` names the entry of the run's `time` record its steps' seconds add to.
    `timed`: `train.time_limit_min` may end the stage early."""

    name: str
    steps: int
    first: int = 0
    eval_every: int = 0
    clock: str = ""
    timed: bool = True

    def __post_init__(self):
        self.clock = self.clock or self.name

    @property
    def last(self) -> int:
        return self.first + self.steps


def free_memory(device: torch.device) -> None:
    """Between phases (after an evaluation, before an export): drop what Python still holds and hand
    the GPU's cached blocks back, so the next phase does not start fragmented."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def nearest_metric(metric: str, names: Iterable[str]) -> str | None:
    """"; did you mean 'eval/x'?" for the name in `names` nearest to `metric` (compared without their
    common eval/ prefix), or None."""
    near = difflib.get_close_matches(metric.removeprefix("eval/"), [n.removeprefix("eval/") for n in names], n=1)
    return f"; did you mean 'eval/{near[0]}'?" if near else None


def what_to_resume(ckpt_dir: Path) -> str:
    """After a run of non-finite updates: the newest step checkpoint (saved before them: no step
    checkpoint is written while updates are being skipped), or that there is none, and then what
    `best/` holds, if it exists."""
    latest = ckpt.latest_checkpoint(ckpt_dir)
    if latest is not None:
        return (f"The last step checkpoint, saved before these skipped updates, is {latest}: lower the learning rate "
                f"and continue from it with --resume")
    text = (f"No step checkpoint was saved before them ({ckpt_dir} holds none, so --resume would start from step 0): "
            f"lower the learning rate and train again")
    best = ckpt_dir / ckpt.BEST_DIR
    try:
        step = json.loads((best / ckpt.TRAINER_STATE_FILE).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return text
    affected = "" if step == 0 else ", perhaps already affected"  # weights can grow for a while before a loss is NaN
    return (f"{text}; {best} holds step {step}'s weights only (its best evaluation{affected}), which "
            f"model.init_from={best} starts a new run from")


def guarded_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, state: dict, *, grad_clip: float,
                 max_nonfinite: int, device, ckpt_dir, info: Callable[[str], None]) -> dict:
    """Clip, then step — or skip the update when the loss or the gradient is not finite, counted in
    `state` ("step", "nonfinite_total", "nonfinite_run"), and raise `TrainingError` after
    `max_nonfinite` skips in a row. Each of the optimizer's parameter groups is clipped to `grad_clip`
    on its own (PPO's value function is a group of its own, as verl's and OpenRLHF's critic has its
    own optimizer); "grad_norm" is the first group's, and a second group's is "value_grad_norm".
    Gradients are already accumulated; every rank takes the same decision (the flag is all-reduced)."""
    clip = grad_clip if grad_clip > 0 else float("inf")
    norms = [torch.nn.utils.clip_grad_norm_([p for p in group["params"] if p.requires_grad], clip)
             for group in optimizer.param_groups]
    # FSDP: a DTensor over sharded gradients, made one number
    norms = torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms])
    bad = torch.tensor([float(not (torch.isfinite(loss) and torch.isfinite(norms).all()))], device=device)
    if all_reduce_sum(bad).item() > 0:
        state["nonfinite_total"] += 1
        state["nonfinite_run"] += 1
        info(f"step {state['step'] + 1}: non-finite loss or gradient, update skipped ({state['nonfinite_run']} in a row)")
        if state["nonfinite_run"] >= max_nonfinite:
            raise TrainingError(f"{state['nonfinite_run']} non-finite losses in a row at step {state['step'] + 1}; "
                                f"stopped. {what_to_resume(Path(ckpt_dir))}")
    else:
        optimizer.step()
        state["nonfinite_run"] = 0
    optimizer.zero_grad(set_to_none=True)
    grad_norms = norms.tolist()
    return {"grad_norm": grad_norms[0], **({"value_grad_norm": grad_norms[1]} if len(grad_norms) > 1 else {}),
            "nonfinite_skipped": state["nonfinite_total"]}


class Trainer:
    """The lifecycle (see the module docstring). A subclass builds `self.model` in its __init__
    after `super().__init__(config)`, then calls `self.init_state()`, and implements `stages`,
    `run_stage` and `evaluate`; `summary`, `export`, `checkpoint_modules`, `frozen_modules`,
    `fresh_model` and `stage_evaluated` are optional."""

    name = "train"  # prefix of the training metrics (sft/..., dpo/..., rm/...); RL uses train/...
    default_best_metric = "eval/accuracy"

    def __init__(self, config: Config, *, callbacks=None):
        validate(config)
        self.config = cfg = config
        self.callbacks = CallbackList(callbacks)
        self.dist, self.device = init_distributed(cfg.run.device)
        # distributed.strategy=fsdp: the trained module is sharded over the ranks when its optimizer is made
        self.fsdp = self.dist.enabled and cfg.distributed.strategy == "fsdp"
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)  # identical initial weights (and LoRA adapters) on every rank
        self.best_metric = cfg.train.best_metric or self.default_metric(cfg)
        known = self.eval_metric_names(cfg)
        if known is not None and self.best_metric not in known:  # before any model loads
            raise ConfigError(f"train.best_metric={self.best_metric!r} is not an eval metric of this run: it reports "
                              f"{', '.join(sorted(known))}{nearest_metric(self.best_metric, known) or ''}")
        self.optimizer = self.scheduler = None
        self.average: WeightAverage | None = None  # train.ema_decay: the stage's average of the model's weights
        self.module = self.train_model = None  # what the optimizer trains, and its DDP/FSDP wrapper
        self.placement = ""  # where a launcher put this trainer (e.g. its Ray actor's node and GPUs), for the log
        self.log: RunLog | None = None
        self._stop_requested = False
        self._stop_signal: str | None = None  # the signal that asked for the stop (SIGINT, SIGTERM), if one did
        self._resume_path: Path | None = None
        self._resume_warnings: list[str] = []  # one per damaged checkpoint that resume passed over
        self.data_notes: list[str] = []  # lines about the data (e.g. truncation counts) logged as training starts

    def init_state(self, **extra) -> None:
        """The run dir, generators and the resumable state; call once the model (and data) exist."""
        cfg = self.config
        self.run_dir = Path(broadcast_object(str(prepare_run_dir(cfg)) if self.dist.is_main else None))
        cfg.run.dir = str(self.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.generators = self.make_generators(self.stream_seed())
        stages = self.stages()
        self.state = {"step": 0, "stage": stages[0].name, "nonfinite_total": 0, "nonfinite_run": 0,
                      **EvalTracker.initial_state(),
                      "time": {**{s.clock: 0.0 for s in stages}, "eval": 0.0, "wall": 0.0}, **extra}

    @property
    def tracker(self) -> EvalTracker:
        """`train.best_metric` over the evaluations (best model, early stopping), by the config's rules,
        its record kept in the run's state (so checkpoints hold it and a resume continues it)."""
        t = self.config.train
        return EvalTracker(self.best_metric, min_delta=t.early_stop_threshold, patience=t.patience,
                           stop_at=t.stopping_threshold, state=self.state)

    # -- what a trainer provides ---------------------------------------------------------------------
    def stages(self) -> list[Stage]:
        raise NotImplementedError

    def run_stage(self, stage: Stage) -> None:
        """Builds the stage's optimizer (`make_optimizer`) and steps until `step_until_done` returns."""
        raise NotImplementedError

    def evaluate(self) -> dict:
        """Held-out metrics, every key starting with eval/ (the same numbers on every rank)."""
        raise NotImplementedError

    def default_metric(self, config: Config) -> str:
        """The eval metric `train.best_metric` means when it is empty."""
        return self.default_best_metric

    def eval_metric_names(self, config: Config) -> frozenset[str] | None:
        """The names `evaluate` reports for `config`, when the config alone says which (None: known only
        once an evaluation runs, where `train.best_metric` is checked against them instead)."""
        return None

    @property
    def can_evaluate(self) -> bool:
        return True

    def stage_evaluated(self, stage: Stage, metrics: dict) -> None:
        """Called after an evaluation at the end of a step of `stage`; may add to `metrics`."""

    def summary(self) -> dict:
        """summary.json's trainer-specific part."""
        return {}

    def summary_line(self, summary: dict) -> str:
        best = self.tracker.best
        best_text = "" if best["value"] is None else f"best {self.best_metric} {best['value']:.4f} at step {best['step']} | "
        return f"{self.name} done: {best_text}{self.state['time']['wall']:.0f}s"

    def export(self, out_dir: Path, model: torch.nn.Module) -> Path | None:
        """Write `model` (the best model) where users load it from; None: the checkpoints are the model."""
        return None

    @property
    def exports(self) -> bool:
        return type(self).export is not Trainer.export

    def fresh_model(self) -> torch.nn.Module:
        """The model as training started, built again from the config: under FSDP, rank 0 loads the
        trained weights into it to export them (shards cannot be saved as a transformers model)."""
        raise NotImplementedError(f"{type(self).__name__} cannot export under distributed.strategy=fsdp")

    def checkpoint_modules(self) -> dict[str, torch.nn.Module]:
        """Modules besides the model that a checkpoint within a stage must hold for an exact resume."""
        return {}

    def frozen_modules(self) -> list[torch.nn.Module]:
        """Modules with weights of their own that never train (a KL reference copy): FSDP shards them too."""
        return []

    def make_generators(self, seed: int) -> dict[str, torch.Generator]:
        return {"data": torch.Generator().manual_seed(seed)}

    # -- the run -------------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.stages()[-1].last

    def train(self) -> dict:
        cfg = self.config
        self._clock = time.perf_counter()  # wall time is summed over sessions (a resumed run adds on)
        resumed_from = self._resume()
        if self.dist.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
            self.log = RunLog(self.run_dir, cfg, total_steps=self.total_steps,
                              resume_step=self.state["step"] if resumed_from else None)
            for warning in self._resume_warnings:
                self.log.warning(warning)
            if resumed_from:
                self.log.info(f"resumed from {resumed_from} (step {self.state['step']})")
            self.log.info(self.describe())
            for note in self.data_notes:
                self.log.info(note)
        previous = {}
        if threading.current_thread() is threading.main_thread():  # Python runs handlers in the main thread only
            previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            for stage in self.stages():
                if self.state["step"] < stage.last and self._running():
                    self.state["stage"] = stage.name
                    self.run_stage(stage)
            if self._stop_requested:
                self.save_checkpoint()
                self.info(f"interrupted: checkpoint saved at step {self.state['step']}; continue with --resume")
                return {"interrupted": True, "step": self.state["step"], "signal": self._stop_signal}
            return self._finish()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.log is not None:
                self.log.close()
            unlock_run_dir(self.run_dir)  # taken by prepare_run_dir (rank 0): the dir is free for the next run

    def describe(self) -> str:
        """The run's first log line."""
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in self.model.parameters())
        data = self.describe_data()
        return (f"{self.name} | run dir {self.run_dir} | {data + ' | ' if data else ''}{total / 1e6:.2f}M parameters "
                f"({trainable / 1e6:.2f}M trainable) | {self.total_steps} steps | device {self.device} | "
                f"world size {self.dist.world_size}" + (f" | {self.placement}" if self.placement else ""))

    def describe_data(self) -> str:
        """What the run trains on, for its first log line ('' when the data is not rows of a file)."""
        return ""

    def step_until_done(self, stage: Stage, step: Callable[[Stage], None]) -> None:
        """Calls `step(stage)` (which ends with `end_step`) until the stage's last step, Ctrl-C, early
        stopping or the time limit."""
        while self.state["step"] < stage.last and self._running() and not (stage.timed and self._out_of_time()):
            with self.autocast():
                try:
                    step(stage)
                except NonFiniteOutputs as e:  # e.g. optim.lr=1e10: one line, not a traceback from sampling
                    lr = f" (now {self.optimizer.param_groups[0]['lr']:.3g})" if self.optimizer else ""
                    raise TrainingError(f"the policy's outputs became non-finite after step {self.state['step']} "
                                        f"({e}): its weights blew up, most often from too high a learning rate{lr}; "
                                        f"lower optim.lr (sft.lr for a warm-up) and train again. The checkpoints in "
                                        f"{self.ckpt_dir} are as they were") from None

    def autocast(self, enabled: bool = True):
        """With `run.mixed_precision=bf16`: `torch.autocast` in bfloat16 on the run's device, or
        (`enabled=False`) a context that switches it off. Otherwise nothing."""
        if self.config.run.mixed_precision != "bf16":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def request_stop(self, signal_name: str | None = None) -> None:
        """Finish the current step, save a checkpoint and return from `train` (what Ctrl-C and SIGTERM
        do); `signal_name` names the signal that asked, which `train`'s result reports. A second
        request stops at once, except a second SIGTERM: a scheduler that sends it to every process
        of a job reaches a torchrun worker twice (directly and through torchrun), and its grace
        period before SIGKILL is what the step and the save have."""
        if self._stop_requested:
            if signal_name == "SIGTERM":
                return
            raise KeyboardInterrupt
        self._stop_requested, self._stop_signal = True, signal_name
        again = "" if signal_name == "SIGTERM" else " (press Ctrl-C again to stop at once)"
        self.info(f"stop requested{f' ({signal_name})' if signal_name else ''}: finishing this step, then saving a "
                  f"checkpoint{again}")

    def _on_signal(self, signum, frame) -> None:
        self.request_stop(signal.Signals(signum).name)

    def _running(self) -> bool:
        if self.dist.enabled:  # a signal reaches the ranks at slightly different times: the first to see it stops all
            seen = [self._stop_requested, self._stop_signal == "SIGINT", self._stop_signal == "SIGTERM"]
            asked, sigint, sigterm = all_reduce_sum(torch.tensor(seen, dtype=torch.float32, device=self.device)).tolist()
            if asked and not self._stop_requested:
                self._stop_requested = True
                self._stop_signal = "SIGTERM" if sigterm else "SIGINT" if sigint else None
        return not (self._stop_requested or self.tracker.stopped or self.state.get("stopped_at_time_limit"))

    def _out_of_time(self) -> bool:
        """`train.time_limit_min` reached (wall time summed over sessions): training ends here."""
        limit = self.config.train.time_limit_min
        if limit <= 0:
            return False
        self._tick()
        over = torch.tensor([float(self.state["time"]["wall"] >= 60 * limit)], device=self.device)
        if all_reduce_sum(over).item() == 0:  # one decision for every rank (clocks differ a little)
            return False
        self.info(f"time limit of {limit:g} min reached at step {self.state['step']}: stopping")
        self.state["stopped_at_time_limit"] = True
        return True

    # -- the optimizer (what an algorithm sees of the trainer: algos.base.Learner) ------------------
    def make_optimizer(self, module: torch.nn.Module, *, lr: float, weight_decay: float, steps: int,
                       schedule: str, warmup_steps: int, betas=(0.9, 0.99), eps: float = 1e-8,
                       min_lr_ratio: float | None = None, ema_decay: float = 0.0,
                       own_lr: dict[str, float] | None = None) -> None:
        """AdamW on `module`'s trainable parameters (a LoRA policy: its adapter), wrapped for DDP or
        sharded for FSDP, with the LR schedule `schedule` over `steps` steps down to `min_lr_ratio`
        (None: `schedule.min_lr_ratio`); the plateau's factor and patience come from the config's
        `schedule`, and a plateau follows `train.best_metric` in its direction. `own_lr` {name prefix:
        lr}: the parameters under that prefix (PPO's "value.") are a group of their own at that peak
        LR, on the same schedule, clipped on their own (`guarded_step`). After a resume, the
        checkpoint's optimizer, scheduler and RNG states are loaded into them. `ema_decay` > 0 starts
        an average of the model's trainable weights (`WeightAverage`) for the stage."""
        if self.fsdp:  # sharded in place: the module is its own wrapper, its parameters DTensor shards
            from ..parallel.fsdp import shard

            self.train_model = shard(module)
            for frozen in self.frozen_modules():
                shard(frozen, frozen=True)
        else:
            self.train_model = DDP(module) if self.dist.enabled else module
        self.module = module
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        trainable = [p for _, p in named]
        groups = [{"params": [p for name, p in named if not any(name.startswith(k) for k in own_lr or {})]}]
        groups += [{"params": [p for name, p in named if name.startswith(prefix)], "lr": group_lr}
                   for prefix, group_lr in (own_lr or {}).items()]
        # PyTorch's fused kernel updates every tensor in one pass: on a CPU several times faster than
        # its default per-tensor loop (benchmarks/gpt_step.py); sharded (DTensor) parameters keep the loop.
        fused = not self.fsdp and all(p.device.type in ("cpu", "cuda") for p in trainable)
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay,
                                           betas=tuple(betas), eps=eps, fused=fused)
        s = self.config.schedule
        if schedule == "wsd" and warmup_steps + s.decay_steps > steps:  # the offline run's length is known only now
            raise ConfigError(f"schedule.warmup_steps={warmup_steps} and schedule.decay_steps={s.decay_steps} add up "
                              f"to more than the run's {steps} optimizer steps")
        self.scheduler = make_scheduler(self.optimizer, total_steps=steps, name=schedule, warmup_steps=warmup_steps,
                                        min_lr_ratio=s.min_lr_ratio if min_lr_ratio is None else min_lr_ratio,
                                        decay_steps=s.decay_steps, decay_shape=s.decay_shape,
                                        plateau_mode="min" if lower_is_better(self.best_metric) else "max",
                                        plateau_factor=s.plateau_factor, plateau_patience=s.plateau_patience)
        self.average = WeightAverage(self.model, ema_decay) if ema_decay else None
        self._restore_pending()

    def drop_optimizer(self) -> None:
        """Between stages: the next stage makes its own (the boundary checkpoint holds none)."""
        self.optimizer = self.scheduler = self.average = None

    def optimizer_step(self, loss: torch.Tensor) -> dict:
        """Clip, then step — or skip a non-finite update (`guarded_step`). Gradients are already accumulated."""
        t = self.config.train
        stats = guarded_step(self.optimizer, loss, self.state, grad_clip=t.grad_clip,
                             max_nonfinite=t.max_nonfinite, device=self.device, ckpt_dir=self.ckpt_dir, info=self.info)
        if self.average is not None:
            self.average.update()
        return {"loss": loss.item(), **stats}

    @property
    def distributed(self) -> bool:
        """Several processes train together (each must run the same forward and backward passes)."""
        return self.dist.enabled

    def no_sync(self, sync: bool):
        """Under DDP (FSDP), gradients are all-reduced (reduce-scattered) only on the micro-batch that says `sync`."""
        if self.fsdp:
            from ..parallel.fsdp import gradient_sync

            return gradient_sync(self.train_model, sync)
        return self.train_model.no_sync() if isinstance(self.train_model, DDP) and not sync else nullcontext()

    @staticmethod
    def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t)

    # -- the end of a step ---------------------------------------------------------------------------
    def end_step(self, stage: Stage, metrics: dict, seconds: float, tokens: int | None = None) -> None:
        """Counts the step, then evaluates, logs, calls back and checkpoints as the config says."""
        cfg = self.config
        self.state["step"] += 1
        self.state["time"][stage.clock] += seconds
        step = self.state["step"]
        metrics["time/step_s"] = seconds
        if tokens is not None:
            metrics["perf/tokens_per_s"] = tokens * self.dist.world_size / max(seconds, 1e-9)
        stage_step = step - stage.first
        last = step == stage.last
        self.callbacks.update_end(self, step)
        if self.evaluates_at(stage, stage_step):
            metrics.update(self.run_evaluation())
            self.stage_evaluated(stage, metrics)
        if self.logs_at(stage, stage_step):
            self._tick()
            metrics["time/elapsed_s"] = self.state["time"]["wall"]  # the run's wall time so far (resumes add on)
            self.log_metrics(step, metrics, stage=stage.name, stage_step=stage_step, stage_total=stage.steps)
        if self.log is not None:
            self.log.advance(step)
        self.callbacks.step_end(self, step, metrics)
        if stage_step % cfg.train.ckpt_every == 0 and not last and self.state["nonfinite_run"] == 0:
            self.save_checkpoint()  # never during a run of skipped updates: the last one stays a good one

    def evaluates_at(self, stage: Stage, stage_step: int) -> bool:
        """Whether step `stage_step` of `stage` ends with an evaluation: every `stage.eval_every`
        steps, and the stage's last."""
        due = stage_step == stage.steps or (stage.eval_every and stage_step % stage.eval_every == 0)
        return self.can_evaluate and bool(due)

    def logs_at(self, stage: Stage, stage_step: int) -> bool:
        """Whether step `stage_step` of `stage` logs its metrics: every `train.log_every` steps, the
        stage's first and last, and every step with an evaluation."""
        return (stage_step % self.config.train.log_every == 0 or stage_step in (1, stage.steps)
                or self.evaluates_at(stage, stage_step))

    def run_evaluation(self) -> dict:
        """`evaluate`, then the best model, early stopping and the plateau schedule on `train.best_metric`."""
        with self.evaluated_weights():
            return self._evaluate_and_decide()

    def evaluated_weights(self):
        """A block in which the model holds the weights that are evaluated, saved as best and exported:
        the average with `train.ema_decay`, else the trained weights themselves."""
        return self.average.swapped_in() if self.average is not None else nullcontext()

    def _evaluate_and_decide(self) -> dict:
        start = time.perf_counter()
        with self.autocast(enabled=False):
            metrics = self.evaluate()
        free_memory(self.device)
        self.state["time"]["eval"] += time.perf_counter() - start
        if self.best_metric not in metrics:  # every rank's evaluation reports the same names
            near = nearest_metric(self.best_metric, metrics)
            raise ConfigError(f"train.best_metric={self.best_metric!r} is not an eval metric of this run: its "
                              f"evaluation after step {self.state['step']} reports {', '.join(sorted(metrics))}"
                              f"{near or '.'} The checkpoints in {self.ckpt_dir} are as they were: set "
                              f"train.best_metric to one of these and continue with --resume")
        value, step = metrics[self.best_metric], self.state["step"]
        self.state["last_eval"] = dict(metrics)
        verdict = self.tracker.observe(step, value, accuracy=metrics.get("eval/accuracy"))
        if verdict.improved:
            weights = self._weights(self.model)
            if self.dist.is_main:
                ckpt.save_weights(self.ckpt_dir / ckpt.BEST_DIR, weights,
                                  trainer_state={"step": step, self.best_metric: value})
        if verdict.stop == "patience":
            best = self.tracker.best
            self.info(f"early stop at step {step}: {self.best_metric} has not improved on {best['value']:.4f} "
                      f"(step {best['step']}) for {self.tracker.patience} evaluations")
        elif verdict.stop == "threshold":
            self.info(f"early stop at step {step}: {self.best_metric} is {value:.4f}, which reaches "
                      f"train.stopping_threshold={self.tracker.stop_at:g}")
        if self.scheduler is not None:
            self.scheduler.observe(value)  # schedule.name=plateau; a no-op for the others
        return metrics

    # -- checkpoints and resume ----------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        self._tick()
        self._write_checkpoint()
        barrier()

    def _write_checkpoint(self) -> None:
        """Every rank calls it (FSDP gathers the weights and optimizer state); rank 0 writes. Between
        stages there is no optimizer, and the checkpoint holds the model, state and RNG only."""
        in_stage = self.optimizer is not None
        model, optimizer = self.model, self.optimizer
        modules = self.checkpoint_modules() if in_stage else None
        if in_stage and self.average is not None:
            modules = {**modules, AVERAGE: self.average.state_dict()}
        if self.fsdp:  # whole tensors in place of the sharded modules and optimizer
            model, optimizer, modules = ckpt.whole_training_state(model, optimizer, modules)
        if not self.dist.is_main:
            return
        path = ckpt.save_checkpoint(self.ckpt_dir, self.state["step"], model=model, optimizer=optimizer,
                                    scheduler=self.scheduler if in_stage else None, generators=self.generators,
                                    trainer_state=self.state, keep=self.config.train.keep_checkpoints,
                                    modules=modules)
        self.callbacks.checkpoint(self, path)

    def _weights(self, module: torch.nn.Module):
        """What a checkpoint writes for `module`: the module, or under FSDP its weights gathered whole
        (every rank takes part; rank 0 gets the tensors), a LoRA policy's as its PEFT adapter."""
        return ckpt.whole_weights(module) if self.fsdp else module

    def _resume(self) -> Path | None:
        """With run.resume=auto, load the model's weights and the state from the newest checkpoint
        whose files all load (newer damaged ones are moved aside by rank 0 and named in a warning)
        now; the optimizer, scheduler and RNG follow in `_restore_pending` once a stage has made them.
        First rank 0 cleans up after a killed save: a checkpoint it had swapped out is put back (and
        named in a warning), its temporary dirs are removed."""
        if self.config.run.resume != "auto":
            return None
        restored = ckpt.remove_stale_temps(self.ckpt_dir) if self.dist.is_main else []
        barrier()  # every rank sees the checkpoints dir as rank 0 left it
        if self.config.run.resume_from:  # exactly this checkpoint (--resume_from_checkpoint), checked the same way
            latest, self._resume_warnings = ckpt.named_resume_checkpoint(self.config.run.resume_from), []
        else:  # the newest checkpoint whose files all load; rank 0 moves newer damaged ones aside
            latest, self._resume_warnings = ckpt.resume_checkpoint(self.ckpt_dir, set_aside=self.dist.is_main)
        self._resume_warnings[:0] = [f"put back {path}, which a save killed between its two renames had moved aside"
                                     for path in restored]
        if latest is None:
            return None
        self.state = ckpt.load_checkpoint(latest, model=self.model, map_location=self.device, restore_rng=False)
        self._resume_path = latest
        return latest

    def _restore_pending(self) -> None:
        path, self._resume_path = self._resume_path, None
        if path is None:
            return
        in_stage = ckpt.holds_optimizer(path)  # a boundary checkpoint holds no optimizer
        ckpt.load_checkpoint(path, model=self.model, optimizer=self.optimizer if in_stage else None,
                             scheduler=self.scheduler if in_stage else None, generators=self.generators,
                             map_location=self.device, modules=self.checkpoint_modules() if in_stage else None)
        if in_stage and self.average is not None:
            file = path / AVERAGE_FILE
            if not file.is_file():
                raise ckpt.CheckpointError(f"{path} holds no weight average ({file.name}): it was saved with "
                                           f"train.ema_decay=0; resume it with the same setting")
            self.average.load(file)
        if self.dist.enabled:  # one file holds rank 0's streams: give every rank its own again
            for i, g in enumerate(self.generators.values()):
                g.manual_seed(self.config.run.seed + 7919 * self.dist.rank + 31 * self.state["step"] + i)

    def stream_seed(self) -> int:
        """The seed of this rank's generators: each rank draws its own data and samples."""
        return self.config.run.seed + 7919 * self.dist.rank

    # -- the end -------------------------------------------------------------------------------------
    def _finish(self) -> dict:
        if self.can_evaluate and not self._evaluated_now():  # e.g. stopped at the time limit between evaluations
            self.log_metrics(self.state["step"], self.run_evaluation(), stage=self.state["stage"])
        self._tick()
        saved = ckpt.is_latest(self.ckpt_dir, self.state["step"]) if self.dist.is_main else None
        if broadcast_object(not saved):  # rank 0 decides
            self._write_checkpoint()
        barrier()
        exported = self._export_best() if self.exports else None
        summary = {**self.summary(), "exported": exported, "nonfinite_skipped": self.state["nonfinite_total"],
                   "stopped_early": self.tracker.stopped,
                   "stopped_at_time_limit": bool(self.state.get("stopped_at_time_limit"))}
        if self.dist.is_main:
            tmp = self.run_dir / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, self.run_dir / "summary.json")
            self.info(f"{self.summary_line(summary)} | summary in {self.run_dir / 'summary.json'}")
        barrier()
        return summary

    def _export_best(self) -> str | None:
        """Exports the best model (the last one when nothing was evaluated) with `export`; returns where."""
        best, step = self.tracker.best, self.state["step"]
        from_best = best["value"] is not None and best["step"] != step
        # a checkpoint dir: its weights file
        source = self.ckpt_dir / ckpt.BEST_DIR if from_best else ckpt.step_dir(self.ckpt_dir, step)
        self.state["exported_step"] = best["step"] if from_best else step
        out = None
        if self.fsdp:  # every rank takes its shard of the exported weights; rank 0 writes them from a fresh copy
            if from_best:
                ckpt.load_weights(self.model, source, self.device)
            if self.dist.is_main:
                model = self.fresh_model()  # on the CPU: the device holds the sharded model
                ckpt.load_weights(model, source)
                free_memory(self.device)
                out = self.export(self.run_dir, model)
        elif self.dist.is_main:
            if from_best:
                ckpt.load_weights(self.model, source, self.device)
            elif self.average is not None:  # the last step's average, which is what was evaluated
                self.average.copy_to_model()
            free_memory(self.device)
            out = self.export(self.run_dir, self.model)
        return None if out is None else str(out)

    def _evaluated_now(self) -> bool:
        return self.tracker.evaluated_at(self.state["step"])

    def _tick(self) -> None:
        now = time.perf_counter()
        self.state["time"]["wall"] += now - self._clock
        self._clock = now

    # -- logging -------------------------------------------------------------------------------------
    def log_metrics(self, step: int, metrics: dict, **console) -> None:
        if self.log is not None:
            self.log.log(step, metrics, **console)

    def info(self, msg: str) -> None:
        if self.log is not None:
            self.log.info(msg)
