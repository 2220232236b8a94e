"""Rewards: a rollout scored by the task's verifier or by reward functions written as TRL writes
them, with errors that say which function and which sample broke it; `RewardModelScorer`, a learned
reward model as such a function.

    def reward_len(completions, **kwargs):                 # TRL's quick-start reward
        return [-abs(20 - len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]

    RLTrainer(cfg, reward_funcs=[reward_len, format_reward], reward_weights=[1.0, 0.5])

A reward function is called as TRL's GRPOTrainer calls it, with keywords only:
`f(prompts=, completions=, completion_ids=, trainer_state=, **columns)`. `prompts` and
`completions` are message lists for a chat task (a prompt is its conversation, a completion
`[{"role": "assistant", "content": text}]`) and texts otherwise; `completion_ids` are the sampled
token ids of each completion; `columns` are the task's other columns of each row
(`task.reward_kwargs`, e.g. a math row's `ground_truth`); `trainer_state` is a `TrainerState`. It
returns one float or None per completion; None means "not applicable" and is left out of the
weighted sum Σ_j w_j r_j, and a completion that no function scores is an error.

lmrl's older style, `f(prompts, completions, **columns)` called positionally with texts, still
works where one function is handed over on its own (`reward_fn=`, `reward.cls`): such a function
is recognised by its signature (see `called_positionally`)."""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..models.reward_model import load_reward_model
from .protocol import Conversational
from .text_batches import TextCodec, pad_sequences

# A batch of completions in, one float (or None: not applicable) per completion out.
RewardFn = Callable[..., Sequence[float | None]]

# The keywords a reward function gets from the trainer; a task column of the same name is not passed.
RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "environments")


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; nothing was updated."""


@dataclass(frozen=True)
class TrainerState:
    """What a reward function gets as `trainer_state` (TRL passes its TrainerState), for rewards
    shaped by training progress."""
    global_step: int = 0  # optimizer steps done before this batch (the warm-up's included)
    max_steps: int = 0  # the step the run ends at


def called_positionally(func) -> bool:
    """Whether `func` is an lmrl reward function of the older style, called `f(prompts, completions,
    **columns)` positionally with texts: it takes *args, or two or more positional parameters of
    which the first is not `completions`, and names neither `completion_ids` nor `trainer_state`.
    Everything else (`f(completions, **kwargs)`, `f(prompts, completions, completion_ids, **kw)`,
    `f(**kwargs)`) is called as TRL calls it."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # no signature to read (some builtins): TRL's call
        return False
    if "completion_ids" in params or "trainer_state" in params:
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return True
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[0].name != "completions"


def function_name(func) -> str:
    """The name a reward function's metrics and errors use: its __name__, else its class's."""
    inner = getattr(func, "func", None)  # functools.partial
    return getattr(func, "__name__", None) or getattr(inner, "__name__", None) or type(func).__name__


class RewardFunctions:
    """Reward functions combined into one reward per completion, Σ_j w_j r_j over the functions that
    scored it. `positional[j]` says how function j is called: positionally with texts (lmrl's older
    style) or, False, with keywords as TRL calls it. Names are the functions' own, made unique."""

    def __init__(self, funcs: Sequence[RewardFn], weights: Sequence[float] | None = None,
                 positional: Sequence[bool] | None = None):
        self.funcs = list(funcs)
        if not self.funcs:
            raise ValueError("reward functions: got an empty list (pass at least one function)")
        for f in self.funcs:
            if not callable(f):
                raise TypeError(f"reward functions: {f!r} is not callable")
        weights = [1.0] * len(self.funcs) if weights is None else list(weights)
        if len(weights) != len(self.funcs):
            raise ValueError(f"reward weights: {len(weights)} weights for {len(self.funcs)} reward functions "
                             f"({', '.join(map(function_name, self.funcs))}); give one weight per function")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ValueError(f"reward weights must be finite numbers, got {w!r}")
        self.weights = [float(w) for w in weights]
        self.positional = [False] * len(self.funcs) if positional is None else list(positional)
        self.names = []
        for j, f in enumerate(self.funcs):
            name = function_name(f)
            self.names.append(name if name not in self.names else f"{name}_{j}")

    @classmethod
    def of(cls, reward) -> RewardFunctions:
        """`reward` as RewardFunctions: itself; a list or tuple of functions, each called as TRL calls
        it; or one function, called in the style its signature shows (`called_positionally`)."""
        if isinstance(reward, RewardFunctions):
            return reward
        if isinstance(reward, (list, tuple)):
            return cls(reward)
        return cls([reward], positional=[called_positionally(reward)])

    def __len__(self) -> int:
        return len(self.funcs)

    def score(self, task, ids: torch.Tensor, rollout, trainer_state: TrainerState) -> tuple[torch.Tensor, dict]:
        """The combined rewards (B,) and each function's per-row rewards as
        {"rewards/<name>/mean": (B,) float, NaN where it returned None}."""
        p_txt, c_txt = task.texts(ids, rollout)
        columns = {k: v for k, v in task.reward_kwargs(ids).items() if k not in RESERVED}
        keywords = None  # built on first use: the TRL-style call's arguments
        per_function = []
        for j, func in enumerate(self.funcs):
            if self.positional[j]:
                values = _call(func, self.names[j], p_txt, c_txt, lambda: func(p_txt, c_txt, **columns))
            else:
                if keywords is None:
                    prompts, completions = (task.conversations(ids, rollout) if isinstance(task, Conversational)
                                            else (p_txt, c_txt))
                    keywords = dict(columns, prompts=prompts, completions=completions,
                                    completion_ids=completion_ids(rollout), trainer_state=trainer_state)
                    if getattr(rollout, "environments", None) is not None:  # a tool task's episodes, as TRL passes them
                        keywords["environments"] = rollout.environments
                values = _call(func, self.names[j], p_txt, c_txt, lambda: func(**keywords), trl=True)
            per_function.append(values)
        table = torch.tensor(per_function, dtype=torch.float32).T  # (B, F), NaN where a function returned None
        unscored = torch.isnan(table).all(dim=1)
        if unscored.any():
            i = int(unscored.nonzero()[0])
            raise RewardError(f"every reward function ({', '.join(self.names)}) returned None for prompt {p_txt[i]!r}, "
                              f"completion {c_txt[i]!r}: at least one must score each completion "
                              f"(None means not applicable)")
        weights = torch.tensor(self.weights, dtype=torch.float32)
        rewards = (torch.nan_to_num(table, nan=0.0) * weights).sum(dim=1)
        return rewards, {f"rewards/{name}/mean": table[:, j] for j, name in enumerate(self.names)}


def completion_ids(rollout) -> list[list[int]]:
    """Each completion's sampled token ids (the rollout's mask: up to EOS; an agent's own turns)."""
    return [c[m.bool()].tolist() for c, m in zip(rollout.completions.cpu(), rollout.mask.cpu())]


def _call(func, name: str, p_txt: Sequence[str], c_txt: Sequence[str], call, trl: bool = False) -> list[float]:
    """`call()`'s rewards as floats (NaN for None), or a RewardError that names the function and the
    sample: it raised, returned the wrong count, or something that is neither a finite number nor None."""
    try:
        values = list(call())
    except Exception as e:
        hint = ""
        if trl and isinstance(e, TypeError):
            hint = (" (reward functions are called with keywords prompts=, completions=, completion_ids=, "
                    "trainer_state= and every column of the row: take **kwargs)")
        raise RewardError(f"reward function {name} raised {type(e).__name__}: {e}{hint} "
                          f"(first sample: prompt {p_txt[0]!r}, completion {c_txt[0]!r})") from e
    if len(values) != len(p_txt):
        raise RewardError(f"reward function {name} returned {len(values)} rewards for {len(p_txt)} completions")
    for i, v in enumerate(values):
        if v is None:
            values[i] = math.nan
            continue
        try:
            values[i] = float(v)
        except (TypeError, ValueError):
            values[i] = math.nan
        if not math.isfinite(values[i]):
            raise RewardError(f"reward function {name} returned {v!r} for prompt {p_txt[i]!r}, "
                              f"completion {c_txt[i]!r}; rewards must be finite numbers (or None: not applicable)")
    return values


def score_rollout(task, ids: torch.Tensor, rollout, reward_fn=None, *, step: int = 0,
                  max_steps: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Rewards (B,) (or (B, N) per token), exact-match flags (B,) and extra per-row metrics
    {name: (B,)} for a rollout of problems `ids`.

    Exact match always comes from the task's verifier (it is the accuracy we report); the reward is
    the task's unless `reward_fn` is given: RewardFunctions, a list of functions (called as TRL calls
    them) or one function (either style; see the module docstring). Their weighted sum replaces the
    task's reward, and each function's per-row rewards join the extras as "rewards/<name>/mean"
    (NaN where it returned None, so average them over the rows that are not NaN). `step` and
    `max_steps` reach the functions as `trainer_state`."""
    if reward_fn is not None and getattr(task, "reward", None) is reward_fn:
        # open prompts scored by these very functions (`PromptTask.score_with`): no verifier, nothing to add
        rewards, per_function = reward_fn.score(task, ids, rollout, TrainerState(step, max_steps))
        episode = task.episode_metrics(rollout) if hasattr(task, "episode_metrics") else {}
        return rewards, torch.zeros(len(ids)), {**episode, **per_function}
    rewards, exact, extras = task.score_rollout(ids, rollout)
    if reward_fn is None:
        return rewards, exact, extras
    rewards, per_function = RewardFunctions.of(reward_fn).score(task, ids, rollout, TrainerState(step, max_steps))
    return rewards, exact, {**extras, **per_function}


def call_reward_fn(reward_fn: RewardFn, p_txt: Sequence[str], c_txt: Sequence[str], columns: dict) -> torch.Tensor:
    """`reward_fn(prompts, completions, **columns)` called positionally as a float tensor (B,), or a
    RewardError that names the function and the sample (None is refused here: nothing else scores it)."""
    name = function_name(reward_fn)
    values = _call(reward_fn, name, p_txt, c_txt, lambda: reward_fn(p_txt, c_txt, **columns))
    for i, v in enumerate(values):
        if math.isnan(v):
            raise RewardError(f"reward function {name} returned None for prompt {p_txt[i]!r}, completion "
                              f"{c_txt[i]!r}; it is the only reward, so it must score every completion")
    return torch.tensor(values, dtype=torch.float32)


def build_reward(cfg, *, reward_fn=None, reward_funcs=None, reward_weights=None) -> RewardFunctions | None:
    """The reward that replaces the task's in RL, from the Python arguments or the `reward` config
    section `cfg`, the first given of: `reward_funcs` (one function or a list, each called as TRL
    calls it, weighted by `reward_weights`); `reward_fn` (one function in either style, or a list as
    reward_funcs); `reward.funcs` (pkg.module:function each, weighted by `reward.weights`);
    `reward.cls` (one instance, either style). None: the task's own reward."""
    if reward_fn is not None and reward_funcs is not None:
        raise ValueError("pass reward_fn or reward_funcs, not both (reward_funcs takes one function or a list)")
    if reward_funcs is not None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        return RewardFunctions(funcs, reward_weights)
    if reward_fn is not None:
        reward = RewardFunctions.of(reward_fn)
        return reward if reward_weights is None else RewardFunctions(reward.funcs, reward_weights, reward.positional)
    if reward_weights is not None:
        raise ValueError("reward_weights needs reward_funcs (one weight per function)")
    if cfg is not None and cfg.funcs:
        return RewardFunctions([load_reward_function(spec) for spec in cfg.funcs], cfg.weights or None)
    if cfg is not None and cfg.cls:
        return RewardFunctions.of(load_reward_class(cfg.cls))
    return None


def _load(spec: str, key: str) -> Any:
    """The object `spec` ("package.module:name") names, or a one-line RewardError naming `key`."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise RewardError(f"{key}={spec!r}: cannot load it ({type(e).__name__}: {e})") from None


def load_reward_function(spec: str) -> RewardFn:
    """The reward function `spec` ("package.module:function") names; a class there is built with no
    arguments and its instance is the function."""
    obj = _load(spec, "reward.funcs")
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as e:
            raise RewardError(f"reward.funcs={spec!r}: {obj.__name__}() raised {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise RewardError(f"reward.funcs={spec!r}: {type(obj).__name__} object is not callable")
    return obj


def load_reward_class(spec: str):
    """An instance of the class `spec` names ("package.module:ClassName"), built with no arguments."""
    obj = _load(spec, "reward.cls")
    try:
        return obj()
    except Exception as e:
        raise RewardError(f"reward.cls={spec!r}: {spec.partition(':')[2]}() raised {type(e).__name__}: {e}") from None


class RewardModelScorer:
    """A reward function for the RL trainers: `scorer(prompts, completions, **_) -> list[float]`, the
    reward model's score of each prompt + completion, encoded as in reward-model training (a plain
    prompt through the chat template, the completion followed by the end token). Prompts and
    completions may be texts or, as TRL passes a chat task's, message lists."""

    def __init__(self, path: str | Path, *, device="cpu", batch_size: int = 16, chat: bool = True):
        self.path = str(path)
        self.model, self.tokenizer = load_reward_model(path, device=device)
        self.model.requires_grad_(False)
        self.codec = TextCodec(self.tokenizer, chat=chat)
        self.batch_size = batch_size
        self.device = torch.device(device)

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **_) -> list[float]:
        scores = []
        for i in range(0, len(completions), self.batch_size):
            rows = [self.codec.prompt_ids(p) + self.codec.reply_ids(p, c)[0]
                    for p, c in zip(prompts[i:i + self.batch_size], completions[i:i + self.batch_size])]
            ids, attention, _ = pad_sequences(rows, rows, self.tokenizer.pad_token_id, self.device)
            scores += self.model(ids, attention).tolist()
        return scores
