"""The CLI's launch for `distributed.backend: ray`: the whole learner in a Ray actor.

Two ways in:

- `lmrl train adder distributed.backend=ray rollout.workers=2` (the CLI, `train_with_ray`): the
  driver joins Ray and runs the learner — the whole `RLTrainer` — inside a Ray actor that asks for
  `distributed.learner_gpus` GPUs and `learner_cpus` CPUs, and waits for it. Putting the learner
  in an actor is what makes GPU fractions work: with `learner_gpus=0.5` and `rollout.worker_gpus=0.5`
  Ray packs the learner and one worker onto one GPU (colocated); with whole numbers they land on
  different GPUs or nodes (split). The learner's errors come back to the driver as the same types
  (a `TrainingError` is still a `TrainingError`), so the CLI reports them as it does any run's.
- `RLTrainer(cfg).train()` from Python with the same config: the learner stays in the calling
  process (its own device, as `run.device` says) and only the rollout workers are Ray actors.

Either way the run dir, `model.path` and data files are read and written with the driver's working
directory (actors are moved there), so relative paths mean what they mean on the command line; on
a multi-node cluster they must be on a filesystem every node sees.

Joining the cluster and placing actors is `ray_cluster`'s.
"""

from __future__ import annotations

import os
import signal
import threading

from ..train.trainers import build_trainer
from ..parallel.ray_cluster import actor_device, check_resources, connect, placement, require_ray


class _Learner:
    """The Ray actor that runs a whole trainer (see `train_with_ray`). It is threaded (two calls at
    once) so that `stop` can reach a running `train`: Ray cannot interrupt a running actor call."""

    def __init__(self, cwd: str):
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative run dirs and data paths mean what they mean on the command line
        self.trainer = None

    def train(self, cfg) -> dict:
        import ray

        if cfg.run.device == "auto":  # the GPUs Ray gave this actor, never one it did not reserve
            cfg.run.device = actor_device(ray)
        self.trainer = build_trainer(cfg)
        self.trainer.placement = f"learner: {placement(ray, cfg.run.device)}"
        return self.trainer.train()

    def stop(self, signal_name: str = "SIGINT") -> None:
        """The driver's Ctrl-C or SIGTERM, as the trainer's own: finish this step, save a checkpoint, return."""
        if self.trainer is not None:
            self.trainer.request_stop(signal_name)


def train_with_ray(cfg) -> dict:
    """The CLI's run for `distributed.backend=ray`: the learner in a Ray actor with
    `distributed.learner_gpus` / `learner_cpus`, its rollout workers beside it. Returns the run's
    summary; the learner's exception, if any, is raised here as it was raised there. A first
    Ctrl-C or SIGTERM stops the run after the current step with a checkpoint; a second Ctrl-C kills
    the learner (a second SIGTERM changes nothing)."""
    ray = require_ray()
    d, r = cfg.distributed, cfg.rollout
    started = connect(d, cpus_needed=d.learner_cpus + r.workers * r.worker_cpus)
    learner = None
    try:
        check_resources(ray, learner=(d.learner_cpus, d.learner_gpus), workers=(r.workers, r.worker_cpus, r.worker_gpus))
        actor = ray.remote(num_cpus=d.learner_cpus, num_gpus=d.learner_gpus, max_concurrency=2)(_Learner)
        learner = actor.remote(os.getcwd())
        run = learner.train.remote(cfg)
        terminated = []

        def on_sigterm(signum, frame):  # as Ctrl-C, once
            if not terminated:
                terminated.append(True)
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_sigterm) \
            if threading.current_thread() is threading.main_thread() else None
        try:
            try:
                return ray.get(run)
            except KeyboardInterrupt:
                learner.stop.remote("SIGTERM" if terminated else "SIGINT")
                return ray.get(run)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)  # the learner's own exception, e.g. a TrainingError
        if not isinstance(cause, Exception):
            raise
        raise cause from e  # the chain keeps the learner's traceback
    finally:
        if learner is not None:
            ray.kill(learner)
        if started:
            ray.shutdown()
