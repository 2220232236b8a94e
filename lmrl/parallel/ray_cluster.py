"""Ray for `distributed.backend: ray`: finding the package, joining a cluster, placing actors.

`ray` is an optional dependency (`pip install 'lmrl[ray]'`), imported only through `require_ray`,
only when asked for. `ray_engine` (the rollout workers) and `ray_launch` (the CLI's learner actor)
build on this module.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time

import torch

from ..common.errors import ConfigError


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


def actor_device(ray) -> str:
    """The device of a Ray actor: "cuda" when Ray gave it GPUs and torch can use them, else "cpu".
    (A cluster may declare GPUs that this torch cannot see, e.g. a CPU build: the actor then runs on
    the CPU rather than failing.)"""
    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


def placement(ray, device) -> str:
    """Where this Ray actor runs, for the run's log: node, the GPU ids Ray gave it, its device, its
    process, the resources it holds (a GPU fraction when colocated) and the CUDA_VISIBLE_DEVICES Ray
    set for it (what CUDA in the actor sees as device 0, 1, ...)."""
    context = ray.get_runtime_context()
    node = context.get_node_id()
    gpus = ",".join(str(g) for g in ray.get_gpu_ids()) or "none"
    held = " ".join(f"{name} {amount:g}" for name, amount in sorted(context.get_assigned_resources().items()))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"Ray node {node[:12]}, GPU ids {gpus}, device {device}, pid {os.getpid()}, resources {held or 'none'}, "
            f"CUDA_VISIBLE_DEVICES {'unset' if visible is None else visible or 'empty'}")


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
