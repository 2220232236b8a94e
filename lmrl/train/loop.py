"""The RL trainer: a supervised warm-up on a budget of labeled problems, then RL on the task's
reward alone, with the algorithm `algo.name` names (REINFORCE, RLOO, GRPO, PPO; see `lmrl.algos`).

    trainer = RLTrainer(load_config("adder", ["train.steps=100"]))
    summary = trainer.train()   # {"warmup_accuracy": ..., "final_accuracy": ..., ...}

One global step counter runs through both stages (warm-up steps 1..S, RL steps S+1..S+R), so
metrics.jsonl, TensorBoard and checkpoints share one axis. A checkpoint after step N holds
everything the next step reads — weights, optimizer, scheduler, the algorithm's state
(baseline, KL coefficient), value model and reference, every RNG — so a run
resumed from it writes the same metrics as one that never stopped.
"""

from __future__ import annotations

import json
import os
import signal
import copy
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..algos import build_algorithm
from ..config import Config, save_config
from ..distributed.ddp import all_reduce_sum, barrier, broadcast_object, init_distributed
from ..models import build_model
from ..models.heads import ActorCritic
from ..models.reference import is_reference_view, reference_view
from ..tasks import build_task
from . import checkpoint as ckpt
from .callbacks import CallbackList
from .evaluate import evaluate
from .guarded_step import TrainingError, guarded_step  # noqa: F401  (TrainingError: re-exported)
from .rewards import RewardFn, load_reward_class
from .run_dir import RunLog, prepare_run_dir
from ..schedules import make_scheduler


class RLTrainer:
    """Wires a policy, a task and a reward into the warm-up + RL loop described by a `Config`.

    model: a policy with `generate` and a forward returning logits (default: built from
        `config.model`: the built-in GPT, or a Hugging Face model with an optional LoRA adapter).
    task: prompts, rollouts and verifier (default: from `config.task`; see `lmrl.tasks`).
    reward_fn: optional `f(prompts: list[str], completions: list[str], **columns) -> list[float]`,
        TRL-style (a math task passes `ground_truth=[...]`); default: `reward.cls`, else the task's
        own verifier.
    callbacks: objects with any of `on_episode_end`, `on_step_end`, `on_checkpoint` (see
        `lmrl.train.callbacks`)."""

    def __init__(self, config: Config, *, model=None, task=None, reward_fn: RewardFn | None = None,
                 callbacks=None):
        self.config = cfg = config
        self.callbacks = CallbackList(callbacks)
        self.dist, self.device = init_distributed(cfg.run.device)
        # distributed.strategy=fsdp: the policy is sharded over the ranks when a stage makes its optimizer
        self.fsdp = self.dist.enabled and cfg.distributed.strategy == "fsdp"
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)  # identical initial weights (and LoRA adapters) on every rank
        if model is None and cfg.model.type == "hf":
            model = build_model(cfg.model, lora=cfg.lora)
        self.task = task if task is not None else build_task(cfg.task, tokenizer=getattr(model, "tokenizer", None),
                                                             reward=cfg.reward, env=cfg.env, device=self.device)
        model = model if model is not None else build_model(cfg.model, self.task.tokenizer.vocab_size)
        self.model = model.to(self.device)
        if cfg.model.init_from:
            ckpt.load_initial_weights(self.model, cfg.model.init_from, self.device)
        self.module, self.reference = self.model, None  # RL may wrap the policy with a value function
        self.optimizer = self.scheduler = None
        self.reward_fn = reward_fn if reward_fn is not None else \
            load_reward_class(cfg.reward.cls) if cfg.reward.cls else None
        self.run_dir = Path(broadcast_object(str(prepare_run_dir(cfg)) if self.dist.is_main else None))
        cfg.run.dir = str(self.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        seed = cfg.run.seed + 7919 * self.dist.rank  # each rank draws its own prompts and samples
        self.generators = {
            "data": torch.Generator().manual_seed(seed),
            "sample": torch.Generator(device=self.device).manual_seed(seed + 1),
        }
        # The warm-up's label budget: `sft.examples` distinct training problems, fixed by the seed.
        pool_gen = torch.Generator().manual_seed(cfg.run.seed)
        self.sft_pool = self.task.sample_distinct_train_ids(cfg.sft.examples, pool_gen) if cfg.sft.steps else None
        self.state = {"step": 0, "stage": "sft" if cfg.sft.steps else "rl", "algo": {},
                      "nonfinite_total": 0, "nonfinite_run": 0, "time": {"sft": 0.0, "rl": 0.0, "eval": 0.0, "wall": 0.0},
                      "warmup_accuracy": None, "best": {"accuracy": -1.0, "step": 0}, "history": []}
        self._stop_requested = False
        self.placement = ""  # where a launcher put this trainer (e.g. its Ray actor's node and GPUs), for the log
        self.log: RunLog | None = None

    # -- public ----------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.config.sft.steps + self.config.train.steps

    def train(self) -> dict:
        cfg = self.config
        self._clock = time.perf_counter()  # wall time is summed over sessions (a resumed run adds on)
        resumed_from = self._maybe_resume()
        if self.dist.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
            self.log = RunLog(self.run_dir, cfg, total_steps=self.total_steps, resume_step=self.state["step"])
            if resumed_from:
                self.log.info(f"resumed from {resumed_from} (step {self.state['step']})")
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            self.log.info(f"run dir {self.run_dir} | {self.model.num_params() / 1e6:.2f}M parameters "
                          f"({trainable / 1e6:.2f}M trainable) | "
                          f"device {self.device} | world size {self.dist.world_size}"
                          + (f" | {self.placement}" if self.placement else ""))
        previous = signal.signal(signal.SIGINT, self._on_sigint) if self._in_main_thread() else None
        try:
            if self.state["stage"] == "sft":
                self._run_sft()
            if self.state["stage"] == "rl" and not self._stop_requested:
                self._run_rl()
            if self._stop_requested:
                self._save_checkpoint()
                self._info(f"interrupted: checkpoint saved at step {self.state['step']}; continue with --resume")
                return {"interrupted": True, "step": self.state["step"]}
            return self._finish()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            if self.log is not None:
                self.log.close()

    # -- stages ----------------------------------------------------------------------------------
    def _run_sft(self):
        from .sft_stage import run_sft_stage

        run_sft_stage(self)

    def _run_rl(self):
        from .rl_stage import run_rl_stage

        run_rl_stage(self)

    def _out_of_time(self) -> bool:
        """`train.time_limit_min` reached (wall time summed over sessions): RL ends here."""
        limit = self.config.train.time_limit_min
        if limit <= 0:
            return False
        self._tick_wall_clock()
        over = torch.tensor([float(self.state["time"]["wall"] >= 60 * limit)], device=self.device)
        if all_reduce_sum(over).item() == 0:  # one decision for every rank (clocks differ a little)
            return False
        self._info(f"time limit of {limit:g} min reached at step {self.state['step']}: stopping RL")
        self.state["stopped_at_time_limit"] = True
        return True

    def _build_rl_modules(self):
        """The algorithm, and what it needs besides the policy: a frozen reference (KL > 0) and a
        value function (PPO), both starting from the policy as RL starts."""
        cfg = self.config
        if cfg.train.rollout_size % (self.dist.world_size * cfg.algo.group_size):
            raise ValueError(f"train.rollout_size={cfg.train.rollout_size} must split into whole groups of "
                             f"algo.group_size={cfg.algo.group_size} on each of {self.dist.world_size} processes")
        self.algo = build_algorithm(cfg.algo, temperature=cfg.train.temperature, ga_steps=cfg.train.ga_steps,
                                    max_new_tokens=self.task.max_new_tokens)
        self.algo.load_state_dict(self.state.get("algo") or {})
        self.reference = None
        if self.algo.needs_reference:
            # With LoRA the reference is the base model: the policy with its adapter switched off.
            self.reference = reference_view(self.model) or copy.deepcopy(self.model).eval().requires_grad_(False)
        self.module = ActorCritic(self.model, cfg.algo.value_model) if self.algo.uses_values else self.model
        if self.algo.uses_values and cfg.reward.model and cfg.algo.value_model == "separate" and not self.state["step"]:
            self.module.init_value_from(self.task.reward.model)  # the critic starts as the reward model
        self.module.to(self.device)

    def _rl_modules(self) -> dict:
        """Modules besides the policy that a checkpoint must hold for an exact resume."""
        extra = {}
        if isinstance(self.module, ActorCritic):
            extra["value"] = self.module.value
        if self.reference is not None and not is_reference_view(self.reference):  # a view has no weights of its own
            extra["reference"] = self.reference
        return extra

    # -- what an algorithm sees of the trainer (algos.base.Learner) ------------------------------
    def optimizer_step(self, loss: torch.Tensor) -> dict:
        """Clip, then step — or skip a non-finite update (see `guarded_step`). Gradients are already accumulated."""
        t = self.config.train
        stats = guarded_step(self.optimizer, self.module.parameters(), loss, self.state, grad_clip=t.grad_clip,
                             max_nonfinite=t.max_nonfinite, device=self.device, ckpt_dir=self.ckpt_dir, info=self._info)
        return {"loss": loss.item(), **stats}

    def no_sync(self, sync: bool):
        """Under DDP (FSDP), gradients are all-reduced (reduce-scattered) only on the micro-batch that says `sync`."""
        if self.fsdp:
            from ..distributed.fsdp import gradient_sync

            return gradient_sync(self.train_model, sync)
        return self.train_model.no_sync() if isinstance(self.train_model, DDP) and not sync else nullcontext()

    @staticmethod
    def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t)

    # -- shared step machinery -------------------------------------------------------------------
    def _make_optimizer(self, lr, weight_decay, steps, schedule, warmup, betas=(0.9, 0.99), eps=1e-8):
        if self.fsdp:  # sharded in place: self.module is its own wrapper, its parameters DTensor shards
            from ..distributed.fsdp import shard

            self.train_model = shard(self.module)
            if self.reference is not None and not is_reference_view(self.reference):
                shard(self.reference, frozen=True)  # the frozen copy is sharded too
        else:
            self.train_model = DDP(self.module) if self.dist.enabled else self.module
        trainable = [p for p in self.module.parameters() if p.requires_grad]  # LoRA: the adapter only
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=betas,
                                           eps=eps)
        self.scheduler = make_scheduler(self.optimizer, total_steps=steps, name=schedule, warmup_steps=warmup,
                                        min_lr_ratio=self.config.schedule.min_lr_ratio)

    def _restore_pending(self):
        """After a resume, load what the stage needs once it exists: optimizer, scheduler, value
        model and reference (when the checkpoint is from within the stage) and every RNG."""
        path, self._resume_path = self._resume_path, None
        if path is None:
            return
        has_optim = (path / "optimizer.pt").exists()
        ckpt.load_checkpoint(path, model=self.model, optimizer=self.optimizer if has_optim else None,
                             scheduler=self.scheduler if has_optim else None, generators=self.generators,
                             map_location=self.device, modules=self._rl_modules() if has_optim else None)
        if self.dist.enabled:  # one file holds rank 0's streams: give every rank its own again
            for i, g in enumerate(self.generators.values()):
                g.manual_seed(self.config.run.seed + 7919 * self.dist.rank + 31 * self.state["step"] + i)

    def _end_step(self, stage: str, metrics: dict, seconds: float, tokens: int):
        cfg = self.config
        self.state["step"] += 1
        self.state["time"][stage] += seconds
        step = self.state["step"]
        world = self.dist.world_size
        metrics.update({"perf/tokens_per_s": tokens * world / max(seconds, 1e-9), "time/step_s": seconds})
        stage_step = step if stage == "sft" else step - cfg.sft.steps
        stage_total = cfg.sft.steps if stage == "sft" else cfg.train.steps
        last = stage_step == stage_total
        if last or (stage == "rl" and stage_step % cfg.train.eval_every == 0):
            metrics.update(self._evaluate())
            if stage == "sft":  # the warm-up's result, which RL is measured against
                self.state["warmup_accuracy"] = metrics["eval/warmup_accuracy"] = metrics["eval/accuracy"]
        if stage_step % cfg.train.log_every == 0 or last or "eval/accuracy" in metrics:
            self._log(step, metrics, stage=stage, stage_step=stage_step, stage_total=stage_total)
        if self.log is not None:
            self.log.advance(step)
        self.callbacks.step_end(self, step, metrics)
        if stage_step % cfg.train.ckpt_every == 0 and not last and self.state["nonfinite_run"] == 0:
            self._save_checkpoint()  # never during a run of skipped updates: the last one stays a good one

    def _tick_wall_clock(self):
        now = time.perf_counter()
        self.state["time"]["wall"] += now - self._clock
        self._clock = now

    def _evaluate(self) -> dict:
        cfg = self.config
        start = time.perf_counter()
        # FSDP: ranks decode different numbers of batches, so the policy is gathered once for all of them
        with self.model.gathered() if self.fsdp else nullcontext():
            metrics = evaluate(self.model, self.task, self.task.heldout_ids[: cfg.eval.size],
                               batch_size=cfg.eval.batch_size, device=self.device, rank=self.dist.rank,
                               world_size=self.dist.world_size)
        self.state["time"]["eval"] += time.perf_counter() - start
        acc, step = metrics["eval/accuracy"], self.state["step"]
        self.state["history"].append([step, acc])
        self.state["last_eval"] = metrics
        key = cfg.train.best_metric or "eval/accuracy"  # what picks checkpoints/best (higher is better)
        if key not in metrics:
            raise ValueError(f"train.best_metric={key!r} is not an eval metric of this task ({', '.join(sorted(metrics))})")
        if self.scheduler is not None:
            self.scheduler.observe(metrics[key])  # schedule.name=plateau; a no-op for the others
        best = self.state["best"].get("value")
        if best is None or metrics[key] > best:
            self.state["best"] = {"accuracy": acc, "step": step, "value": metrics[key]}
            weights = self._weights(self.model)
            if self.dist.is_main:
                ckpt.save_weights(self.ckpt_dir / "best", weights, trainer_state={"step": step, key: metrics[key]})
        return metrics

    def _save_checkpoint(self):
        self._tick_wall_clock()
        self._write_checkpoint()
        barrier()

    def _write_checkpoint(self):
        """Every rank calls it (FSDP gathers the weights and optimizer state); rank 0 writes."""
        in_stage = self.optimizer is not None  # the boundary checkpoint after the warm-up has no optimizer
        model, optimizer, modules = self.model, self.optimizer, self._rl_modules() if in_stage else None
        if self.fsdp:  # whole tensors in place of the sharded modules and optimizer
            from ..distributed.fsdp import full_optimizer_state

            model = self._weights(model)
            modules = {name: self._weights(m) for name, m in modules.items()} if modules else None
            optimizer = full_optimizer_state(optimizer) if optimizer is not None else None
        if not self.dist.is_main:
            return
        path = ckpt.save_checkpoint(self.ckpt_dir, self.state["step"], model=model, optimizer=optimizer,
                                    scheduler=self.scheduler if in_stage else None, generators=self.generators,
                                    trainer_state=self.state, keep=self.config.train.keep_checkpoints,
                                    modules=modules)
        self.callbacks.checkpoint(self, path)

    def _weights(self, module: torch.nn.Module):
        """What a checkpoint writes for `module`: the module, or under FSDP its weights gathered whole
        (every rank takes part; rank 0 gets the tensors)."""
        if not self.fsdp:
            return module
        from ..distributed.fsdp import full_state_dict

        return full_state_dict(module, ckpt.weights_to_save(module))

    def _maybe_resume(self) -> Path | None:
        """With run.resume=auto, load weights and trainer state from the latest checkpoint now; the
        optimizer, scheduler and RNG follow in `_restore_pending` once the stage has built them."""
        self._resume_path = None
        if self.config.run.resume != "auto":
            return None
        latest = ckpt.latest_checkpoint(self.ckpt_dir)
        if latest is None:
            return None
        self.state = ckpt.load_checkpoint(latest, model=self.model, map_location=self.device, restore_rng=False)
        self._resume_path = latest
        return latest

    def _finish(self) -> dict:
        final = self._evaluate_cached()
        self._tick_wall_clock()
        times, warmup = self.state["time"], self.state["warmup_accuracy"]
        summary = {
            "warmup_accuracy": warmup,
            "final_accuracy": final,
            "rl_gain": None if warmup is None else round(final - warmup, 6),
            "best": self.state["best"],
            "start_eval": self.state.get("start_eval", {}), "final_eval": self.state.get("last_eval", {}),
            "sft_examples": 0 if self.sft_pool is None else len(self.sft_pool),
            "sft_steps": self.config.sft.steps,
            "rl_steps": self.config.train.steps,
            "eval_size": min(self.config.eval.size, len(self.task.heldout_ids)),
            # sft / rl: the steps themselves; eval: held-out evaluations; total: wall clock of the run
            "time_s": {"sft": round(times["sft"], 2), "rl": round(times["rl"], 2), "eval": round(times["eval"], 2),
                       "total": round(times["wall"], 2)},
            "nonfinite_skipped": self.state["nonfinite_total"],
            "steps_done": self.state["step"] - self.config.sft.steps,
            "stopped_at_time_limit": bool(self.state.get("stopped_at_time_limit")),
        }
        self._save_checkpoint_final()
        if self.dist.is_main:
            tmp = self.run_dir / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, self.run_dir / "summary.json")
            self._info(f"held-out accuracy: warm-up {summary['warmup_accuracy']:.3f} → final {final:.3f} "
                       f"| {summary['time_s']['total']:.0f}s | summary in {self.run_dir / 'summary.json'}")
        barrier()
        return summary

    def _evaluate_cached(self) -> float:
        history = self.state["history"]
        if history and history[-1][0] == self.state["step"]:
            return history[-1][1]
        metrics = self._evaluate()  # e.g. RL stopped at its time limit between evaluations
        self._log(self.state["step"], metrics, stage=self.state["stage"])
        return metrics["eval/accuracy"]

    def _save_checkpoint_final(self):
        """The last step's checkpoint, unless one was just written (rank 0 decides for every rank)."""
        latest = ckpt.latest_checkpoint(self.ckpt_dir) if self.dist.is_main else None
        if broadcast_object(latest is None or latest.name != f"step_{self.state['step']}"):
            self._write_checkpoint()

    # -- small helpers ---------------------------------------------------------------------------
    def _log(self, step: int, metrics: dict, **console):
        if self.log is not None:
            self.log.log(step, metrics, **console)

    def _info(self, msg: str):
        if self.log is not None:
            self.log.info(msg)

    def _on_sigint(self, signum, frame):
        if self._stop_requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self._stop_requested = True
        self._info("Ctrl-C: finishing this step, then saving a checkpoint (press again to stop at once)")

    @staticmethod
    def _in_main_thread() -> bool:
        import threading

        return threading.current_thread() is threading.main_thread()
