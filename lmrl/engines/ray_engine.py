"""Rollouts on Ray actors: each step's batch split across `rollout.workers` copies of the policy.

    engine = RayRolloutEngine(config, task, build_worker=build, group_size=G, info=log, ckpt_dir=d)  # joins Ray
    engine.sync(policy, version)            # one ray.put of the trainable weights, loaded by every worker
    sampled = engine.submit(ids, sampling=Sampling(temperature=1.0), generator=g).result()
    engine.close()

`make_engine` builds this engine when `rollout.workers > 0`; the learner (the trainer, in the
calling process or in a Ray actor: see `ray_launch`) scores and updates, the workers only sample.

- **Weights.** A worker builds its own task and model with `build_worker(device)`, the builder the
  trainer hands over (`lmrl.train.build.build_worker_parts` bound to the run's config: the
  trainer's own build, same seed, so a LoRA adapter's frozen base is the same; this layer never
  imports the trainers), and then only ever receives the trainable parameters (all of them, or
  the adapter's): one `ray.put` per learner update, shared by every worker. Calls to one actor
  run in the order they were made, so a worker loads new weights only between rollouts and the
  next rollout always sees them: `sync` never waits.
- **Sharding.** The batch is cut on group boundaries (`algo.group_size` rows of one prompt stay on
  one worker, where group baselines expect them) into near-equal contiguous shards, and the
  results are joined back in the same order. Worker i samples with seed `draw_seed(sample) + i`,
  so a run is reproducible from its seed whatever the timing — but it samples other completions
  than an in-process run would (statistically the same, not bit-identical).
- **Failures.** A worker that dies, or whose shard is not back within `rollout.timeout_s`, is
  killed and replaced (a new actor with the weights that shard was asked with) and its shard is
  resampled with the same seed, up to `rollout.max_restarts` times per shard and step. Then the
  run stops with a `TrainingError` that names the worker and the reason; checkpoints already
  written are untouched. Nothing waits without a time limit.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F

from ..common.errors import TrainingError
from .local import Sampled, draw_seed, load_state_into, rollout_to, trainable_state
from ..generation.rollout import Rollout
from ..generation.sampling import Sampling
from ..parallel.ray_cluster import actor_device, check_resources, connect, placement, require_ray

START_TIMEOUT_S = 300.0  # the least a new worker gets to build its policy (see RayRolloutEngine.await_start)


class RolloutWorker:
    """One copy of the policy that samples shards of a batch (a Ray actor: see `start_worker`).
    It runs on the GPU Ray gave it, else on the CPU with `rollout.worker_cpus` torch threads, and
    builds its task and policy there with `build_worker(device)` (an object with `.task`, `.model`)."""

    def __init__(self, cfg, build_worker: Callable, cwd: str | None = None):
        import ray

        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)  # model.path and data files relative to the driver's working directory
        torch.set_num_threads(max(1, int(cfg.rollout.worker_cpus)))
        self.device = torch.device(actor_device(ray))
        parts = build_worker(self.device)
        self.task, self.model = parts.task, parts.model
        self._trainable = [name for name, p in self.model.named_parameters() if p.requires_grad]
        self.model.eval().requires_grad_(False)
        self.version = -1

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        load_state_into(self.model, state)
        self.version = version

    def rollout(self, ids: torch.Tensor, seed: int, sampling: Sampling, greedy: bool = False) -> Rollout:
        """The task's rollout of problems `ids`, sampled as `sampling` says from a generator seeded with
        `seed` (or greedy), returned on the CPU."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        ro = self.task.rollout(self.model, ids, **sampling.rollout_keywords(), greedy=greedy, generator=gen)
        return rollout_to(ro, "cpu")

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters the learner trains, as this copy has them now (CPU)."""
        params = dict(self.model.named_parameters())
        return {name: params[name].detach().to("cpu", copy=True) for name in self._trainable}

    def ping(self) -> int:
        return self.version

    def where(self) -> str:
        import ray

        return placement(ray, self.device)


def start_worker(cfg, build_worker: Callable):
    """A new `RolloutWorker` actor with `rollout.worker_cpus` CPUs and `rollout.worker_gpus` GPUs that
    builds its task and policy with `build_worker` (picklable: a module-level function or a partial)."""
    ray = require_ray()
    r = cfg.rollout
    actor = ray.remote(num_cpus=r.worker_cpus, num_gpus=r.worker_gpus, max_restarts=0)(RolloutWorker)
    return actor.remote(cfg, build_worker, os.getcwd())


def group_shards(n_rows: int, group_size: int, n_shards: int) -> list[slice]:
    """Contiguous row ranges holding whole groups, as equal as can be (the first ones one group
    larger); empty ranges are left out."""
    base, extra = divmod(n_rows // group_size, n_shards)
    shards, start = [], 0
    for k in range(n_shards):
        stop = start + (base + (k < extra)) * group_size
        if stop > start:
            shards.append(slice(start, stop))
        start = stop
    return shards


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """The shards' rollouts as one, in order. Text rollouts differ in width: prompts are left-padded
    and completions right-padded to the widest with `pad_id` (log-probs 0, masks 0), as one
    in-process batch would be. Fields a subclass adds (an AgentRollout's rewards, infos,
    transcripts) are joined row-wise too."""
    if len(parts) == 1:
        return parts[0]
    P = max(r.prompts.size(1) for r in parts)
    N = max(r.completions.size(1) for r in parts)
    left = lambda t, value: F.pad(t, (P - t.size(1), 0), value=value)  # noqa: E731
    right = lambda t, value: F.pad(t, (0, N - t.size(1)), value=value)  # noqa: E731
    joined = {"prompts": torch.cat([left(r.prompts, pad_id) for r in parts]),
              "completions": torch.cat([right(r.completions, pad_id) for r in parts]),
              "mask": torch.cat([right(r.mask, 0) for r in parts])}
    if all(r.logprobs is not None for r in parts):
        joined["logprobs"] = torch.cat([right(r.logprobs, 0.0) for r in parts])
    if all(r.truncated is not None for r in parts):
        joined["truncated"] = torch.cat([r.truncated for r in parts])
    if any(r.prompt_mask is not None or r.prompts.size(1) < P for r in parts):
        masks = [r.prompt_mask if r.prompt_mask is not None else torch.ones_like(r.prompts) for r in parts]
        joined["prompt_mask"] = torch.cat([left(m, 0) for m in masks])
    base = {f.name for f in dataclasses.fields(Rollout)}
    for f in dataclasses.fields(parts[0]):
        values = [getattr(r, f.name) for r in parts]
        if f.name in base or values[0] is None:
            continue
        if isinstance(values[0], torch.Tensor):
            joined[f.name] = torch.cat(values)
        elif isinstance(values[0], list):
            joined[f.name] = [v for value in values for v in value]
    return dataclasses.replace(parts[0], **joined)


class RayRolloutEngine:
    """The `RolloutEngine` of `rollout.workers` Ray actors (see the module docstring); each builds its
    task and policy with `build_worker(device)`."""

    def __init__(self, config, task, *, build_worker: Callable, group_size: int, info, ckpt_dir):
        self.ray = ray = require_ray()
        self.config, self.build_worker, self.info, self.ckpt_dir = config, build_worker, info, ckpt_dir
        r, d = self.config.rollout, self.config.distributed
        self._owns_ray = connect(d, cpus_needed=d.learner_cpus + r.workers * r.worker_cpus)
        check_resources(ray, workers=(r.workers, r.worker_cpus, r.worker_gpus))
        self.group_size = group_size
        tokenizer = getattr(task, "tokenizer", None)
        self.pad_id = getattr(tokenizer, "pad_token_id", None) or 0
        self.version, self.state_ref = -1, None
        self.workers = [start_worker(self.config, build_worker) for _ in range(r.workers)]
        self.loads: list = [None] * r.workers  # each worker's last load_weights call (its errors surface)
        try:  # a worker that cannot start (or get its resources) fails here, not at the first batch
            self.await_start(self.workers)
        except BaseException:
            self.close()
            raise
        for i, where in enumerate(ray.get([w.where.remote() for w in self.workers])):
            info(f"rollout worker {i}: {where}")

    def await_start(self, workers: list) -> None:
        """Waits for new workers to have built their policy: `rollout.timeout_s` counts rollouts
        only, and building a model from disk may take longer, so this waits at least 5 minutes."""
        limit = max(self.config.rollout.timeout_s, START_TIMEOUT_S)
        try:
            self.ray.get([w.ping.remote() for w in workers], timeout=limit)
        except self.ray.exceptions.GetTimeoutError:
            raise TrainingError(f"{len(workers)} rollout worker(s) did not start within {limit:g}s "
                                f"(Ray cluster: {self.ray.cluster_resources()})") from None

    def sync(self, model: torch.nn.Module, version: int) -> None:
        if version == self.version:
            return
        self.state_ref = self.ray.put(trainable_state(model))
        self.loads = [w.load_weights.remote(self.state_ref, version) for w in self.workers]
        self.version = version

    def submit(self, ids: torch.Tensor, *, sampling: Sampling, generator: torch.Generator, greedy: bool = False):
        return _RayPending(self, ids.cpu(), draw_seed(generator), sampling, greedy)

    def replace_worker(self, i: int, state_ref, version: int) -> None:
        """Kills worker i (dead or stuck) and starts another with the weights `state_ref` holds."""
        self.ray.kill(self.workers[i])
        self.workers[i] = start_worker(self.config, self.build_worker)
        self.await_start([self.workers[i]])
        self.loads[i] = self.workers[i].load_weights.remote(state_ref, version) if state_ref is not None else None

    def close(self) -> None:
        if self.ray.is_initialized():
            for w in self.workers:
                self.ray.kill(w)
            if self._owns_ray:
                self.ray.shutdown()
        self.workers = []


class _RayPending:
    """One batch in flight: a shard per worker, gathered (and retried on failure) by `result`."""

    def __init__(self, engine: RayRolloutEngine, ids: torch.Tensor, seed: int, sampling: Sampling, greedy: bool):
        self.engine, self.ids, self.seed, self.sampling, self.greedy = engine, ids, seed, sampling, greedy
        self.version, self.state_ref = engine.version, engine.state_ref
        # a greedy batch holds one row per prompt, not groups
        self.shards = group_shards(len(ids), 1 if greedy else engine.group_size, len(engine.workers))
        self.deadlines = [time.monotonic() + engine.config.rollout.timeout_s] * len(self.shards)
        self.refs = [self._launch(i) for i in range(len(self.shards))]

    def _launch(self, i: int):
        e = self.engine
        return [e.loads[i], e.workers[i].rollout.remote(self.ids[self.shards[i]], self.seed + i, self.sampling,
                                                        self.greedy)]

    def result(self) -> Sampled:
        parts = [self._gather(i) for i in range(len(self.shards))]
        return Sampled(self.ids, concat_rollouts(parts, self.engine.pad_id), self.version)

    def _gather(self, i: int) -> Rollout:
        ray, e = self.engine.ray, self.engine
        cfg, restarts = e.config.rollout, 0
        while True:
            try:
                refs = [ref for ref in self.refs[i] if ref is not None]
                return ray.get(refs, timeout=max(0.0, self.deadlines[i] - time.monotonic()))[-1]
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                reason = (f"no rollout back within rollout.timeout_s={cfg.timeout_s:g}s"
                          if isinstance(err, ray.exceptions.GetTimeoutError)
                          else f"its process died ({str(err).splitlines()[0]})")
                step = e.config.sft.steps + e.version + 1  # the global step this batch is for
                if restarts >= cfg.max_restarts:
                    raise TrainingError(
                        f"rollout worker {i} of {len(e.workers)} failed at step {step}: {reason}; after {restarts} "
                        f"restart(s) of it (rollout.max_restarts={cfg.max_restarts}) the run stopped. The last "
                        f"checkpoint in {e.ckpt_dir} is intact: continue with --resume"
                    ) from None
                restarts += 1
                e.info(f"step {step}: rollout worker {i} failed ({reason}); replaced, shard resampled "
                                f"(restart {restarts} of {cfg.max_restarts})")
                e.replace_worker(i, self.state_ref, self.version)
                self.refs[i] = self._launch(i)
                self.deadlines[i] = time.monotonic() + cfg.timeout_s
                if e.version != self.version:  # the engine synced newer weights since: give them too
                    e.loads[i] = e.workers[i].load_weights.remote(e.state_ref, e.version)
