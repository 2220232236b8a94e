"""RL from an agent loop you run yourself: hand over each finished conversation and its reward;
every `batch_episodes` episodes the adapter takes one REINFORCE step.

    learner = EpisodeLearner(policy, EpisodeLearnerConfig(lr=1e-4, batch_episodes=8, run_dir="runs/my-agent"))
    for task in my_tasks:
        messages, reward = my_agent.play(task, policy)       # your loop, your tools, your environment
        metrics = learner.add_episode(messages, reward)      # None until a batch is full

`messages` is the whole chat ([system], user, assistant, user, ...); the loss covers the tokens of
the assistant messages (each with its end-of-turn token) and nothing else, on the sequence the
tokenizer's chat template writes. If you recorded the sampling log-probs of the assistant tokens,
pass them: they are checked against the learner's (`train/logprob_gap`, the mean absolute
difference), which shows when your sampler saw different tokens than the template writes.

It is also a trainer callback: `RLTrainer(cfg, callbacks=[learner])` feeds it every episode the
trainer plays (`on_episode_end`), e.g. to train a second adapter on the same experience.

State (adapter or trainable weights, optimizer, step, baseline) is checkpointed atomically to
`run_dir/checkpoints/` every `ckpt_every` updates, and a learner created on a run dir that holds a
checkpoint resumes from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..algos.advantages import baseline_advantages, update_moving_baseline
from ..algos.base import policy_forward
from ..algos.losses import aggregate
from ..generation.agent import left_pad
from ..tasks.text_batches import assistant_token_mask
from .. import checkpoint as ckpt
from .callbacks import Callback, Episode
from .lifecycle import guarded_step

log = logging.getLogger(__name__)


@dataclass
class EpisodeLearnerConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    batch_episodes: int = 8  # episodes per update
    baseline_decay: float = 0.9  # b <- decay*b + (1-decay)*mean reward; A = r - b
    grad_clip: float = 1.0
    max_nonfinite: int = 5  # non-finite updates in a row (each skipped) that stop the learner
    temperature: float = 1.0  # the sampling temperature, for the log-probs
    run_dir: str | None = None  # where checkpoints go (None: no checkpoints)
    ckpt_every: int = 1  # updates between checkpoints
    keep_checkpoints: int = 2

    def __post_init__(self):
        if self.batch_episodes < 1 or self.ckpt_every < 1 or self.max_nonfinite < 1 or not self.lr > 0:
            raise ValueError("EpisodeLearnerConfig: batch_episodes, ckpt_every and max_nonfinite must be >= 1 and lr > 0")
        if not 0 <= self.baseline_decay < 1:
            raise ValueError(f"EpisodeLearnerConfig.baseline_decay must be in [0, 1), got {self.baseline_decay}")


class EpisodeLearner(Callback):
    def __init__(self, policy, config: EpisodeLearnerConfig | None = None):
        self.policy, self.config = policy, config or EpisodeLearnerConfig()
        params = [p for p in policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the policy has no trainable parameters (a LoRA adapter or unfrozen weights)")
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.state = {"step": 0, "episodes": 0, "baseline": None, "nonfinite_total": 0, "nonfinite_run": 0}
        self.pending: list[tuple[list[int], list[int], float, list[float] | None]] = []
        self.ckpt_dir = Path(self.config.run_dir) / "checkpoints" if self.config.run_dir else None
        latest, skipped = ckpt.resume_checkpoint(self.ckpt_dir) if self.ckpt_dir else (None, [])
        for warning in skipped:
            log.warning(warning)
        if latest is not None:
            self.state.update(ckpt.load_checkpoint(latest, model=policy, optimizer=self.optimizer, restore_rng=False))
        self.resumed_from = latest

    # -- feeding ---------------------------------------------------------------------------------
    def add_episode(self, messages: list[dict], reward: float, logprobs=None) -> dict | None:
        """Queues one episode; runs an update (and returns its metrics) once `batch_episodes` are queued."""
        reward = float(reward)
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(f"episode reward must be a finite number, got {reward!r}")
        ids, mask = assistant_token_mask(self.policy.tokenizer, messages)
        if not any(mask):
            raise ValueError("the episode has no assistant tokens to learn from")
        self.pending.append((ids, mask, reward, None if logprobs is None else [float(x) for x in logprobs]))
        return self.update() if len(self.pending) >= self.config.batch_episodes else None

    def on_episode_end(self, trainer, episode: Episode) -> None:
        if episode.messages is None:
            raise ValueError("EpisodeLearner as a callback needs multi-turn episodes (with messages)")
        self.add_episode(episode.messages, episode.reward, episode.logprobs)

    # -- learning --------------------------------------------------------------------------------
    def update(self) -> dict:
        """One REINFORCE step on the queued episodes: A = r − b, L = −Σ_it m_it·A_i·log π / Σ_it m_it
        (the mean over the assistant tokens), then the trainers' guarded optimizer step."""
        batch, self.pending = self.pending, []
        cfg, device = self.config, self.policy.device
        rewards = torch.tensor([r for _, _, r, _ in batch], dtype=torch.float64)
        old = self.state["baseline"]
        adv = baseline_advantages(rewards, rewards.mean().item() if old is None else old).float().to(device)
        pad = self.policy.tokenizer.pad_token_id or 0
        seq, attn = left_pad([ids for ids, *_ in batch], pad, device)  # as the policy's prompts are
        loss_mask = left_pad([mask for _, mask, _, _ in batch], 0, device)[0][:, 1:].float()
        self.policy.train()
        logp, _, _ = policy_forward(self.policy, seq, seq.size(1) - 1, cfg.temperature, attn, entropy_grad=False)
        loss = -aggregate(adv[:, None] * logp, loss_mask, "token")
        loss.backward()
        stats = guarded_step(self.optimizer, loss.detach(), self.state, grad_clip=cfg.grad_clip,
                             max_nonfinite=cfg.max_nonfinite,
                             device=device, ckpt_dir=self.ckpt_dir, info=log.warning)
        if self.state["nonfinite_run"] == 0:  # a skipped update leaves the baseline as it was
            self.state["baseline"] = update_moving_baseline(old, rewards.mean().item(), cfg.baseline_decay)
        self.state["step"] += 1
        self.state["episodes"] += len(batch)
        metrics = {"step": self.state["step"], "train/policy_loss": loss.item(), "train/grad_norm": stats["grad_norm"],
                   "train/nonfinite_skipped": stats["nonfinite_skipped"], "train/avg_reward": rewards.mean().item(),
                   "train/baseline": self.state["baseline"], "train/advantage_mean": adv.mean().item()}
        gaps = [(logp[i][loss_mask[i].bool()].detach().cpu() - torch.tensor(lp)).abs().mean().item()
                for i, (_, m, _, lp) in enumerate(batch) if lp is not None and len(lp) == sum(m)]
        if gaps:
            metrics["train/logprob_gap"] = sum(gaps) / len(gaps)
        if self.ckpt_dir is not None and self.state["step"] % cfg.ckpt_every == 0 and self.state["nonfinite_run"] == 0:
            self.save()
        return metrics

    def save(self) -> Path:
        """Atomically checkpoints the trainable weights, optimizer and learner state."""
        if self.ckpt_dir is None:
            raise ValueError("EpisodeLearnerConfig.run_dir is not set: nowhere to save")
        return ckpt.save_checkpoint(self.ckpt_dir, self.state["step"], model=self.policy, optimizer=self.optimizer,
                                    trainer_state=self.state, keep=self.config.keep_checkpoints)
