"""The RL trainer: a supervised warm-up on a budget of labeled problems, then RL on the task's
reward alone, with the algorithm `algo.name` names (REINFORCE, RLOO, GRPO, PPO; see `lmrl.algos`).

    trainer = RLTrainer(load_config("adder", ["train.steps=100"]))
    summary = trainer.train()   # {"warmup_accuracy": ..., "final_accuracy": ..., ...}

Two stages on the shared lifecycle (`lifecycle.Trainer`: steps, evaluation, best model, early
stopping, checkpoints, resume, summary): the warm-up's steps are 1..S and RL's S+1..S+R. One RL
step is: prompts → the rollout engine → rewards → `algo.prepare` and `algo.update` (the algorithm). A
checkpoint after step N holds everything the next step reads — weights, optimizer, scheduler, the
algorithm's state (baseline, KL coefficient), value model and reference, every RNG — so a run
resumed from it writes the same metrics as one that never stopped.

Sampling goes through a rollout engine (`lmrl.engines.local`): the trainer syncs the engine to its
weights right before asking for each batch, so a batch is sampled with the weights the learner had
when it asked. With `rollout.overlap` the next batch is asked for before this one's update (sampled
one update behind, `rollout/staleness` = 1).

With `train.log_completions`, each step that logs its metrics also writes its completions (prompt,
completion, reward, each reward function's, advantage, the functions' `log_extra` columns) to
`<run dir>/completions.jsonl` (`completion_rows`, `lmrl.log.completions`); other steps decode nothing.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from ..algos import build_algorithm
from ..algos.base import score_sequences
from ..config import Config
from ..config.schema import batch_split_problem
from ..common.data import write_jsonl
from ..common.errors import ConfigError
from ..parallel.ddp import all_reduce_sum, gather_object
from ..models import disable_dropout
from ..models.heads import ActorCritic
from ..models.reference import build_reference, is_reference_view
from ..engines.local import rollout_to
from ..engines.registry import make_engine
from ..generation.agent import episode_record, every_episode_failed
from ..generation.rollout import Rollout
from ..generation.sampling import NEWER_OPTIONS, OFF, Sampling, options_not_taken
from ..tasks import task_spec
from ..tasks.prompt_task import PromptTask, prompt_rows
from ..tasks.protocol import LabeledTask, ScoredByModel, Task
from ..tasks.rewards import RewardFn, RewardLog, build_reward, fill_unscored, function_rewards, score_rollout
from .build import build_run, build_worker_parts, own_config
from .evaluate import SOURCE_METRIC, evaluate, reported_sources, row_source_keys
from .lifecycle import Stage, Trainer, TrainingError
from .dynamic_sampling import Scored, keep_informative, kept_groups
from .prompt_order import PromptDraws
from .replay import ReplayBuffer
from .sft_trainer import sft_loss

logger = logging.getLogger("lmrl")

EVAL_METRICS = ("accuracy", "reward", "length_mean")  # what `evaluate` reports of every task, as eval/<name>


class RLTrainer(Trainer):
    """Wires a policy, a task and a reward into the warm-up + RL run described by a `Config`.

    model: a policy with `generate` and a forward returning logits (default: built from
        `config.model`: the built-in GPT, or a Hugging Face model with an optional LoRA adapter).
    task: prompts, rollouts and verifier (default: from `config.task`; see `lmrl.tasks.protocol`).
    reward_funcs, reward_weights: reward functions as TRL writes them, one or a list, called
        `f(prompts=, completions=, completion_ids=, trainer_state=, log_metric=, log_extra=, **columns)`
        and summed with these weights (None values left out; see `lmrl.tasks.rewards`; `log_extra`
        columns go to the completions log, `train.log_completions`); reward_fn: one function, either so
        or lmrl's positional `f(prompts, completions, **columns)`; default: `reward.funcs` / `reward.weights`,
        else `reward.cls`, else the task's own verifier.
    train_dataset, eval_dataset: prompts as TRL's GRPO takes them (a `datasets.Dataset` or a list of
        dicts with a text or conversational `prompt`, other columns passed to the reward functions), in
        place of `task.train_file` / `task.test_file` for a text task; they are written to
        `<run dir>/data/` (so the run dir resumes on its own). Without eval_dataset the held-out
        prompts are the first `eval.size` training prompts.
    env_factory: a zero-argument callable making one environment per episode (`lmrl.envs.protocol`):
        the run plays its episodes (`task.name=env`, set here; `env.*` limits apply).
    tools, environment_factory: TRL's `tools=` (typed, documented functions) and `environment_factory=`
        (a class whose public methods are tools, with `reset(**row)` and optionally `get_reward()`, a
        reward source named after the class): each prompt of a text task is answered with them over
        several turns (see `lmrl.tasks.tool_task`).
    callbacks: objects with any of `on_episode_end`, `on_step_end`, `on_checkpoint` (see
        `lmrl.train.callbacks`)."""

    name = "rl"
    trainer_key = "rl"  # its run.trainer value
    algorithm = ""  # the algorithm-named subclasses (GRPOTrainer, ...) set algo.name to theirs
    eval_spread = False  # evaluation also reports the rewards' and lengths' spread (TRL's names; lmrl.trl sets it)

    def __init__(self, config: Config, *, model=None, task: Task | None = None, reward_fn: RewardFn | None = None,
                 reward_funcs=None, reward_weights=None, train_dataset=None, eval_dataset=None, callbacks=None,
                 env_factory=None, tools=None, environment_factory=None):
        config = own_config(config, self.trainer_key)  # the caller's config is never changed
        if self.algorithm:
            config.algo.name = self.algorithm
        if env_factory is not None:
            config.task.name = "env"
        if train_dataset is not None:
            use_prompt_files(config, train_dataset, eval_dataset)
        elif eval_dataset is not None:
            raise ValueError("eval_dataset= needs train_dataset= (held-out prompts without training prompts)")
        if task is None:  # what the task needs, checked before any model loads
            check_task_inputs(config, reward_given=reward_fn is not None or reward_funcs is not None
                              or environment_factory is not None)
        # a task handed in, or answered with tools, reports metrics its registered spec does not say
        self._task_as_registered = task is None and env_factory is None and not tools and environment_factory is None
        super().__init__(config, callbacks=callbacks)
        cfg = self.config
        parts = build_run(cfg, device=self.device, model=model, task=task, env_factory=env_factory)
        self.model, self.task = parts.model, parts.task
        if tools or environment_factory is not None:
            self.task, reward_funcs, reward_weights = with_tool_rewards(self.task, cfg, tools or [], environment_factory,
                                                                        reward_funcs, reward_weights)
        self.sampling = train_sampling(cfg)
        check_rollout_takes(self.task, self.sampling)
        self.prompt_order = prompt_order(cfg, self.task)
        self.data_notes.extend(getattr(self.task, "notes", []))  # e.g. prompts cut to task.max_prompt_length
        # the data sources evaluation reports (`evaluate`), and the note when the held-out rows name too many
        self.eval_sources, note = reported_sources(row_source_keys(self.task, self.task.heldout_ids[: cfg.eval.size]))
        self.data_notes.extend([note] if note else [])
        self.module, self.reference, self.algo = self.model, None, None  # RL may wrap the policy with a value function
        self.reward_fn = build_reward(cfg.reward, reward_fn=reward_fn, reward_funcs=reward_funcs,
                                      reward_weights=reward_weights)
        if isinstance(self.task, PromptTask) and self.task.reward is None:
            self.task.score_with(self.reward_fn)  # held-out prompts are scored by the same functions
        # The warm-up's label budget: `sft.examples` distinct training problems, fixed by the seed.
        self.sft_pool = None
        if cfg.sft.steps:
            if not isinstance(self.task, LabeledTask):
                raise TypeError(f"sft.steps > 0 needs a task with labels for the warm-up; {type(self.task).__name__} "
                                f"has none (set sft.steps=0)")
            self.sft_pool = self.task.sample_distinct_train_ids(cfg.sft.examples,
                                                                torch.Generator().manual_seed(cfg.run.seed))
        self.init_state(algo={}, warmup_accuracy=None)

    def default_metric(self, config: Config) -> str:
        """eval/accuracy; eval/reward for a task with no verifier (its accuracy is 0 by definition)."""
        return "eval/reward" if task_spec(config.task.name).needs_reward else self.default_best_metric

    def eval_metric_names(self, config: Config) -> frozenset[str] | None:
        """`evaluate`'s names: accuracy, reward and completion length, and the task's extra metrics
        where its spec says which (`TaskSpec.metrics`). A task that reads rows from files also reports
        each data source's (eval/<source>/accuracy, /reward), which only its rows say: with such a
        `train.best_metric`, None (checked against the first evaluation)."""
        spec = task_spec(config.task.name)
        extras = spec.metrics
        if extras is None or not self._task_as_registered:
            return None
        if spec.reads_files and SOURCE_METRIC.fullmatch(config.train.best_metric):
            return None
        return frozenset(f"eval/{name}" for name in (*EVAL_METRICS, *extras))

    def stages(self) -> list[Stage]:
        cfg = self.config
        warmup = Stage("sft", cfg.sft.steps, timed=False)  # evaluated at its end only; RL is measured from it
        rl = Stage("rl", cfg.train.steps, first=cfg.sft.steps, eval_every=cfg.train.eval_every)
        return [warmup, rl] if cfg.sft.steps else [rl]

    def make_generators(self, seed: int) -> dict[str, torch.Generator]:
        return {"data": torch.Generator().manual_seed(seed),  # prompts
                "sample": torch.Generator(device=self.device).manual_seed(seed + 1)}  # sampling

    def run_stage(self, stage: Stage) -> None:
        if stage.name == "sft":
            self.warmup(stage)
        else:
            self.reinforce(stage)

    # -- the supervised warm-up ----------------------------------------------------------------------
    def warmup(self, stage: Stage) -> None:
        """Cross-entropy on the answers of the label budget, then a checkpoint at the hand-over to RL.
        `task.labeled` is the only place in a run where labels are read (RL sees rewards alone)."""
        cfg = self.config
        rows = self.task.labeled(self.sft_pool)
        self.make_optimizer(self.model, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay, steps=cfg.sft.steps,
                            schedule="cosine", warmup_steps=cfg.sft.warmup_steps, min_lr_ratio=cfg.sft.min_lr_ratio)
        batch, n = cfg.sft.batch_size // self.dist.world_size, self.task.answer_len

        def step(stage: Stage) -> None:
            t0 = time.perf_counter()
            idx = torch.randint(len(rows), (batch,), generator=self.generators["data"])
            x = rows[idx].to(self.device)
            logits = self.train_model(x[:, :-1], logits_to_keep=n)[:, -n:]  # (B, N, V): answer positions only
            loss, correct = sft_loss(logits, x[:, -n:])  # SFT's loss: every answer token is a response token
            loss.backward()
            lr = self.optimizer.param_groups[0]["lr"]
            metrics = {f"sft/{k}": v for k, v in self.optimizer_step(loss.detach()).items()}
            self.scheduler.step()
            metrics.update({"sft/lr": lr, "sft/accuracy": correct.view(-1, n).all(-1).float().mean().item()})
            self.end_step(stage, metrics, time.perf_counter() - t0, tokens=x.numel())

        self.step_until_done(stage, step)
        if self.state["step"] >= stage.last and not self._stop_requested:
            self.info(f"warm-up done: held-out accuracy {self.state['warmup_accuracy']:.3f} from "
                      f"{len(self.sft_pool)} labeled problems")
            self.drop_optimizer()
            self.save_checkpoint()

    def stage_evaluated(self, stage: Stage, metrics: dict) -> None:
        if stage.name == "sft" and self.state["step"] == stage.last:  # the warm-up's result, RL's starting point
            self.state["warmup_accuracy"] = metrics["eval/warmup_accuracy"] = metrics["eval/accuracy"]

    # -- RL --------------------------------------------------------------------------------------------
    def reinforce(self, stage: Stage) -> None:
        """RL steps until `train.steps` (or the time limit, early stopping, Ctrl-C)."""
        cfg = self.config
        if cfg.train.replay_fraction and self.distributed:
            raise ValueError(f"train.replay_fraction={cfg.train.replay_fraction} replays one process's failed "
                             f"prompts; with {self.dist.world_size} processes set train.replay_fraction=0")
        if cfg.train.disable_dropout:
            disable_dropout(self.model)
        self.build_rl_modules()
        self.make_optimizer(self.module, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, steps=cfg.train.steps,
                            schedule=cfg.schedule.name, warmup_steps=cfg.schedule.warmup_steps,
                            betas=cfg.optim.betas, eps=cfg.optim.eps, ema_decay=cfg.train.ema_decay,
                            own_lr={"value.": cfg.algo.critic_lr or cfg.optim.lr} if self.algo.uses_values else None)
        if self.state["warmup_accuracy"] is None:  # no warm-up: the starting point is the initial model
            self.state["start_eval"] = self.run_evaluation()
            self.state["warmup_accuracy"] = self.state["start_eval"]["eval/accuracy"]
        self.replay = ReplayBuffer(cfg.train.replay_size, cfg.train.replay_fraction, self.state.get("replay"))
        self.prompt_draws = PromptDraws(self.prompt_order, n_train=getattr(self.task, "n_train", 0),
                                        seed=cfg.run.seed, rank=self.dist.rank, world_size=self.dist.world_size,
                                        drawn=self.state.get("prompts_drawn", 0), sample=self.task.sample_train_ids)
        self.engine = make_engine(cfg, self.task, self.model, group_size=self.algo.group_size,
                                  world_size=self.dist.world_size, info=self.info, ckpt_dir=self.ckpt_dir,
                                  build_worker=functools.partial(build_worker_parts, cfg))
        self._pending = None
        self._greedy = None
        try:
            self.step_until_done(stage, self.rl_step)
        finally:
            self.engine.close()

    def draw_prompts(self, n: int) -> torch.Tensor:
        """`n` training problems for the next batch: `train.replay_fraction` of them drawn (with
        repeats) from the recently failed ones (`self.replay`), the rest as `train.prompt_order` says."""
        ids = self.replay.draw(n, self.prompt_draws, self.generators["data"])
        self.state["prompts_drawn"] = self.prompt_draws.drawn  # in the trainer state: a resume draws on from here
        return ids

    def build_rl_modules(self) -> None:
        """The algorithm, and what it needs besides the policy: a frozen reference (KL > 0) and a
        value function (PPO), both starting from the policy as RL starts."""
        cfg = self.config
        split = batch_split_problem(cfg, self.dist.world_size)
        if split is not None:
            raise ConfigError(split)
        self.algo = build_algorithm(cfg.algo, temperature=cfg.train.temperature, ga_steps=cfg.train.ga_steps,
                                    max_new_tokens=self.task.max_new_tokens)
        self.algo.load_state_dict(self.state.get("algo") or {})
        self.reference = None
        if self.algo.needs_reference:
            # With LoRA the reference is the base model: the policy with its adapter switched off.
            self.reference = build_reference(self.model)
        self.module = ActorCritic(self.model, cfg.algo.value_model) if self.algo.uses_values else self.model
        if (self.algo.uses_values and cfg.algo.value_model == "separate" and isinstance(self.task, ScoredByModel)
                and self.task.reward_model is not None and not self.state["step"]):
            self.module.init_value_from(self.task.reward_model)  # the critic starts as the reward model
        self.module.to(self.device)

    def rl_step(self, stage: Stage) -> None:
        cfg, state = self.config, self.state
        t0 = time.perf_counter()
        step = state["step"] + 1
        logs_completions = cfg.train.log_completions and self.logs_at(stage, step - stage.first)
        # G completions per prompt, each group's rows contiguous (what group baselines expect)
        n_prompts = cfg.train.rollout_size // self.dist.world_size // self.algo.group_size
        pending = self._pending or self._submit_rollout(n_prompts)
        sampled = pending.result()
        baseline_metrics = {}
        if self.algo.greedy_baseline:  # decoded before the next batch takes the sampler (rollout.overlap)
            self._greedy, baseline_metrics = self.decode_greedy_baseline(sampled.ids, stage)
        # rollout.overlap: the next batch samples with these weights while this one trains
        more = step < stage.last
        self._pending = self._submit_rollout(n_prompts) if cfg.rollout.overlap and more else None
        ids, ro = sampled.ids, self._on_learner(sampled)
        reward_log = RewardLog()
        rewards, exact, extras = score_rollout(self.task, ids, ro, self.reward_fn, step=state["step"],
                                               max_steps=stage.last, epoch=self.prompt_epochs(), log=reward_log)
        if cfg.train.replay_fraction:
            self.replay.add(ids, exact)
            state["replay"] = self.replay.ids  # in the trainer state: a resume continues the buffer
        dynamic = {}
        if cfg.algo.dynamic_sampling:  # more batches until enough groups whose rewards differ
            kept, dynamic = self.sample_informative(Scored(ids, ro, rewards, exact, extras, reward_log.columns),
                                                    n_prompts, stage, reward_log)
            ids, ro, rewards, exact, extras = kept.ids, kept.rollout, kept.rewards, kept.exact, kept.extras
        self.callbacks.rollout_end(self, step, ids, ro, rewards)
        # decoded as sampled and scored, before the loss mask below drops unscored or truncated tokens
        completions = (completion_rows(self.task, step, ids, ro, rewards, extras, reward_log.columns)
                       if logs_completions else None)
        metrics = rollout_metrics(ro, rewards, exact, extras, self.device, group_size=self.algo.group_size,
                                  scale_rewards=cfg.algo.scale_rewards, logged=reward_log.metrics,
                                  tokens_seen=state.get("num_input_tokens_seen", 0))
        metrics.update(dynamic)
        if metrics.get("env/errors") == 1.0:  # every episode of the step, on every rank: nothing to learn from
            raise TrainingError(every_episode_failed(step, ro))
        state["num_input_tokens_seen"] = metrics["num_tokens"]
        if reward_log.timed_out:
            metrics["rewards/timed_out"] = len(reward_log.timed_out)
        if cfg.reward.clip:  # the logged rewards above stay as scored
            rewards = rewards.clamp(*cfg.reward.clip)
        if rewards.dim() == 1 and rewards.isnan().any():  # out of a reward function's time, or their environment failed
            rewards, unscored = fill_unscored(rewards, ids)
            ro.mask = ro.mask * ~unscored[:, None].to(ro.mask.device)  # in their group's baseline, without gradient
        if cfg.algo.mask_truncated_completions:
            if ro.truncated is None:
                raise TrainingError(f"algo.mask_truncated_completions: {type(self.task).__name__}'s rollouts do not "
                                    f"say which completions were cut off (Rollout.truncated is None)")
            ro.mask = ro.mask * ~ro.truncated[:, None]  # still scored, and in their group's baseline
        metrics.update(baseline_metrics)
        t_update = time.perf_counter()
        batch, prepared = self.algo.prepare(self, ro, rewards)
        metrics.update(self.algo.update(self, batch, prepared))
        metrics.update({"time/rollout_s": t_update - t0, "time/update_s": time.perf_counter() - t_update,
                        "rollout/staleness": float(ro.staleness)})
        if completions is not None:
            self.log_completions(stage, step, with_advantages(completions, batch.advantages, batch.mask))
        state["algo"] = self.algo.state_dict()
        metrics["train/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics.update({trl: metrics[name] for name, trl in TRL_METRIC_NAMES.items() if name in metrics})
        self.scheduler.step()
        self.end_step(stage, metrics, time.perf_counter() - t0, tokens=ro.sequences.numel())

    def sample_informative(self, first: Scored, n_prompts: int, stage: Stage,
                           reward_log: RewardLog) -> tuple[Scored, dict[str, float]]:
        """`algo.dynamic_sampling`: batches of `n_prompts` prompts sampled and scored after `first` until
        they hold `n_prompts` groups whose rewards differ (every rank samples while any rank is short, as
        FSDP's sampling runs in step), at most `algo.max_sample_batches` in all; then one batch of them
        (`keep_informative`), and its statistics. The reward functions' logged metrics of every batch
        go to `reward_log`, and its completions-log columns become the kept rows'."""
        cfg, group_size = self.config, self.algo.group_size
        parts = [first]
        while len(parts) < cfg.algo.max_sample_batches:
            short = torch.tensor([float(kept_groups(parts, group_size) < n_prompts)], device=self.device)
            if all_reduce_sum(short).item() == 0:
                break
            sampled = self._submit_rollout(n_prompts).result()
            ids, ro = sampled.ids, self._on_learner(sampled)
            log = RewardLog()
            rewards, exact, extras = score_rollout(self.task, ids, ro, self.reward_fn, step=self.state["step"],
                                                   max_steps=stage.last, epoch=self.prompt_epochs(), log=log)
            if cfg.train.replay_fraction:
                self.replay.add(ids, exact)
                self.state["replay"] = self.replay.ids
            for name, values in log.metrics.items():
                reward_log.metrics.setdefault(name, []).extend(values)
            reward_log.timed_out.extend(log.timed_out)
            parts.append(Scored(ids, ro, rewards, exact, extras, log.columns))
        kept, stats = keep_informative(parts, n_prompts, group_size)
        reward_log.columns = kept.columns
        return kept, stats

    def decode_greedy_baseline(self, ids: torch.Tensor, stage: Stage) -> tuple[torch.Tensor, dict[str, float]]:
        """For an algorithm with `greedy_baseline` (ReMax): (the reward of one greedy completion of each
        distinct prompt of `ids`, repeated over its group of `algo.group_size` rows: (B,), or (B, T') for
        per-token rewards; NaN where it went unscored; `train/baseline_reward`, the mean of their sums over
        every rank's prompts). Decoded by the rollout engine with the learner's weights now (with
        `rollout.overlap`, one update newer than the samples'), scored by the run's reward (clamped to
        `reward.clip` as the samples' are); the reward functions' logged metrics and columns are not the step's."""
        group_size = self.algo.group_size
        prompts = ids[::group_size]
        self.engine.sync(self.model, self.weights_version())
        # greedy decoding draws no random numbers, and an engine that draws a seed per batch draws it from this
        # throwaway generator: the trainer's generators (and an exact resume) are as if no baseline were decoded
        pending = self.engine.submit(prompts, sampling=self.sampling, generator=torch.Generator(device=self.device),
                                     greedy=True)
        ro = rollout_to(pending.result().rollout, self.device)
        rewards, _, _ = score_rollout(self.task, prompts, ro, self.reward_fn, step=self.state["step"],
                                      max_steps=stage.last, epoch=self.prompt_epochs(), log=RewardLog())
        rewards = rewards.float().clamp(*self.config.reward.clip) if self.config.reward.clip else rewards.float()
        per_row = rewards.sum(1) if rewards.dim() == 2 else rewards
        scored = ~per_row.isnan()
        total, count = all_reduce_sum(torch.tensor([per_row[scored].sum().item(), scored.sum().item()],
                                                   dtype=torch.float64, device=self.device)).tolist()
        metrics = {"train/baseline_reward": total / count} if count else {}
        return rewards.to(self.device).repeat_interleave(group_size, 0), metrics

    def greedy_rewards(self) -> torch.Tensor:
        """The step's greedy baseline (`decode_greedy_baseline`): what `Learner.greedy_rewards` gives an algorithm."""
        return self._greedy

    def log_completions(self, stage: Stage, step: int, rows: list[dict]) -> None:
        """Every rank's completion rows, gathered to process 0, to the run's completions log (printed
        under the step's count in its stage, as the console's step line has it)."""
        every = gather_object(rows)
        if self.log is not None:
            self.log.log_completions(step, [row for rank_rows in every for row in rank_rows],
                                     title=f"[{stage.name}] Step {step - stage.first}/{stage.steps}")

    def prompt_epochs(self) -> float:
        """Passes over the training prompts before this batch, as a reward function's
        `trainer_state.epoch`: RL's prompts drawn so far over the task's training prompts (0.0 for
        a task that does not say how many it has: `n_train`)."""
        n_train = getattr(self.task, "n_train", 0)
        drawn = (self.state["step"] - self.config.sft.steps) * (self.config.train.rollout_size // self.algo.group_size)
        return drawn / n_train if n_train else 0.0

    def weights_version(self) -> int:
        """Updates the learner has made in RL: the version of its weights."""
        return self.state["step"] - self.config.sft.steps

    def _submit_rollout(self, n_prompts: int):
        """Asks the engine for the next batch, sampled with the weights the learner has now."""
        ids = self.draw_prompts(n_prompts).repeat_interleave(self.algo.group_size)
        self.engine.sync(self.model, self.weights_version())
        return self.engine.submit(ids, sampling=self.sampling, generator=self.generators["sample"])

    def _on_learner(self, sampled) -> Rollout:
        """The rollout on the learner's device, its staleness set, and log-probs recomputed with the
        training weights where the engine returned none (vLLM)."""
        cfg = self.config
        ro = rollout_to(sampled.rollout, self.device)
        ro.staleness = self.weights_version() - sampled.version
        if ro.logprobs is None:
            ro.logprobs, _ = score_sequences(self.model, ro.sequences, ro.completions.size(1), cfg.train.temperature,
                                             cfg.train.ga_steps, ro.attention_mask)
        return ro

    # -- evaluation, checkpoints, summary ------------------------------------------------------------
    def evaluate(self) -> dict:
        cfg = self.config
        # FSDP: ranks decode different numbers of batches, so the policy is gathered once for all of them
        with self.model.gathered() if self.fsdp else nullcontext():
            return evaluate(self.model, self.task, self.task.heldout_ids[: cfg.eval.size],
                            batch_size=cfg.eval.batch_size, device=self.device, rank=self.dist.rank,
                            world_size=self.dist.world_size, spread=self.eval_spread)

    def checkpoint_modules(self) -> dict[str, torch.nn.Module]:
        extra = {}
        if isinstance(self.module, ActorCritic):
            extra["value"] = self.module.value
        if self.reference is not None and not is_reference_view(self.reference):  # a view has no weights of its own
            extra["reference"] = self.reference
        return extra

    def frozen_modules(self) -> list[torch.nn.Module]:
        return [self.reference] if self.reference is not None and not is_reference_view(self.reference) else []

    def summary(self) -> dict:
        cfg, times, warmup = self.config, self.state["time"], self.state["warmup_accuracy"]
        final = self.state["last_eval"]["eval/accuracy"]
        return {
            "warmup_accuracy": warmup,
            "final_accuracy": final,
            "rl_gain": None if warmup is None else round(final - warmup, 6),
            "best": self.state["best"],
            "start_eval": self.state.get("start_eval", {}), "final_eval": self.state.get("last_eval", {}),
            "sft_examples": 0 if self.sft_pool is None else len(self.sft_pool),
            "sft_steps": cfg.sft.steps,
            "rl_steps": cfg.train.steps,
            "eval_size": min(cfg.eval.size, len(self.task.heldout_ids)),
            # sft / rl: the steps themselves; eval: held-out evaluations; total: wall clock of the run
            "time_s": {"sft": round(times.get("sft", 0.0), 2), "rl": round(times["rl"], 2),
                       "eval": round(times["eval"], 2), "total": round(times["wall"], 2)},
            "steps_done": self.state["step"] - cfg.sft.steps,
        }

    def summary_line(self, summary: dict) -> str:
        took = f"{summary['time_s']['total']:.0f}s"
        if isinstance(self.task, PromptTask):  # open prompts have no right answer: their measure is the reward
            start, final = summary["start_eval"].get("eval/reward"), summary["final_eval"].get("eval/reward")
            if start is not None and final is not None:
                return f"held-out reward: start {start:.3f} → final {final:.3f} | {took}"
        start = summary["warmup_accuracy"]  # None when no stage ran (sft.steps=0, train.steps=0)
        start = "" if start is None else f"warm-up {start:.3f} → "
        return f"held-out accuracy: {start}final {summary['final_accuracy']:.3f} | {took}"


def prompt_order(config: Config, task) -> str:
    """`train.prompt_order` for a task with a training set of rows (`n_train`); `random` for one without
    (arithmetic draws generated problems), where `in_order` is a ConfigError."""
    order = config.train.prompt_order
    if getattr(task, "n_train", None) is not None:
        return order
    if order == "in_order":
        raise ConfigError(f"train.prompt_order={order}: {type(task).__name__} has no training set of rows to pass "
                          f"over in order (no n_train); it draws its problems at random")
    return "random"


def train_sampling(config: Config) -> Sampling:
    """The sampling options of RL's rollouts (`train.temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`)."""
    t = config.train
    return Sampling(t.temperature, t.top_k, t.top_p, t.min_p, t.repetition_penalty)


def check_rollout_takes(task, sampling: Sampling) -> None:
    """A ConfigError naming the task's class and the option when its `rollout` has no keyword for one
    the trainer passes: temperature, top_k and top_p always, min_p and repetition_penalty when the
    config sets them (a task written before those two runs as it is while they stay at their defaults)."""
    missing = options_not_taken(task.rollout, sampling)
    if not missing:
        return
    name, owner = missing[0], f"{type(task).__name__}.rollout"
    if name in NEWER_OPTIONS:
        raise ConfigError(f"train.{name}={getattr(sampling, name)}: {owner} takes no {name}= keyword; add it to "
                          f"the rollout's signature (and sample with it), or leave train.{name} at "
                          f"{getattr(OFF, name)} (off)")
    raise ConfigError(f"{owner} takes no {name}= keyword, which the RL trainer passes to every rollout (the Task "
                      f"protocol, lmrl.tasks.protocol)")


def check_task_inputs(config: Config, *, reward_given: bool) -> None:
    """A ConfigError when a task that reads files has none to read (no task.train_file / test_file, no
    task.generate, no train_dataset=) or a task without a verifier has no reward."""
    t, r, spec = config.task, config.reward, task_spec(config.task.name)
    if spec.reads_files and not (t.train_file and t.test_file):
        raise ConfigError(f"task.name={t.name} reads its problems from JSONL: set task.train_file and task.test_file "
                          f"(`lmrl data word-problems OUT_DIR` writes a pair offline), or pass train_dataset=")
    if spec.needs_reward and not (reward_given or r.model or r.cls or r.funcs):
        raise ConfigError(f"task.name={t.name} needs a reward: reward.model (a reward model dir), reward.cls, "
                          f"reward.funcs, or reward_funcs= from Python")
    # a local dir that is not there (a hub id, org/name, is left to the loader)
    if r.model and not Path(r.model).exists() and not re.fullmatch(r"[\w.-]+/[\w.-]+", r.model):
        raise ConfigError(f"reward.model={r.model} does not exist: train one with `lmrl train rm-smollm2`, or set "
                          f"reward.model= to a reward model dir")


def with_tool_rewards(task, config: Config, tools: list, environment_factory, reward_funcs, reward_weights):
    """(the task answered with TRL-style `tools` / `environment_factory`, its reward functions and weights):
    an environment class's `get_reward` joins the functions as a reward source of weight 1, named after it."""
    from ..tasks.prompt_task import PromptTask
    from ..tasks.tool_task import environment_reward, with_tools

    if not isinstance(task, PromptTask):
        raise ConfigError(f"tools= and environment_factory= answer prompts (task.name=prompts or math, or "
                          f"train_dataset=); task.name={config.task.name} is not such a task")
    task = with_tools(task, tools, config, environment_factory)
    if task.reward_source is not None:
        funcs = [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) \
            else [reward_funcs]
        weights = [1.0] * len(funcs) if reward_weights is None else list(reward_weights)
        reward_funcs, reward_weights = funcs + [environment_reward(task.reward_source)], weights + [1.0]
    return task, reward_funcs, reward_weights


def use_prompt_files(config: Config, train_dataset, eval_dataset=None) -> None:
    """Points `config`'s text task (a trainer's own copy: see `own_config`) at `train_dataset` (and
    `eval_dataset`, else the first `eval.size` training prompts), written here to
    `<run dir>/data/{train,eval}.jsonl`."""
    if not task_spec(config.task.name).reads_files:
        raise ConfigError(f"train_dataset= is for a task that reads prompts (task.name=math or prompts); task.name="
                          f"{config.task.name} makes its own problems")
    train = prompt_rows(train_dataset)
    held_out = prompt_rows(eval_dataset) if eval_dataset is not None else train[: config.eval.size]
    data = config.run_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    config.task.train_file = str(write_jsonl(data / "train.jsonl", train))
    config.task.test_file = str(write_jsonl(data / "eval.jsonl", held_out))
    config.task.generate = ""


# TRL's names for numbers lmrl logs under its own; both are logged (lmrl's are what its tests,
# benchmarks and plots read). rollout_metrics and the algorithms log TRL's other names themselves.
TRL_METRIC_NAMES = {"train/loss": "loss", "train/grad_norm": "grad_norm", "train/lr": "learning_rate"}


def rollout_metrics(ro: Rollout, rewards: torch.Tensor, exact: torch.Tensor, extras: dict, device, *,
                    group_size: int = 1, scale_rewards: str = "group", logged: dict | None = None,
                    tokens_seen: int = 0) -> dict:
    """Accuracy, mean reward, length and the task's extras (e.g. format rate) over every rank's
    rollouts (a per-token reward counts as the fraction of the completion's tokens it rewards),
    under lmrl's names and TRL GRPOTrainer's, computed as TRL computes them:

    reward, reward_std          mean and std (Bessel-corrected) of the batch's rewards
    frac_reward_zero_std        the share of completions whose group's rewards are all equal (with
                                scale_rewards=batch: 1 or 0 as the whole batch's are); groups of 2 or more
    rewards/<name>/mean, /std   each reward function's, over the rows it scored (an extra's mean is
                                over its rows that are not NaN)
    num_tokens                  prompt and completion tokens sampled so far (`tokens_seen` before this batch)
    completions/{mean,min,max}_length, completions/{mean,min,max}_terminated_length
                                completion tokens the policy chose, of all completions and of those
                                that ended before the length limit (0 where none did)
    completions/clipped_ratio   the share cut off by the length limit (0 for fixed-length answers)

    and the reward functions' `log_metric` values (`logged`: name -> values), each name's mean
    under that name. A NaN reward (a completion no reward function scored in time, an episode whose
    environment failed) is left out of the reward's numbers; with none scored, they are not logged.
    A NaN in `exact` (a failed episode) is left out of the accuracy."""
    per_completion = rewards.float().mean(1) if rewards.dim() == 2 else rewards.float()
    scored = ~per_completion.isnan()
    # an episode whose environment failed (NaN) is no success or failure of the policy's: (successes, judged)
    correct, n_judged = torch.stack([exact.float().nansum(), (~exact.float().isnan()).sum().float()]).tolist()
    lengths = ro.mask.sum(1).float()
    truncated = ro.truncated.bool() if ro.truncated is not None else torch.zeros_like(lengths, dtype=torch.bool)
    if ro.truncated is not None:
        extras = {**extras, "rollout/truncated_frac": ro.truncated.float()}
    zero_std = 0.0
    if group_size > 1 and scale_rewards != "batch":  # TRL's is_std_zero: the group's std is 0 (NaN rows left out)
        std = _nanstd(per_completion.view(-1, group_size))
        zero_std = (torch.isclose(std, torch.zeros_like(std)).sum() * group_size).item()
    prompt_tokens = ro.prompts.numel() if ro.prompt_mask is None else ro.prompt_mask.sum().item()
    # an extra is averaged over the rows it has a value for: a reward function's "rewards/<name>/mean"
    # is NaN where the function returned None (not applicable); a name holding "/" is logged as it is
    names = sorted(extras)
    values = [extras[k].float() for k in names]
    logged = logged or {}
    logged_names = _names_on_every_rank(logged)
    logged_values = [torch.tensor(logged.get(k, []), dtype=torch.float64) for k in logged_names]
    stats = all_reduce_sum(torch.tensor(
        [correct, per_completion.nansum().item(), scored.sum().item(), len(rewards), ro.mask.sum().item(),
         zero_std, prompt_tokens, truncated.sum().item(), lengths[~truncated].sum().item(), n_judged]
        + [v.nansum().item() for v in values] + [(~v.isnan()).sum().item() for v in values]
        + [v.sum().item() for v in logged_values] + [len(v) for v in logged_values],
        dtype=torch.float64, device=device)).cpu().tolist()
    (correct, reward_sum, n_scored, count, tokens, zero_std, prompt_tokens, n_truncated, terminated_tokens,
     n_judged), rest = stats[:10], stats[10:]
    n, m = len(names), len(logged_names)
    sums, counts, logged_sums, logged_counts = rest[:n], rest[n:2 * n], rest[2 * n:2 * n + m], rest[2 * n + m:]
    out = {"train/accuracy": correct / n_judged if n_judged else 0.0}
    out.update({(k if "/" in k else f"rollout/{k}"): sums[i] / counts[i] for i, k in enumerate(names) if counts[i] > 0})
    # the stds: squared deviations from the means just all-reduced, over every rank
    columns = [i for i, k in enumerate(names) if k.startswith("rewards/") and k.endswith("/mean") and counts[i] > 1]
    mean = reward_sum / n_scored if n_scored else 0.0
    squares = all_reduce_sum(torch.tensor(
        [(per_completion[scored].double() - mean).pow(2).sum().item()]
        + [(values[i][~values[i].isnan()].double() - sums[i] / counts[i]).pow(2).sum().item() for i in columns],
        dtype=torch.float64, device=device)).cpu().tolist()
    out.update({names[i].removesuffix("/mean") + "/std": (squares[1 + c] / (counts[i] - 1)) ** 0.5
                for c, i in enumerate(columns)})
    if n_scored:
        out.update({"train/avg_reward": mean, "rollout/reward_mean": mean, "reward": mean})
        if n_scored > 1:
            out["reward_std"] = (squares[0] / (n_scored - 1)) ** 0.5
        if group_size > 1 and scale_rewards == "batch":
            zero_std = count * float(n_scored > 1 and abs(out["reward_std"]) <= 1e-8)  # torch.isclose(std, 0)
        if group_size > 1:
            out["frac_reward_zero_std"] = zero_std / count
    terminated = lengths[~truncated]
    extremes = _all_reduce_min(torch.tensor([lengths.min().item(), -lengths.max().item(),
                                             terminated.min().item() if len(terminated) else float("inf"),
                                             -terminated.max().item() if len(terminated) else float("inf")],
                                            dtype=torch.float64, device=device)).cpu().tolist()
    n_terminated = count - n_truncated
    out.update({
        "rollout/length_mean": tokens / count, "num_tokens": int(tokens_seen + prompt_tokens + tokens),
        "completions/mean_length": tokens / count, "completions/min_length": extremes[0],
        "completions/max_length": -extremes[1], "completions/clipped_ratio": n_truncated / count,
        "completions/mean_terminated_length": terminated_tokens / n_terminated if n_terminated else 0.0,
        "completions/min_terminated_length": extremes[2] if n_terminated else 0.0,
        "completions/max_terminated_length": -extremes[3] if n_terminated else 0.0,
    })
    for name, total, k in zip(logged_names, logged_sums, logged_counts):
        if k and name not in out:  # the built-in numbers keep their names
            out[name] = total / k
    return out


def completion_rows(task: Task, step: int, ids: torch.Tensor, ro: Rollout, rewards: torch.Tensor, extras: dict,
                    columns: dict[str, list]) -> list[dict]:
    """One row per completion of a scored rollout for the completions log (`lmrl.log.completions`):
    `step`, `prompt` and `completion` as callbacks' `Episode`s have them (`task.texts`), `reward`
    (summed over tokens for per-token rewards), `rewards` (each reward function's, where the run has
    reward functions), `extra` (the functions' `log_extra` columns, from `columns`), and for a
    multi-turn episode `messages` (its conversation), `turns`, `truncated` and `env_error` (the one
    line of its environment's failure, None when it ran). A reward no function gave (None, or out of time) is None.
    A column without one value per completion is left out, with a warning naming it."""
    prompts, completions = task.texts(ids, ro)
    n = len(prompts)
    per_row = rewards.float().sum(1) if rewards.dim() == 2 else rewards.float()
    per_function = {name: values.tolist() for name, values in function_rewards(extras).items()}
    for column, values in columns.items():
        if len(values) != n:
            logger.warning(f"log_extra column {column!r} has {len(values)} values for {n} completions: left out of "
                           f"the completions log at step {step}")
    extra = {column: values for column, values in columns.items() if len(values) == n}
    transcripts = getattr(ro, "transcripts", None)
    infos = getattr(ro, "infos", None)
    rows = []
    for i, (prompt, completion, reward) in enumerate(zip(prompts, completions, per_row.tolist())):
        row = {"step": step, "prompt": prompt, "completion": completion, "reward": _finite_or_none(reward)}
        if per_function:
            row["rewards"] = {name: _finite_or_none(values[i]) for name, values in per_function.items()}
        if extra:
            row["extra"] = {column: values[i] for column, values in extra.items()}
        if transcripts:
            row["messages"] = transcripts[i]
        if infos:  # a multi-turn episode: how it went, and why it failed if it did
            row.update(episode_record(infos[i], bool(ro.truncated[i]) if ro.truncated is not None else False))
        rows.append(row)
    return rows


def with_advantages(rows: list[dict], advantages: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """`rows` with each completion's `advantage`: its own (B,), or for per-token advantages (B, N) their
    mean over the tokens with loss (None for a completion that has none)."""
    if advantages.dim() == 2:
        mask = mask.to(advantages.dtype)
        tokens = mask.sum(1)
        values = ((advantages * mask).sum(1) / tokens.clamp(min=1)).tolist()
        values = [v if t else None for v, t in zip(values, tokens.tolist())]
    else:
        values = advantages.tolist()
    return [{**row, "advantage": value} for row, value in zip(rows, values)]


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _nanstd(x: torch.Tensor) -> torch.Tensor:
    """The std of each row of x (G, K) over its entries that are not NaN, Bessel-corrected; NaN for
    a row with fewer than two (TRL's nanstd)."""
    count = (~x.isnan()).sum(1)
    mean = x.nansum(1) / count
    square = torch.where(x.isnan(), torch.zeros_like(x), (x - mean[:, None]) ** 2).sum(1)
    return torch.where(count > 1, (square / (count - 1).clamp(min=1)).sqrt(), torch.full_like(mean, float("nan")))


def _all_reduce_min(t: torch.Tensor) -> torch.Tensor:
    """The minimum over ranks of `t`, in place (a maximum is a negated minimum); itself in a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t


def _names_on_every_rank(names) -> list[str]:
    """The sorted union of `names` over ranks, so every rank reduces the same numbers in the same order."""
    names = sorted(names)
    if dist.is_available() and dist.is_initialized():
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, names)
        names = sorted(set().union(*every))
    return names
