"""The RL trainer's RL stage: prompts → rollout engine → rewards → the algorithm's update, until
`train.steps` (or the time limit, or Ctrl-C).

Sampling goes through a rollout engine (`lmrl.rollout.engine`): the trainer syncs the engine to
its weights right before asking for each batch, so a batch is sampled with the weights the learner
had when it asked. With `rollout.overlap` the next batch is asked for before this one's update
(sampled one update behind, `rollout/staleness` = 1). The stage shares the trainer's step
counter, logging, evaluation and checkpoints (see loop.py).
"""

from __future__ import annotations

import time

import torch

from ..algos.base import score_sequences
from ..distributed.ddp import all_reduce_sum
from ..rollout.engine import make_engine, rollout_to
from ..rollout.local import Rollout
from .rewards import score_rollout


def run_rl_stage(trainer) -> None:
    cfg, task, state = trainer.config, trainer.task, trainer.state
    trainer._build_rl_modules()
    trainer._make_optimizer(cfg.optim.lr, cfg.optim.weight_decay, cfg.train.steps, cfg.schedule.name,
                            cfg.schedule.warmup_steps, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
    trainer._restore_pending()
    if state["warmup_accuracy"] is None:  # no warm-up: the starting point is the initial model
        state["start_eval"] = trainer._evaluate()
        state["warmup_accuracy"] = state["start_eval"]["eval/accuracy"]
    group = trainer.algo.group_size
    n_prompts = cfg.train.rollout_size // trainer.dist.world_size // group
    trainer.engine = make_engine(trainer)
    pending = None
    try:
        while state["step"] < trainer.total_steps and not trainer._stop_requested and not trainer._out_of_time():
            t0 = time.perf_counter()
            # G completions per prompt, each group's rows contiguous (what group baselines expect)
            pending = pending or submit_rollout(trainer, n_prompts, group)
            sampled = pending.result()
            # rollout.overlap: the next batch samples with these weights while this one trains
            more = state["step"] + 1 < trainer.total_steps
            pending = submit_rollout(trainer, n_prompts, group) if cfg.rollout.overlap and more else None
            ids, ro = sampled.ids, on_learner(trainer, sampled)
            rewards, exact, extras = score_rollout(task, ids, ro, trainer.reward_fn)
            trainer.callbacks.rollout_end(trainer, state["step"] + 1, ids, ro, rewards)
            metrics = rollout_metrics(ro, rewards, exact, extras, trainer.device)
            t_update = time.perf_counter()
            metrics.update(trainer.algo.step(trainer, ro, rewards))
            metrics.update({"time/rollout_s": t_update - t0, "time/update_s": time.perf_counter() - t_update,
                            "rollout/staleness": float(ro.staleness)})
            state["algo"] = trainer.algo.state_dict()
            metrics["train/lr"] = trainer.optimizer.param_groups[0]["lr"]
            trainer.scheduler.step()
            trainer._end_step("rl", metrics, time.perf_counter() - t0, tokens=ro.sequences.numel())
    finally:
        trainer.engine.close()


def weights_version(trainer) -> int:
    """Updates the learner has made in RL: the version of its weights."""
    return trainer.state["step"] - trainer.config.sft.steps


def submit_rollout(trainer, n_prompts: int, group: int):
    """Asks the engine for the next batch, sampled with the weights the learner has now."""
    cfg = trainer.config
    ids = trainer.task.sample_train_ids(n_prompts, trainer.generators["data"]).repeat_interleave(group)
    trainer.engine.sync(trainer.model, weights_version(trainer))
    return trainer.engine.submit(ids, temperature=cfg.train.temperature, top_k=cfg.train.top_k,
                                 generator=trainer.generators["sample"])


def on_learner(trainer, sampled) -> Rollout:
    """The rollout on the learner's device, its staleness set, and log-probs recomputed with the
    training weights where the engine returned none (vLLM)."""
    cfg = trainer.config
    ro = rollout_to(sampled.rollout, trainer.device)
    ro.staleness = weights_version(trainer) - sampled.version
    if ro.logprobs is None:
        ro.logprobs, _ = score_sequences(trainer.model, ro.sequences, ro.completions.size(1), cfg.train.temperature,
                                         cfg.train.ga_steps, ro.attention_mask)
    return ro


def rollout_metrics(ro: Rollout, rewards: torch.Tensor, exact: torch.Tensor, extras: dict, device) -> dict:
    """Accuracy, mean reward, length and the task's extras (e.g. format rate) over every rank's
    rollouts (a per-token reward counts as the fraction of the completion's tokens it rewards)."""
    per_completion = rewards.float().mean(1) if rewards.dim() == 2 else rewards.float()
    names = sorted(extras)
    stats = all_reduce_sum(torch.tensor([exact.sum().item(), per_completion.sum().item(), len(rewards),
                                         ro.mask.sum().item()] + [extras[k].float().sum().item() for k in names],
                                        dtype=torch.float64, device=device)).cpu()
    count = stats[2].item()
    reward = stats[1].item() / count
    return {"train/accuracy": stats[0].item() / count, "train/avg_reward": reward,
            "rollout/reward_mean": reward, "rollout/length_mean": stats[3].item() / count,
            **{f"rollout/{k}": stats[4 + i].item() / count for i, k in enumerate(names)}}
