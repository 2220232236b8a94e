"""Ray for `distributed.backend: ray`: finding the package, joining a cluster, and the CLI's launch.

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

`ray` is an optional dependency (`pip install 'lmrl[ray]'`), imported only here and in
`ray_engine`, only when asked for.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time

from ..config import ConfigError


class RayMissing(ConfigError, ImportError):
    """`distributed.backend=ray` without the ray package: a config problem (the CLI prints one line)
    that is also an ImportError, for code that checks for missing packages that way."""


def require_ray():
    """The `ray` module, or a one-line error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissing("distributed.backend=ray (rollout.workers > 0) needs Ray, which is not installed: "
                         "pip install 'lmrl[ray]' (or set distributed.backend=torch rollout.workers=0)") from None
    return ray


def connect(dist_cfg, *, cpus_needed: float = 0) -> bool:
    """Joins Ray unless this process already has. An empty `distributed.address` starts a local
    Ray with at least `cpus_needed` CPUs (Ray would otherwise count the machine's cores and leave
    actors waiting forever on a small machine); any other address is joined within
    `connect_timeout_s`, or a `ConfigError` names it. Returns whether this call started Ray (so the
    caller knows it owns the shutdown)."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    if not dist_cfg.address:
        ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)), include_dashboard=False,
                 log_to_driver=True)
        return True
    _join(ray, dist_cfg.address, dist_cfg.connect_timeout_s)
    return True


def _join(ray, address: str, timeout_s: float) -> None:
    """`ray.init(address=...)`, which retries an unreachable head for minutes, bounded by
    `timeout_s`: a TCP probe of host:port first (a dead address fails in seconds), then the join
    itself in a thread that is abandoned when the time is up."""
    hint = "start a cluster there with `ray start --head`, or leave distributed.address empty for a local Ray"
    deadline = time.monotonic() + timeout_s
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address != "auto" and host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except OSError as e:
            raise ConfigError(f"distributed.address={address}: no Ray cluster reachable within {timeout_s:g}s "
                              f"({e.__class__.__name__}: {e}); {hint}") from None
    outcome: list = []

    def join():
        try:
            outcome.append(ray.init(address=address, log_to_driver=True))
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    thread = threading.Thread(target=join, name="lmrl-ray-connect", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not outcome:
        raise ConfigError(f"distributed.address={address}: Ray did not answer within {timeout_s:g}s "
                          f"(distributed.connect_timeout_s); {hint}")
    if isinstance(outcome[0], BaseException):
        raise ConfigError(f"distributed.address={address}: could not join Ray ({outcome[0]}); {hint}") from outcome[0]


class _Learner:
    """The Ray actor that runs a whole trainer (see `train_with_ray`). It is threaded (two calls at
    once) so that `stop` can reach a running `train`: Ray cannot interrupt a running actor call."""

    def __init__(self, cwd: str):
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative run dirs and data paths mean what they mean on the command line
        self.trainer = None

    def train(self, cfg) -> dict:
        import ray

        from ..train.trainers import build_trainer

        if cfg.run.device == "auto":  # the GPUs Ray gave this actor, never one it did not reserve
            cfg.run.device = actor_device(ray)
        self.trainer = build_trainer(cfg)
        self.trainer.placement = f"learner: {placement(ray, cfg.run.device)}"
        return self.trainer.train()

    def stop(self) -> None:
        """The driver's Ctrl-C, as the trainer's own: finish this step, save a checkpoint, return."""
        if self.trainer is not None:
            self.trainer.request_stop()


def train_with_ray(cfg) -> dict:
    """The CLI's run for `distributed.backend=ray`: the learner in a Ray actor with
    `distributed.learner_gpus` / `learner_cpus`, its rollout workers beside it. Returns the run's
    summary; the learner's exception, if any, is raised here as it was raised there. A first
    Ctrl-C stops the run after the current step with a checkpoint; a second kills the learner."""
    ray = require_ray()
    d, r = cfg.distributed, cfg.rollout
    started = connect(d, cpus_needed=d.learner_cpus + r.workers * r.worker_cpus)
    learner = None
    try:
        check_resources(ray, learner=(d.learner_cpus, d.learner_gpus), workers=(r.workers, r.worker_cpus, r.worker_gpus))
        actor = ray.remote(num_cpus=d.learner_cpus, num_gpus=d.learner_gpus, max_concurrency=2)(_Learner)
        learner = actor.remote(os.getcwd())
        run = learner.train.remote(cfg)
        try:
            return ray.get(run)
        except KeyboardInterrupt:
            learner.stop.remote()
            return ray.get(run)
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


def actor_device(ray) -> str:
    """The device of a Ray actor: "cuda" when Ray gave it GPUs and torch can use them, else "cpu".
    (A cluster may declare GPUs that this torch cannot see, e.g. a CPU build: the actor then runs on
    the CPU rather than failing.)"""
    import torch

    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


def placement(ray, device) -> str:
    """Where this Ray actor runs, for the run's log: node, the GPU ids Ray gave it, its device."""
    node = ray.get_runtime_context().get_node_id()
    gpus = ",".join(str(g) for g in ray.get_gpu_ids()) or "none"
    return f"Ray node {node[:12]}, GPU ids {gpus}, device {device}"


def check_resources(ray, *, learner=(0.0, 0.0), workers=(0, 0.0, 0.0)) -> None:
    """Refuses a request the cluster can never grant (Ray would leave the actors pending forever):
    GPUs on a cluster without any, or more CPUs than it has. `learner` is (cpus, gpus), `workers`
    (count, cpus each, gpus each). An autoscaling cluster is judged by the nodes it has now."""
    have = ray.cluster_resources()
    n, cpus, gpus = workers
    need_cpu, need_gpu = learner[0] + n * cpus, learner[1] + n * gpus
    if need_gpu > have.get("GPU", 0) + 1e-9:
        raise ConfigError(f"distributed.learner_gpus={learner[1]:g} + rollout.workers={n} x rollout.worker_gpus={gpus:g} "
                          f"ask for {need_gpu:g} GPUs; the Ray cluster has {have.get('GPU', 0):g}")
    if need_cpu > have.get("CPU", 0) + 1e-9:
        raise ConfigError(f"distributed.learner_cpus={learner[0]:g} + rollout.workers={n} x rollout.worker_cpus={cpus:g} "
                          f"ask for {need_cpu:g} CPUs; the Ray cluster has {have.get('CPU', 0):g} "
                          f"(lower rollout.worker_cpus, e.g. 0.5, or add nodes)")
