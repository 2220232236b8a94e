"""What every policy-gradient algorithm shares: the prepared batch, the forward pass that scores it,
the regularisers (KL to a reference, entropy bonus) and the update loop.

An algorithm turns one step's scored rollouts into updates in two parts:

    prepare(learner, rollout, rewards)  → PreparedBatch   advantages, old / reference log-probs, values
    loss(batch, logprobs, entropy, values) → loss, stats  on one micro-batch, with gradients

and `Algorithm.update` runs `ppo_epochs` passes over the batch in minibatches of `minibatch_size`
completions, each split into `train.ga_steps` micro-batches whose losses are weighted so that the
accumulated gradient equals the gradient of the whole minibatch's loss. Completions whose advantage
is 0 on every token add nothing to that gradient when the loss has no term besides the
advantage-weighted one (no KL in the loss, entropy bonus or value loss): the pass leaves them out
(`algo.skip_zero_advantage`; a GRPO group whose completions all scored the same is such a case) and
the weights keep the whole minibatch's normaliser, so the gradient is the same.

The trainer is the `learner`: it owns the model(s), the optimizer and the process group, and gives
the algorithm a small surface (see `Learner`), so an algorithm never touches the loop.

An algorithm is a subclass registered by name; `algo.name` takes its choices from `ALGORITHMS`:

    @register_algorithm("my_pg")
    class MyPG(Algorithm): ...
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import Protocol

import torch
import torch.nn as nn

from .advantages import masked_mean, masked_moments, normalize_advantages
from .losses import aggregate, high_entropy_mask, importance_ratio, kl_estimate, off_policy_mask
from ..generation.token_logprobs import token_logprobs


@dataclass
class PreparedBatch:
    """One step's rollouts, ready for the loss. B completions, N completion tokens."""

    sequences: torch.Tensor  # (B, P + N) prompt + completion ids
    mask: torch.Tensor  # (B, N) 1 on tokens the policy chose
    advantages: torch.Tensor  # (B,) per completion or (B, N) per token
    old_logprobs: torch.Tensor | None = None  # (B, N); None: one on-policy pass, old = current
    ref_logprobs: torch.Tensor | None = None  # (B, N) under the frozen reference (KL in the loss)
    old_values: torch.Tensor | None = None  # (B, N) PPO: V(s_t) at rollout time
    returns: torch.Tensor | None = None  # (B, N) PPO: value targets
    attention_mask: torch.Tensor | None = None  # (B, P + N) left-padded text prompts; None: no padding

    def __len__(self) -> int:
        return self.sequences.size(0)

    def rows(self, idx: torch.Tensor) -> "PreparedBatch":
        return PreparedBatch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
                                for f in fields(self)})


class Learner(Protocol):
    """What the trainer gives an algorithm."""

    train_model: nn.Module  # what the loss differentiates (maybe DDP-wrapped); forward → logits or (logits, values)
    module: nn.Module  # the same, unwrapped, for no-grad passes
    reference: nn.Module | None  # frozen policy for the KL term (None unless algo.kl_coef > 0)
    generators: dict[str, torch.Generator]
    distributed: bool  # several processes, each of which must run the same forward and backward passes

    def optimizer_step(self, loss: torch.Tensor) -> dict: ...  # clip, skip if non-finite, step, zero grads
    def no_sync(self, sync: bool) -> AbstractContextManager: ...  # DDP: all-reduce only when sync
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor: ...
    # for an algorithm with `greedy_baseline`: the reward of one greedy completion of each row's prompt, (B,),
    # or its per-token rewards (B, T') (a group's G rows share their prompt's), NaN where it went unscored
    def greedy_rewards(self) -> torch.Tensor: ...


def policy_forward(model: nn.Module, sequences: torch.Tensor, n: int, temperature: float = 1.0,
                   attention_mask: torch.Tensor | None = None, entropy_grad: bool = True):
    """Log-probs (B, N) and entropies (B, N) of the last `n` tokens of `sequences` under
    softmax(logits / temperature) (the distribution they were sampled from), and values (B, N)
    when `model` also returns them (an ActorCritic), else None. V at token t is the value of the
    state the token was chosen in, read at the same position as the logits that chose it.
    `attention_mask` (B, T) marks left padding in text prompts (the model derives positions from it).
    `entropy_grad=False` computes the entropy without a graph (when it is only reported)."""
    kw = {} if attention_mask is None else {"attention_mask": attention_mask[:, :-1]}
    out = model(sequences[:, :-1], logits_to_keep=n, **kw)  # logits of the completion positions only
    logits, values = out if isinstance(out, tuple) else (out, None)
    # (B, N, V): position t predicts token t+1; no (B, N, V) log-prob tensor is made or kept for backward
    logp, entropy = token_logprobs(logits[:, -n:], sequences[:, -n:], temperature)
    if not entropy_grad:  # a metric only, unless in the loss
        entropy = entropy.detach()
    return logp, entropy, None if values is None else values[:, -n:].float()


@torch.no_grad()
def score_sequences(model: nn.Module, sequences: torch.Tensor, n: int, temperature: float, chunks: int = 1,
                    attention_mask: torch.Tensor | None = None):
    """`policy_forward` without gradients, in `chunks` pieces: (logprobs, values or None)."""
    logps, values = [], []
    masks = [None] * chunks if attention_mask is None else attention_mask.chunk(chunks)
    for part, mask in zip(sequences.chunk(chunks), masks):
        lp, _, v = policy_forward(model, part, n, temperature, mask)
        logps.append(lp)
        values.append(v)
    return torch.cat(logps), None if values[0] is None else torch.cat(values)


# Update statistics logged under TRL GRPOTrainer's names: its entropy and KL are token means over the
# batch, where lmrl's train/entropy and train/kl aggregate by algo.loss_level as the loss does.
TRL_STATS = {"token_entropy": "entropy", "token_kl": "kl"}


def metric_name(stat: str) -> str:
    """The metric an update statistic is logged as: TRL's name for the ones in TRL_STATS, a name
    with a "/" as it is (the loss's clip_ratio/*, TRL's), else train/<stat>."""
    return TRL_STATS.get(stat) or (stat if "/" in stat else f"train/{stat}")


# The `algo` keys that shape the clipped surrogate (`Algorithm.surrogate_options`), refused by an
# algorithm without one.
SURROGATE_KEYS = ("ratio_level", "clip_ratio_max", "top_entropy_quantile", "off_policy_mask_threshold")

# The keys of a value model (ppo's critic and its GAE), each with what it sets, refused set away from their
# defaults under an algorithm without one.
VALUE_KEYS = {"vf_coef": "the weight of ppo's value loss",
              "value_clip": "the clip range of ppo's value loss (the policy ratio's is algo.clip_range_left and "
                            "algo.clip_range_right)",
              "gamma": "the discount of ppo's GAE (and of reinforce_plus_plus's and remax's returns)",
              "lam": "the lambda of ppo's GAE"}

# name -> Algorithm subclass: what `algo.name` may be (the config check reads this dict).
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str):
    """Class decorator: `algo.name: <name>` runs this Algorithm subclass (and sets its `name`)."""
    def register(cls: type[Algorithm]) -> type[Algorithm]:
        if ALGORITHMS.get(name, cls) is not cls:
            raise ValueError(f"algorithm {name!r} is already registered (by {ALGORITHMS[name].__qualname__})")
        cls.name = name
        ALGORITHMS[name] = cls
        return cls
    return register


class Algorithm:
    """Base class. Subclasses implement `prepare` and `policy_loss` and are registered with
    `@register_algorithm(name)`; `check_config` adds what they need of the `algo` section."""

    name = "base"
    uses_values = False  # True: the learner's model is an ActorCritic returning values
    # True: `policy_loss` weights each token by its advantage, so a completion whose advantages are
    # all 0 adds exactly nothing to it (and the update may leave it out, see `rows_in_pass`)
    advantage_weighted = False
    # True: `policy_loss` is the clipped surrogate, with the options of `surrogate_options`
    clips_ratio = False
    # True: the advantages are returns discounted by `algo.gamma` without a value model (REINFORCE++)
    discounts = False
    # whether advantages are whitened over the batch when `algo.normalize_advantages` is null
    whitens = False
    # True: the trainer decodes each prompt greedily too and scores it, for `Learner.greedy_rewards` (ReMax)
    greedy_baseline = False

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        """What is wrong with the `algo` section `cfg` for this algorithm, one line per problem."""
        if cls.uses_values and cfg.value_model == "none":
            return [f"algo.name={cfg.name} needs a value model: set algo.value_model to head or separate"]
        if not cls.uses_values and (cfg.value_model != "none" or cfg.critic_lr is not None):
            key = "value_model" if cfg.value_model != "none" else "critic_lr"
            return [f"algo.{key}={getattr(cfg, key)} is for ppo's critic; algo.name={cfg.name} has none (leave it "
                    f"at {'none' if key == 'value_model' else 'null'}, or set algo.name=ppo)"]
        defaults = {f.name: f.default for f in fields(cfg)}
        whitening = cls.whitens if cfg.normalize_advantages is None else cfg.normalize_advantages
        unwhitened = [] if cfg.normalize_advantages_std or whitening else [
            f"algo.normalize_advantages_std=false leaves the std out of the batch whitening, which "
            f"algo.name={cfg.name} does not do here: set algo.normalize_advantages=true, or leave "
            f"normalize_advantages_std at true"]
        valued = unwhitened + ([] if cls.uses_values else [
            f"algo.{key}={getattr(cfg, key)} sets {what}; algo.name={cfg.name} has no value model (leave it at "
            f"{defaults[key]})" for key, what in VALUE_KEYS.items()
            if getattr(cfg, key) != defaults[key] and not (key == "gamma" and cls.discounts)])
        clipping = ", ".join(name for name, algorithm in ALGORITHMS.items() if algorithm.clips_ratio)
        return valued + ([] if cls.clips_ratio else [
            f"algo.{key}={getattr(cfg, key)} shapes the clipped ratio ({clipping}); algo.name={cfg.name} has none "
            f"(leave it at {defaults[key]})" for key in SURROGATE_KEYS if getattr(cfg, key) != defaults[key]])

    def __init__(self, cfg, *, temperature: float = 1.0, ga_steps: int = 1, max_new_tokens: int = 1):
        self.cfg = cfg
        self.temperature = temperature
        self.ga_steps = ga_steps
        self.max_new_tokens = max_new_tokens
        self.kl_coef = cfg.kl_coef  # adapted between steps when cfg.kl_target > 0

    # -- state (JSON-serialisable, saved in checkpoints) -----------------------------------------
    def state_dict(self) -> dict:
        return {"kl_coef": self.kl_coef}

    def load_state_dict(self, state: dict) -> None:
        self.kl_coef = state.get("kl_coef", self.kl_coef)

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0

    @property
    def group_size(self) -> int:
        return self.cfg.group_size

    # -- to implement ----------------------------------------------------------------------------
    def prepare(self, learner: Learner, rollout, rewards: torch.Tensor) -> tuple[PreparedBatch, dict]:
        raise NotImplementedError

    def policy_loss(self, batch: PreparedBatch, logprobs, entropy, values) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    # -- shared pieces ---------------------------------------------------------------------------
    def needs_old_logprobs(self, batch_size: int) -> bool:
        """Old log-probs are needed once the policy moves before the batch is used up."""
        return self.cfg.ppo_epochs > 1 or 0 < self.cfg.minibatch_size < batch_size

    def reference_logprobs(self, learner: Learner, rollout) -> torch.Tensor | None:
        if learner.reference is None:
            return None
        logp, _ = score_sequences(learner.reference, rollout.sequences, rollout.completions.size(1),
                                  self.temperature, self.ga_steps, rollout.attention_mask)
        return logp

    def kl_shaped_rewards(self, rewards: torch.Tensor, logprobs: torch.Tensor | None,
                          ref_logprobs: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        """With `kl_in_reward`, r ← r − β·KL: per token for token rewards (B, N), else summed
        over the completion for sequence rewards (B,). Unchanged otherwise."""
        if not (self.cfg.kl_in_reward and ref_logprobs is not None and self.kl_coef > 0):
            return rewards
        kl = kl_estimate(logprobs, ref_logprobs, self.cfg.kl_estimator, self.cfg.kl_clamp) * mask
        return rewards - self.kl_coef * (kl if rewards.dim() == 2 else kl.sum(1))

    @property
    def normalizes(self) -> bool:
        """Whether `prepare` whitens the advantages: `algo.normalize_advantages`, else the algorithm's own choice."""
        setting = self.cfg.normalize_advantages
        return type(self).whitens if setting is None else setting

    def whiten(self, learner: Learner, advantages: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """`normalize_advantages` with the mean and std of every process's batch (the same
        advantages however the batch is split over ranks); only centred with `algo.normalize_advantages_std=false`."""
        return normalize_advantages(advantages, mask, moments=learner.all_reduce_sum(masked_moments(advantages, mask)),
                                    divide=self.cfg.normalize_advantages_std)

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return aggregate(per_token, mask, self.cfg.loss_level, self.loss_constant)

    @property
    def loss_constant(self) -> float:
        return self.cfg.loss_constant or float(self.max_new_tokens)

    def surrogate_options(self, batch: PreparedBatch, logprobs, old_logprobs, entropy) -> dict:
        """The clipped surrogate's `algo` options (`losses.clipped_surrogate_loss`): the ratio's level,
        its cap, and the constants that leave tokens out of the policy term: those below the top
        `top_entropy_quantile` by entropy in this micro-batch, and the negative-advantage completions
        the policy has drifted from by more than `off_policy_mask_threshold`."""
        weights = None
        if self.cfg.top_entropy_quantile < 1:
            weights = high_entropy_mask(entropy, batch.mask, self.cfg.top_entropy_quantile).to(logprobs.dtype)
        if self.cfg.off_policy_mask_threshold is not None:
            keep = off_policy_mask(batch.advantages, logprobs, old_logprobs, batch.mask,
                                   self.cfg.off_policy_mask_threshold)
            weights = keep if weights is None else weights * keep
        return {"ratio_level": self.cfg.ratio_level, "ratio_max": self.cfg.clip_ratio_max, "token_weights": weights}

    def loss(self, batch: PreparedBatch, logprobs, entropy, values) -> tuple[torch.Tensor, dict]:
        """The policy loss plus the regularisers every algorithm shares: β·KL(π‖π_ref) in the loss
        (unless it went into the reward; each token's weighted by the ratio π/π_old with
        `kl_ratio_weighted`) and −c_ent·entropy (over the tokens the policy term trains:
        the high-entropy ones with `top_entropy_quantile`, as TRL's bonus)."""
        loss, stats = self.policy_loss(batch, logprobs, entropy, values)
        stats["policy_loss"] = stats.get("policy_loss", loss.item())
        mean_entropy = self.aggregate(entropy, batch.mask)
        if self.cfg.ent_coef:
            q = self.cfg.top_entropy_quantile
            bonus = mean_entropy if q >= 1 else self.aggregate(
                entropy, batch.mask * high_entropy_mask(entropy, batch.mask, q).to(batch.mask.dtype))
            loss = loss - self.cfg.ent_coef * bonus
        stats["entropy"] = mean_entropy.item()
        stats["token_entropy"] = masked_mean(entropy.detach(), batch.mask).item()
        if batch.ref_logprobs is not None:
            per_token_kl = kl_estimate(logprobs, batch.ref_logprobs, self.cfg.kl_estimator, self.cfg.kl_clamp)
            if self.cfg.kl_ratio_weighted and not self.cfg.kl_in_reward:
                old = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs
                log_ratio = torch.where(batch.mask.bool(), logprobs - old, torch.zeros_like(logprobs))
                per_token_kl = per_token_kl * importance_ratio(log_ratio, batch.mask, self.cfg.ratio_level)
            kl = self.aggregate(per_token_kl, batch.mask)
            if not self.cfg.kl_in_reward:
                loss = loss + self.kl_coef * kl
            stats["kl"] = kl.item()
            stats["token_kl"] = masked_mean(per_token_kl.detach(), batch.mask).item()
        return loss, stats

    def _size(self, mask: torch.Tensor) -> float:
        """The weight in its minibatch's loss of the (micro-)batch with completion mask `mask`:
        valid tokens for token-level aggregation, else sequences (the loss is a mean over them)."""
        if self.cfg.loss_level == "token" and self.name != "reinforce":
            return mask.sum().item()
        return float(mask.size(0))

    def rows_in_pass(self, learner: Learner, batch: PreparedBatch) -> torch.Tensor | None:
        """(B,) True for the completions the update must run: an advantage other than 0 on a valid
        token. None when every completion must run: `algo.skip_zero_advantage` is off, the loss
        has a term that does not vanish with the advantage (KL in the loss, an entropy bonus, a
        value loss), several processes must run the same passes, or the tokens trained are picked
        among a micro-batch's (`top_entropy_quantile`)."""
        exact = (self.cfg.skip_zero_advantage and self.advantage_weighted and not self.uses_values
                 and not self.cfg.ent_coef and (batch.ref_logprobs is None or self.cfg.kl_in_reward)
                 and self.cfg.top_entropy_quantile >= 1)
        if not exact or learner.distributed:
            return None
        advantages = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None]
        return ((advantages != 0) & batch.mask.bool()).any(1)

    def update(self, learner: Learner, batch: PreparedBatch, metrics: dict) -> dict:
        """ppo_epochs × minibatches × micro-batches of updates on what `prepare` made of a rollout
        (`batch`, and its `metrics`); returns those metrics and the mean of each statistic over
        optimizer steps, named by `metric_name` (`train/<stat>`, or TRL's name). The loss statistics
        describe the completions the pass ran on (`train/update_fraction` of them, see `rows_in_pass`)."""
        n = len(batch)
        in_pass = self.rows_in_pass(learner, batch)
        mb_size = self.cfg.minibatch_size if 0 < self.cfg.minibatch_size < n else n
        sums: dict[str, float] = defaultdict(float)
        updates = 0
        for _ in range(self.cfg.ppo_epochs):
            order = torch.randperm(n, generator=learner.generators["data"]) if mb_size < n else torch.arange(n)
            for mb_idx in order.split(mb_size):
                whole = self._size(batch.mask[mb_idx.to(batch.mask.device)]) or 1.0  # the minibatch loss's normaliser
                run = mb_idx if in_pass is None else mb_idx[in_pass[mb_idx.to(in_pass.device)].cpu()]
                # none left: one completion (adding 0) still runs, so the optimizer gets the zero
                # gradients a full pass would give, not missing ones
                run = run if len(run) else mb_idx[:1]
                micro = [batch.rows(i) for i in run.chunk(self.ga_steps)]
                sizes = [self._size(mb.mask) for mb in micro]
                total = torch.zeros((), device=batch.sequences.device)
                for i, (mb, size) in enumerate(zip(micro, sizes)):
                    with learner.no_sync(sync=i == len(micro) - 1):
                        logp, entropy, values = policy_forward(learner.train_model, mb.sequences, mb.mask.size(1),
                                                               self.temperature, mb.attention_mask,
                                                               entropy_grad=bool(self.cfg.ent_coef))
                        loss, stats = self.loss(mb, logp, entropy, values)
                        (loss * (size / whole)).backward()
                    total += loss.detach() * (size / whole)
                    for k, v in stats.items():
                        sums[k] += v * size / (sum(sizes) or 1.0)
                sums["update_fraction"] += len(run) / len(mb_idx)
                for k, v in learner.optimizer_step(total).items():
                    sums[k] += v
                updates += 1
        metrics.update({metric_name(k): v / updates for k, v in sums.items()})
        self.adapt_kl_coef(metrics.get("rollout/kl"), n)
        return metrics

    def adapt_kl_coef(self, kl: float | None, batch_size: int) -> None:
        """Adaptive KL controller (Ziegler et al. 2019): β ← β·(1 + clip(KL/target − 1, ±0.2)·B/horizon),
        with KL the mean per-completion KL measured on this step's rollouts."""
        if self.cfg.kl_target <= 0 or kl is None or not math.isfinite(kl):
            return
        error = max(-0.2, min(0.2, kl / self.cfg.kl_target - 1.0))
        self.kl_coef *= 1.0 + error * batch_size / self.cfg.kl_horizon

    def shaped_reward_metrics(self, shaped: torch.Tensor) -> dict:
        """With the KL in the reward, the mean per-completion reward after it (verl's critic/rewards/mean);
        `shaped` is (B,) or (B, N) with the masked tokens 0. Nothing otherwise."""
        if not (self.cfg.kl_in_reward and self.kl_coef > 0):
            return {}
        return {"train/shaped_reward_mean": (shaped.sum(1) if shaped.dim() == 2 else shaped).float().mean().item()}

    def rollout_kl(self, logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None, mask) -> dict:
        """Mean per-completion KL of the rollouts to the reference (k1 summed over tokens)."""
        if logprobs is None or ref_logprobs is None:
            return {}
        return {"rollout/kl": ((logprobs - ref_logprobs) * mask).sum(1).mean().item(), "train/kl_coef": self.kl_coef}
