"""The loop the offline trainers share (SFT, DPO, reward model): epochs over a JSONL data set with
the production features every trainer gets the same way.

    trainer = DPOTrainer(load_config("dpo-smollm2"))
    summary = trainer.train()    # {"best": {...}, "final": {...}, "steps_done": ..., "time_s": ...}

A subclass says what a row is and what its loss is: `encode(path) -> rows` (called for
data.train_file and data.eval_file), `collate(rows) -> batch` and `compute_loss(batch) -> (loss,
metrics)`; evaluation averages `compute_loss`'s metrics over the held-out rows. Everything else is
here: AdamW on the trainable parameters, the LR schedule (constant / linear / cosine / plateau),
gradient accumulation and clipping, non-finite losses skipped and counted, validation every
`train.eval_every` steps, the best model kept in `checkpoints/best/` by `train.best_metric`, early
stopping (`train.patience`, `train.early_stop_threshold`), atomic checkpoints that resume exactly
(`run.resume=auto`), the resolved config, train.log, metrics.jsonl, TensorBoard, and summary.json.

The data order is a pure function of (seed, epoch): step k reads rows k·B .. (k+1)·B − 1 of the
stream of per-epoch permutations, so a resumed run reads exactly the rows it would have read, and
nothing about the order has to be saved."""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import Config, save_config
from ..distributed.ddp import barrier, broadcast_object, init_distributed
from . import checkpoint as ckpt
from .guarded_step import guarded_step
from .run_dir import RunLog, prepare_run_dir
from ..schedules import make_scheduler


def free_memory(device: torch.device) -> None:
    """Between phases (after an evaluation, before an export): drop what Python still holds and hand
    the GPU's cached blocks back, so the next phase does not start fragmented."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def lower_is_better(metric: str) -> bool:
    return "loss" in metric


class OfflineTrainer:
    """Subclasses set `name` (the metrics' prefix: sft, dpo, rm), `accuracy_key` (the training
    metric that evaluation also reports as eval/accuracy), and implement `encode`, `collate`,
    `compute_loss`; they build `self.model` (and anything else) before calling `_setup`."""

    name = "train"
    accuracy_key: str | None = None
    default_best_metric = "eval/accuracy"

    def _setup(self, config: Config) -> None:
        """Run dir, seeds, data; call from the subclass's __init__ once `self.model` exists."""
        cfg = self.config = config
        self.dist, self.device = init_distributed(cfg.run.device)
        self.fsdp = self.dist.enabled and cfg.distributed.strategy == "fsdp"  # sharded when training starts
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.model.to(self.device)
        if cfg.data.batch_size % (self.dist.world_size * cfg.train.ga_steps):
            raise ValueError(f"data.batch_size={cfg.data.batch_size} must split evenly over {self.dist.world_size} "
                             f"processes x train.ga_steps={cfg.train.ga_steps} micro-batches")
        self.run_dir = Path(broadcast_object(str(prepare_run_dir(cfg)) if self.dist.is_main else None))
        cfg.run.dir = str(self.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.train_rows = self.encode(cfg.data.train_file)
        if not self.train_rows:
            raise ValueError(f"data.train_file={cfg.data.train_file} holds no rows")
        self.eval_rows = self.encode(cfg.data.eval_file) if cfg.data.eval_file else []
        if cfg.data.eval_size:
            self.eval_rows = self.eval_rows[: cfg.data.eval_size]
        self.best_metric = cfg.train.best_metric or self.default_best_metric
        self.generators = {"data": torch.Generator().manual_seed(cfg.run.seed)}
        self.state = {"step": 0, "nonfinite_total": 0, "nonfinite_run": 0, "evals_without_gain": 0,
                      "best": {"value": None, "step": 0}, "history": [], "stopped_early": False,
                      "time": {"train": 0.0, "eval": 0.0, "wall": 0.0}}
        self.optimizer = self.scheduler = None
        self.train_model = self.trainable_module()  # wrapped by DDP when training starts under torchrun
        self.log: RunLog | None = None
        self._stop_requested = False

    # -- what a subclass provides ------------------------------------------------------------------
    def encode(self, path: str) -> list:
        raise NotImplementedError

    def collate(self, rows: list):
        raise NotImplementedError

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def export(self, out_dir: Path, model: torch.nn.Module) -> Path | None:
        """Write `model` (the trained model) where users load it from (None: the checkpoints are the model)."""
        return None

    def fresh_model(self) -> torch.nn.Module:
        """The model as training started, built again from the config: under FSDP, rank 0 loads the
        trained weights into it to export them (shards cannot be saved as a transformers model)."""
        raise NotImplementedError(f"{type(self).__name__} cannot export under distributed.strategy=fsdp")

    def frozen_modules(self) -> list[torch.nn.Module]:
        """Modules with weights of their own that never train (DPO's reference copy): FSDP shards them too."""
        return []

    def trainable_module(self) -> torch.nn.Module:
        return self.model

    def _call(self) -> torch.nn.Module:
        """What runs the trained model's forward: its DDP wrapper while training, else the model."""
        return self.train_model if self.model.training else self.model

    # -- the loop ----------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        cfg = self.config
        if cfg.train.max_steps:
            return cfg.train.max_steps
        return max(1, math.ceil(cfg.data.epochs * len(self.train_rows) / cfg.data.batch_size))

    def train(self) -> dict:
        cfg = self.config
        self._clock = time.perf_counter()
        module = self.trainable_module()
        if self.fsdp:  # sharded in place: the module is its own wrapper, its parameters DTensor shards
            from ..distributed.fsdp import shard

            self.train_model = shard(module)
            for frozen in self.frozen_modules():
                shard(frozen, frozen=True)
        else:
            self.train_model = DDP(module) if self.dist.enabled else module
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                           betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
        s = cfg.schedule
        self.scheduler = make_scheduler(self.optimizer, total_steps=self.total_steps, name=s.name,
                                        warmup_steps=s.warmup_steps, min_lr_ratio=s.min_lr_ratio,
                                        plateau_mode="min" if lower_is_better(self.best_metric) else "max",
                                        plateau_factor=s.plateau_factor, plateau_patience=s.plateau_patience)
        resumed = self._maybe_resume()
        if self.dist.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
            self.log = RunLog(self.run_dir, cfg, total_steps=self.total_steps, resume_step=self.state["step"])
            if resumed:
                self.log.info(f"resumed from {resumed} (step {self.state['step']})")
            n_train = sum(p.numel() for p in trainable)
            self.log.info(f"{self.name} | run dir {self.run_dir} | {len(self.train_rows)} training rows, "
                          f"{len(self.eval_rows)} held-out | {n_train / 1e6:.2f}M trainable parameters | "
                          f"{self.total_steps} steps | device {self.device}")
            for note in getattr(self, "data_notes", []):
                self.log.info(note)
        previous = signal.signal(signal.SIGINT, self._on_sigint) if threading.current_thread() is threading.main_thread() \
            else None
        try:
            while self.state["step"] < self.total_steps and not self._stop_requested and not self.state["stopped_early"]:
                self._train_step()
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

    def _batch_rows(self, step: int) -> list:
        """This rank's rows of optimizer step `step` (0-based): a contiguous slice of the global batch."""
        cfg, n = self.config, len(self.train_rows)
        size = cfg.data.batch_size
        per_rank = size // self.dist.world_size
        start = step * size + self.dist.rank * per_rank
        rows, perms = [], {}
        for i in range(start, start + per_rank):
            epoch, offset = divmod(i, n)
            if epoch not in perms:
                perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + epoch))
            rows.append(self.train_rows[perms[epoch][offset].item()])
        return rows

    def _train_step(self) -> None:
        cfg = self.config
        t0 = time.perf_counter()
        self.model.train()
        rows = self._batch_rows(self.state["step"])
        ga = cfg.train.ga_steps
        micro = max(1, math.ceil(len(rows) / ga))
        chunks = [rows[i:i + micro] for i in range(0, len(rows), micro)]
        total, sums = torch.zeros((), device=self.device), {}
        for k, chunk in enumerate(chunks):
            sync = k == len(chunks) - 1  # DDP all-reduces gradients on the last micro-batch only
            with self._no_sync(sync):
                loss, metrics = self.compute_loss(self.collate(chunk))
                (loss * len(chunk) / len(rows)).backward()
            total += loss.detach() * len(chunk) / len(rows)
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + v * len(chunk) / len(rows)
        lr = self.optimizer.param_groups[0]["lr"]
        sums.update({f"{self.name}/{k}": v for k, v in self._optimizer_step(total).items()})
        self.scheduler.step()
        sums[f"{self.name}/lr"] = lr
        self._end_step(sums, time.perf_counter() - t0)

    def _no_sync(self, sync: bool):
        if self.fsdp:
            from ..distributed.fsdp import gradient_sync

            return gradient_sync(self.train_model, sync)
        return self.train_model.no_sync() if isinstance(self.train_model, DDP) and not sync else nullcontext()

    def _optimizer_step(self, loss: torch.Tensor) -> dict:
        t = self.config.train
        return guarded_step(self.optimizer, (p for p in self.trainable_module().parameters() if p.requires_grad), loss,
                            self.state, grad_clip=t.grad_clip, max_nonfinite=t.max_nonfinite, device=self.device,
                            ckpt_dir=self.ckpt_dir, info=self._info)

    def _end_step(self, metrics: dict, seconds: float) -> None:
        cfg = self.config
        self.state["step"] += 1
        self.state["time"]["train"] += seconds
        step, last = self.state["step"], self.state["step"] == self.total_steps
        metrics["time/step_s"] = seconds
        if self.eval_rows and (step % cfg.train.eval_every == 0 or last):
            metrics.update(self._evaluate())
        if step % cfg.train.log_every == 0 or last or any(k.startswith("eval/") for k in metrics):
            self._log(step, metrics, stage=self.name, stage_step=step, stage_total=self.total_steps)
        if self.log is not None:
            self.log.advance(step)
        if step % cfg.train.ckpt_every == 0 and not last and self.state["nonfinite_run"] == 0:
            self._save_checkpoint()

    # -- evaluation, best model, early stopping ----------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """The training metrics averaged over the held-out rows (weighted by rows), as eval/<name>,
        plus eval/accuracy from `accuracy_key`."""
        self.model.eval()
        size = max(1, self.config.data.batch_size // self.config.train.ga_steps)
        sums, n = {}, 0
        for i in range(0, len(self.eval_rows), size):
            chunk = self.eval_rows[i:i + size]
            loss, metrics = self.compute_loss(self.collate(chunk))
            metrics = {**metrics, f"{self.name}/loss": loss.item()}
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + v * len(chunk)
            n += len(chunk)
        out = {"eval/" + key.removeprefix(f"{self.name}/"): v / n for key, v in sums.items()}
        if self.accuracy_key is not None:
            out["eval/accuracy"] = sums[self.accuracy_key] / n
        return out

    def _evaluate(self) -> dict:
        start = time.perf_counter()
        metrics = self.evaluate()
        free_memory(self.device)
        self.state["time"]["eval"] += time.perf_counter() - start
        if self.best_metric not in metrics:
            raise ValueError(f"train.best_metric={self.best_metric!r} is not an eval metric of the {self.name} "
                             f"trainer (it reports {', '.join(sorted(metrics))})")
        value, step = metrics[self.best_metric], self.state["step"]
        self.state["history"].append([step, value])
        best = self.state["best"]["value"]
        sign = -1.0 if lower_is_better(self.best_metric) else 1.0
        if best is None or sign * (value - best) > self.config.train.early_stop_threshold:
            self.state["best"] = {"value": value, "step": step}
            self.state["evals_without_gain"] = 0
            weights = self._weights()
            if self.dist.is_main:
                ckpt.save_weights(self.ckpt_dir / "best", weights, trainer_state={"step": step, self.best_metric: value})
        else:
            self.state["evals_without_gain"] += 1
            patience = self.config.train.patience
            if patience and self.state["evals_without_gain"] >= patience:
                self.state["stopped_early"] = True
                self._info(f"early stop at step {step}: {self.best_metric} has not improved on "
                           f"{self.state['best']['value']:.4f} (step {self.state['best']['step']}) for {patience} evaluations")
        self.scheduler.observe(value)
        return metrics

    # -- checkpoints and the end -------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        self._tick()
        self._save_checkpoint_now()
        barrier()

    def _weights(self):
        """What a checkpoint writes for the model: the model, or under FSDP its weights gathered whole
        (every rank takes part; rank 0 gets the tensors)."""
        if not self.fsdp:
            return self.model
        from ..distributed.fsdp import full_state_dict

        return full_state_dict(self.model, ckpt.weights_to_save(self.model))

    def _maybe_resume(self) -> Path | None:
        if self.config.run.resume != "auto":
            return None
        latest = ckpt.latest_checkpoint(self.ckpt_dir)
        if latest is None:
            return None
        self.state = ckpt.load_checkpoint(latest, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                          generators=self.generators, map_location=self.device)
        return latest

    def _finish(self) -> dict:
        final = self._evaluate() if self.eval_rows and not self._evaluated_now() else {}
        if final:
            self._log(self.state["step"], final, stage=self.name)
        self._tick()
        best = self.state["best"]
        exported_step = self.state["step"]
        final = self.ckpt_dir / f"step_{self.state['step']}"
        latest = ckpt.latest_checkpoint(self.ckpt_dir) if self.dist.is_main else None
        if broadcast_object(latest != final):  # rank 0 decides for every rank (FSDP gathers on all of them)
            self._save_checkpoint_now()
        barrier()
        exported = final / ckpt.MODEL_FILE
        if best["value"] is not None and best["step"] != self.state["step"]:
            exported, exported_step = self.ckpt_dir / "best" / ckpt.MODEL_FILE, best["step"]
        if self.fsdp:  # every rank takes its shard of the exported weights; rank 0 writes them from a fresh copy
            if exported_step != self.state["step"]:
                ckpt.load_weights(self.model, exported, self.device)
            if self.dist.is_main:
                model = self.fresh_model()  # on the CPU: the device holds the sharded model
                ckpt.load_weights(model, exported)
                free_memory(self.device)
                out = self.export(self.run_dir, model)
        elif self.dist.is_main:
            if exported_step != self.state["step"]:
                ckpt.load_weights(self.model, exported, self.device)
            free_memory(self.device)
            out = self.export(self.run_dir, self.model)
        times = self.state["time"]
        summary = {
            "trainer": self.name,
            "train_rows": len(self.train_rows), "eval_rows": len(self.eval_rows),
            "steps_done": self.state["step"], "steps_planned": self.total_steps,
            "stopped_early": self.state["stopped_early"],
            "best_metric": self.best_metric, "best": best,
            "final": dict(self.state.get("last_eval", {})),
            "exported": None if not self.dist.is_main or out is None else str(out),
            "exported_step": exported_step,
            "nonfinite_skipped": self.state["nonfinite_total"],
            "time_s": {k: round(v, 2) for k, v in times.items()},
        }
        if self.dist.is_main:
            tmp = self.run_dir / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, self.run_dir / "summary.json")
            best_text = "" if best["value"] is None else f"best {self.best_metric} {best['value']:.4f} at step {best['step']} | "
            self._info(f"{self.name} done: {best_text}{times['wall']:.0f}s | summary in {self.run_dir / 'summary.json'}")
        barrier()
        return summary

    def _evaluated_now(self) -> bool:
        history = self.state["history"]
        return bool(history) and history[-1][0] == self.state["step"]

    def _save_checkpoint_now(self) -> None:
        """Every rank calls it (FSDP gathers the weights and optimizer state); rank 0 writes."""
        weights, optimizer = self._weights(), self.optimizer
        if self.fsdp:
            from ..distributed.fsdp import full_optimizer_state

            optimizer = full_optimizer_state(optimizer)
        if self.dist.is_main:
            ckpt.save_checkpoint(self.ckpt_dir, self.state["step"], model=weights, optimizer=optimizer,
                                 scheduler=self.scheduler, generators=self.generators, trainer_state=self.state,
                                 keep=self.config.train.keep_checkpoints)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.state["time"]["wall"] += now - self._clock
        self._clock = now

    def _log(self, step: int, metrics: dict, **console) -> None:
        if any(k.startswith("eval/") for k in metrics):
            self.state["last_eval"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        if self.log is not None:
            self.log.log(step, metrics, **console)

    def _info(self, msg: str) -> None:
        if self.log is not None:
            self.log.info(msg)

    def _on_sigint(self, signum, frame) -> None:
        if self._stop_requested:
            raise KeyboardInterrupt
        self._stop_requested = True
        self._info("Ctrl-C: finishing this step, then saving a checkpoint (press again to stop at once)")
