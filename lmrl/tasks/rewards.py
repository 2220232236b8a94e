"""Rewards: a rollout scored by the task's verifier or by reward functions written as TRL writes
them, with errors that say which function and which sample broke it; `RewardModelScorer`, a learned
reward model as such a function.

    def reward_len(completions, **kwargs):                 # TRL's quick-start reward
        return [-abs(20 - len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]

    RLTrainer(cfg, reward_funcs=[reward_len, format_reward], reward_weights=[1.0, 0.5])

A reward function is called as TRL's GRPOTrainer calls it, with keywords only:
`f(prompts=, completions=, completion_ids=, trainer_state=, log_metric=, log_extra=, **columns)`.
`prompts` and `completions` are message lists for a chat task (a prompt is its conversation, a
completion `[{"role": "assistant", "content": text}]`) and texts otherwise; `completion_ids` are
the sampled token ids of each completion; `columns` are the task's other columns of each row
(`task.reward_kwargs`, e.g. a math row's `ground_truth`); `trainer_state` is a `TrainerState`
(`global_step`, `max_steps`, `epoch`); `log_metric(name, value)` adds a number to the step's
metrics under `name` and `log_extra(column, values)` a column to the batch's (`RewardLog`). An
`async def` function is awaited, side by side with the other async ones. It returns one number
(int, float, a numpy or torch scalar) or None per completion; None means "not applicable" and is
left out of the weighted sum Σ_j w_j r_j (computed in float64, refused beyond float32's range), and
a completion that no function scores is an error (but a multi-turn episode whose environment failed:
it is left out, see `lmrl.generation.agent.leave_out_failed`). A tool task's episodes also pass
`environments=` (TRL's) and `environment_rewards=` (each one's `get_reward()`, as read when it
ended). A bool, a string or a dict is refused with the function, the index and the type. A function gets `reward.funcs_timeout_s` per batch: past it its
rewards count as None for that batch (`RewardFunctions`).

lmrl's positional style, `f(prompts, completions, **columns)` called positionally with texts, is
taken where one function is handed over on its own (`reward_fn=`, `reward.cls`): such a function
is recognised by its signature (see `called_positionally`).

Reward functions written for verl and OpenRLHF are taken as they are, wherever they are given, told
by their first parameters (`foreign_style`):
- verl's `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)` is
  called once per completion with keywords: the row's `data_source`, the completion's text, the
  row's `ground_truth` (`common.data.prompt_row`: verl's `reward_model.ground_truth`) and a copy of
  its `extra_info` (None where the row has none). It returns a number (a bool counts as 0/1, as in
  verl) or a dict whose "score" is the reward; the dict's other numeric values are logged per
  completion as `rewards/<name>/<key>`.
- OpenRLHF's `reward_func(queries, prompts, labels, **kwargs)` is called once per batch,
  positionally: each prompt as rendered for the model followed by its completion's text, the
  rendered prompts, and the rows' ground truths (`task.label_key`). It returns one reward per
  completion (a tensor or a list) or a dict {"rewards", "scores", "extra_logs": {name: values}}:
  "rewards" is the reward, "scores" and each extra log are logged as `rewards/<name>/<key>`.
`reward.funcs` names a function as `package.module:function` or `path/to/file.py:function` (verl's
custom_reward_function.path / name, OpenRLHF's --remote_rm_url file.py). `overlong_penalty` is
DAPO's overlong reward shaping as a TRL reward function."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import logging
import math
import numbers
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..common.chat import hold_template_kwargs
from ..envs.registry import import_module
from ..envs.tools import run_coroutines
from ..models.reward_model import load_reward_model
from .protocol import Conversational
from .text_batches import TextCodec, pad_sequences

logger = logging.getLogger("lmrl")

# A batch of completions in, one float (or None: not applicable) per completion out.
RewardFn = Callable[..., Sequence[float | None]]

# The keywords a reward function gets from the trainer; a task column of the same name is not passed.
RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "environments", "environment_rewards",
            "log_metric", "log_extra")
# Rewards are weighted and summed in float64, then trained on in float32, where anything larger is inf.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Seconds one reward function may take on one batch (`reward.funcs_timeout_s`): a bound against a
# hang, generous enough for a reward model on a CPU or a remote judge scoring a whole batch.
DEFAULT_TIMEOUT_S = 300.0


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; nothing was updated."""


@dataclass(frozen=True)
class TrainerState:
    """What a reward function gets as `trainer_state` (TRL passes transformers' TrainerState, whose
    names these are), for rewards shaped by training progress."""
    global_step: int = 0  # optimizer steps done before this batch (the warm-up's included)
    max_steps: int = 0  # the step the run ends at
    epoch: float = 0.0  # passes over the training prompts so far (0.0 where the task does not say how many)


@dataclass
class RewardLog:
    """What the reward functions logged while scoring one batch through TRL's keywords, and which
    of them ran out of time. `log_metric(name, value)`: a number; the trainer averages a step's
    values of each name into the step's metrics under that name, as TRL does. `log_extra(column,
    values)`: a column of the batch's completions, one value per completion, written beside them
    by the trainer's completions log (`train.log_completions`; TRL's completions table)."""
    metrics: dict[str, list[float]] = field(default_factory=dict)
    columns: dict[str, list] = field(default_factory=dict)
    timed_out: list[str] = field(default_factory=list)  # names of the functions over the time limit

    def log_metric(self, name: str, value: float) -> None:
        number = _as_number(value)
        if number is None:
            raise TypeError(f"log_metric({name!r}, {value!r}): the value must be a number (int, float, a numpy or "
                            f"torch scalar)")
        self.metrics.setdefault(str(name), []).append(number)

    def log_extra(self, column: str, values: Sequence) -> None:
        self.columns.setdefault(str(column), []).extend(values)


def called_positionally(func) -> bool:
    """Whether `func` is an lmrl reward function of the positional style, called `f(prompts, completions,
    **columns)` positionally with texts: it takes *args, or two or more positional parameters of
    which the first is not `completions`, and names none of the keywords only TRL passes
    (`completion_ids`, `trainer_state`, `log_metric`, `log_extra`). Everything else
    (`f(completions, **kwargs)`, `f(prompts, completions, completion_ids, **kw)`, `f(**kwargs)`) is
    called as TRL calls it."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # no signature to read (some builtins): TRL's call
        return False
    if any(name in params for name in ("completion_ids", "trainer_state", "log_metric", "log_extra")):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return True
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[0].name != "completions"


# The first parameters that tell a reward function written for verl (one completion a call) or for
# OpenRLHF (one batch a call) from TRL's and lmrl's.
FOREIGN_STYLES = {"verl": ("data_source", "solution_str"), "openrlhf": ("queries", "prompts", "labels")}
# How each style is called, for the hint beside a TypeError it raises.
CALLED_AS = {
    "trl": "reward functions are called with keywords prompts=, completions=, completion_ids=, trainer_state=, "
           "log_metric=, log_extra= and every column of the row: take **kwargs",
    "verl": "verl's compute_score is called once per completion with keywords data_source=, solution_str=, "
            "ground_truth= and extra_info= (when it takes them)",
    "openrlhf": "OpenRLHF's reward_func is called once per batch as reward_func(queries, prompts, labels)",
}


def foreign_style(func) -> str | None:
    """"verl" when `func`'s first positional parameters are (data_source, solution_str), as verl's
    compute_score takes them; "openrlhf" when they are (queries, prompts, labels), as OpenRLHF's
    reward_func; None otherwise (a TRL or lmrl function)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return None
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return next((style for style, first in FOREIGN_STYLES.items() if names[:len(first)] == first), None)


def is_async_callable(func) -> bool:
    """Whether calling `func` gives a coroutine, as TRL tells: an async function, a functools.partial
    of one, or an object whose `__call__` is one."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


def function_name(func) -> str:
    """The name a reward function's metrics and errors use: its __name__, else its class's."""
    inner = getattr(func, "func", None)  # functools.partial
    return getattr(func, "__name__", None) or getattr(inner, "__name__", None) or type(func).__name__


class RewardFunctions:
    """Reward functions combined into one reward per completion, Σ_j w_j r_j over the functions that
    scored it. `positional[j]` says how function j is called: True, positionally with texts
    (`called_positionally`), or False, with keywords as TRL calls it; a function written for verl or
    OpenRLHF is called as they call it whatever it says (`foreign_style`, kept in `styles[j]`).
    Names are the functions' own, made unique.

    As in TRL, plain functions are called one after another and async ones are then awaited side by
    side in one event loop. Each runs in a thread of its own for at most `timeout_s` seconds (0: no
    limit, in the caller's thread, as TRL runs them); past it, its rewards for the batch count as
    None and a line says so. A Python thread cannot be stopped, so the call runs on in the
    background, and the function is not called again until it has returned (its batches meanwhile
    count as None too). A function whose call fails because it sets a signal handler (math-verify's
    default timeouts use signal.alarm, which works in the main thread only) is called in the
    caller's thread from then on, without the limit."""

    def __init__(self, funcs: Sequence[RewardFn], weights: Sequence[float] | None = None,
                 positional: Sequence[bool] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
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
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 <= timeout_s < math.inf:
            raise ValueError(f"reward functions' timeout_s must be a finite number of seconds >= 0 (0: no limit), "
                             f"got {timeout_s!r}")
        self.weights = [float(w) for w in weights]
        self.positional = [False] * len(self.funcs) if positional is None else list(positional)
        # "verl" | "openrlhf" | "positional" | "trl": how function j is called and what it returns
        self.styles = [foreign_style(f) or ("positional" if p else "trl") for f, p in zip(self.funcs, self.positional)]
        self.timeout_s = float(timeout_s)
        self.names = []
        for j, f in enumerate(self.funcs):
            name = function_name(f)
            self.names.append(name if name not in self.names else f"{name}_{j}")
        self._running: dict[int, threading.Thread] = {}  # function -> its call still running past the limit
        self._in_caller: set[int] = set()  # functions that set signal handlers: called in the caller's thread

    @classmethod
    def of(cls, reward, timeout_s: float = DEFAULT_TIMEOUT_S) -> RewardFunctions:
        """`reward` as RewardFunctions: itself; a list or tuple of functions, each called as TRL calls
        it; or one function, called in the style its signature shows (`called_positionally`)."""
        if isinstance(reward, RewardFunctions):
            return reward
        if isinstance(reward, (list, tuple)):
            return cls(reward, timeout_s=timeout_s)
        return cls([reward], positional=[called_positionally(reward)], timeout_s=timeout_s)

    def __len__(self) -> int:
        return len(self.funcs)

    def score(self, task, ids: torch.Tensor, rollout, trainer_state: TrainerState,
              log: RewardLog | None = None) -> tuple[torch.Tensor, dict]:
        """The combined rewards (B,) and each function's per-row rewards as
        {"rewards/<name>/mean": (B,) float, NaN where it returned None}, with the values a verl or
        OpenRLHF function returned beside its reward as {"rewards/<name>/<key>": (B,) float}. A
        completion left unscored because a function ran out of time has the reward NaN
        (`fill_unscored`); one that every function declined (None) is an error. `log` collects what
        the functions logged."""
        log = RewardLog() if log is None else log
        p_txt, c_txt = task.texts(ids, rollout)
        columns = {k: v for k, v in task.reward_kwargs(ids).items() if k not in RESERVED}
        keywords = None  # built on first use: the TRL-style call's arguments
        calls = []
        for j, func in enumerate(self.funcs):
            if self.styles[j] == "verl":
                each = _verl_scores_async if is_async_callable(func) else _verl_scores
                calls.append(functools.partial(each, func, c_txt, columns))
                continue
            if self.styles[j] == "openrlhf":  # queries are what the model read and wrote, as OpenRLHF decodes them
                labels = columns.get("ground_truth", [None] * len(p_txt))
                calls.append(functools.partial(func, [p + c for p, c in zip(p_txt, c_txt)], list(p_txt), list(labels)))
                continue
            if self.positional[j]:
                calls.append(functools.partial(func, p_txt, c_txt, **columns))
                continue
            if keywords is None:
                prompts, completions = (task.conversations(ids, rollout) if isinstance(task, Conversational)
                                        else (p_txt, c_txt))
                keywords = dict(columns, prompts=prompts, completions=completions,
                                completion_ids=completion_ids(rollout), trainer_state=trainer_state,
                                log_metric=log.log_metric, log_extra=log.log_extra)
                if getattr(rollout, "environments", None) is not None:  # a tool task's episodes, as TRL passes them
                    keywords["environments"] = rollout.environments
                    keywords["environment_rewards"] = getattr(rollout, "final_rewards", None) or None
            calls.append(functools.partial(func, **keywords))
        asynchronous = [j for j, f in enumerate(self.funcs) if is_async_callable(f)]
        outcomes = {j: self._call(j, calls[j]) for j in range(len(calls)) if j not in asynchronous}
        if asynchronous:
            outcomes.update(self._await(asynchronous, calls))
        per_function, timed_out, logged = [], [], {}
        for j, name in enumerate(self.names):
            kind, value = outcomes[j]
            if kind == "raised":
                at, error = (value.index, value.error) if isinstance(value, _SampleError) else (None, value)
                raise _raised(name, error, p_txt, c_txt, style=self.styles[j], at=at) from error
            if kind == "timed out":
                running_on = " (the call runs on in the background)" if value.startswith("took") else ""
                logger.warning(f"reward function {name} {value}: its rewards are left out of this batch{running_on}")
                timed_out.append(name)
                per_function.append([math.nan] * len(p_txt))
                continue
            value, extras = _split_returns(self.styles[j], name, value, len(p_txt))
            per_function.append(_rewards(name, value, p_txt, c_txt))
            logged.update({f"rewards/{name}/{_extra_name(key)}": torch.tensor(values, dtype=torch.float32)
                           for key, values in extras.items()})
        log.timed_out.extend(timed_out)
        table = torch.tensor(per_function, dtype=torch.float64).T  # (B, F), NaN where a function returned None
        unscored = torch.isnan(table).all(dim=1)
        failed = getattr(rollout, "failed", None)
        if failed is not None:  # an episode whose environment failed is left out of the rewards anyway
            unscored &= ~failed.cpu()
        if unscored.any() and not timed_out:
            i = int(unscored.nonzero()[0])
            raise RewardError(f"every reward function ({', '.join(self.names)}) returned None for prompt {p_txt[i]!r}, "
                              f"completion {c_txt[i]!r}: at least one must score each completion "
                              f"(None means not applicable)")
        weights = torch.tensor(self.weights, dtype=torch.float64)
        rewards = (torch.nan_to_num(table, nan=0.0) * weights).sum(dim=1)
        over = rewards.abs() > FLOAT32_MAX
        if over.any():
            i = int(over.nonzero()[0])
            raise RewardError(f"the weighted reward of completion {i} (prompt {p_txt[i]!r}, completion "
                              f"{c_txt[i]!r}) is {rewards[i].item():g}: beyond float32's range (±3.4e38), in which "
                              f"rewards are trained on; scale the reward functions or their weights down")
        rewards[unscored] = math.nan
        return rewards.float(), {**{f"rewards/{name}/mean": table[:, j].float() for j, name in enumerate(self.names)},
                                 **logged}

    def _limit(self) -> str:
        return f"reward.funcs_timeout_s={self.timeout_s:g}s"

    def _still_running(self, j: int) -> bool:
        running = self._running.get(j)
        return running is not None and running.is_alive()

    def _call(self, j: int, call) -> tuple[str, Any]:
        """("done", what function j returned) | ("raised", the exception) | ("timed out", why), the
        call made in a thread of its own within the time limit."""
        if not self.timeout_s or j in self._in_caller:
            return _outcome(call)
        if self._still_running(j):
            return "timed out", f"is still running its call on an earlier batch (past {self._limit()})"
        worker = _Worker(call)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            self._running[j] = worker
            return "timed out", f"took longer than {self._limit()} on a batch of {_batch_size(call)}"
        kind, value = worker.outcome
        if kind == "raised" and _needs_main_thread(value) and threading.current_thread() is threading.main_thread():
            self._in_caller.add(j)
            logger.info(f"reward function {self.names[j]} sets a signal handler (math-verify's default timeouts "
                        f"do), which works in the main thread only: it runs there from now on, without {self._limit()}")
            return _outcome(call)
        return kind, value

    def _await(self, js: list[int], calls: list) -> dict[int, tuple[str, Any]]:
        """The async functions `js`' outcomes (as `_call`'s), awaited side by side in one event loop, as
        TRL gathers them, each within the time limit; the loop runs in a thread of its own, so a
        coroutine that blocks it (a sleep that is not awaited) is bounded too."""
        outcomes = {j: ("timed out", f"is still running its call on an earlier batch (past {self._limit()})")
                    for j in js if self._still_running(j)}
        ready = [j for j in js if j not in outcomes]
        if not ready:
            return outcomes
        done: dict[int, tuple[str, Any]] = {}
        took = f"took longer than {self._limit()} on a batch of {_batch_size(calls[js[0]])}"

        async def bounded(j: int) -> None:
            try:
                task = asyncio.ensure_future(calls[j]())
            except Exception as e:
                done[j] = ("raised", e)
                return
            finished, _ = await asyncio.wait({task}, timeout=self.timeout_s or None)
            if not finished:
                task.cancel()
                done[j] = ("timed out", took)
            elif task.cancelled():
                done[j] = ("raised", asyncio.CancelledError("the reward coroutine was cancelled"))
            elif task.exception() is not None:
                done[j] = ("raised", task.exception())
            else:
                done[j] = ("done", task.result())

        gather = functools.partial(run_coroutines, [bounded(j) for j in ready])
        if not self.timeout_s:
            gather()
            return {**outcomes, **done}
        worker = _Worker(gather)
        worker.start()
        worker.join(self.timeout_s + 1.0)  # a second for the loop to wind down after cancelling
        done = dict(done)
        for j in ready:
            if j not in done:
                done[j] = ("timed out", took)
            if done[j][0] == "timed out" and worker.is_alive():
                self._running[j] = worker
        return {**outcomes, **done}


class _Worker(threading.Thread):
    """One call in a daemon thread: abandoned past the time limit (a Python thread cannot be
    stopped), and never keeping the process from exiting."""

    def __init__(self, call):
        super().__init__(daemon=True, name="lmrl-reward")
        self.call, self.outcome = call, None

    def run(self) -> None:
        self.outcome = _outcome(self.call)


def _outcome(call) -> tuple[str, Any]:
    """("done", call()'s value, awaited if it is awaitable) or ("raised", the exception)."""
    try:
        value = call()
        if inspect.isawaitable(value):
            (value,) = run_coroutines([value])
            if isinstance(value, Exception):
                raise value
        return "done", value
    except Exception as e:
        return "raised", e


def _needs_main_thread(e: BaseException | None) -> bool:
    """Whether `e` or what led to it is Python refusing to set a signal handler off the main thread."""
    for _ in range(8):  # a chain of causes is short; this bounds a pathological one
        if e is None:
            return False
        if isinstance(e, ValueError) and "signal only works in main thread" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _batch_size(call) -> int:
    """The number of completions a prepared call scores."""
    kw = getattr(call, "keywords", {})
    return len(kw["completions"]) if "completions" in kw else len(call.args[1])


def _raised(name: str, e: Exception, p_txt: Sequence[str], c_txt: Sequence[str], style: str,
            at: int | None = None) -> RewardError:
    """The one-line error of function `name` (called in `style`) that raised `e`, on completion `at`
    when it is known (a function called once per completion), else shown with the batch's first."""
    hint = f" ({CALLED_AS[style]})" if isinstance(e, TypeError) and style in CALLED_AS else ""
    sample = "first sample" if at is None else f"sample {at}"
    i = at or 0
    return RewardError(f"reward function {name} raised {type(e).__name__}: {e}{hint} "
                       f"({sample}: prompt {p_txt[i]!r}, completion {c_txt[i]!r})")


class _SampleError(Exception):
    """A reward function called once per completion (verl's) failed on completion `index` with `error`."""

    def __init__(self, index: int, error: Exception):
        super().__init__(index, error)
        self.index, self.error = index, error


def _verl_arguments(func, c_txt: Sequence[str], columns: dict) -> list[dict]:
    """The keywords verl's reward managers call `compute_score` with, one dict per completion: the row's
    data_source, the completion's text, the row's ground_truth and, when `func` takes it, a copy of the
    row's extra_info (None where the row has none)."""
    n = len(c_txt)
    column = {key: columns.get(key) or [None] * n for key in ("data_source", "ground_truth", "extra_info")}
    params = _parameters(func)
    takes_extra = "extra_info" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    calls = []
    for i in range(n):
        kwargs = {"data_source": column["data_source"][i], "solution_str": c_txt[i],
                  "ground_truth": column["ground_truth"][i]}
        if takes_extra:
            extra = column["extra_info"][i]
            kwargs["extra_info"] = dict(extra) if isinstance(extra, dict) else extra
        calls.append(kwargs)
    return calls


def _parameters(func) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(func).parameters
    except (TypeError, ValueError):
        return {}


def _verl_scores(func, c_txt: Sequence[str], columns: dict) -> list:
    """What verl's `compute_score` returned for each completion, one call each; a _SampleError names the
    completion whose call raised."""
    results = []
    for i, kwargs in enumerate(_verl_arguments(func, c_txt, columns)):
        try:
            results.append(func(**kwargs))
        except Exception as e:
            raise _SampleError(i, e) from e
    return results


async def _verl_scores_async(func, c_txt: Sequence[str], columns: dict) -> list:
    """`_verl_scores` of an async `compute_score`: the completions' calls awaited side by side."""
    async def one(i: int, kwargs: dict):
        try:
            return await func(**kwargs)
        except Exception as e:
            raise _SampleError(i, e) from e

    return list(await asyncio.gather(*(one(i, kw) for i, kw in enumerate(_verl_arguments(func, c_txt, columns)))))


def _split_returns(style: str, name: str, returned, n: int) -> tuple[Any, dict[str, list[float]]]:
    """(the rewards, {key: n values to log}) in what function `name`, called in `style`, returned for
    `n` completions: for verl, each completion's number or dict's "score" (a bool as 0/1) and the
    dicts' other numbers (NaN where a completion's dict lacks the key); for OpenRLHF's dict, its
    "rewards", and its "scores" and "extra_logs" values (one for the batch or one per completion);
    anything else is the rewards as returned, checked by `_rewards`."""
    if style == "verl":
        rewards, extras = [], {}
        for i, result in enumerate(returned):
            if isinstance(result, dict):
                if "score" not in result:
                    keys = ", ".join(map(repr, result)) or "none"
                    raise RewardError(f"reward function {name} returned a dict without 'score' at index {i} (keys: "
                                      f"{keys}); verl's compute_score returns a number or a dict whose 'score' is "
                                      f"the reward")
                for key, value in result.items():
                    number = _loggable(value)
                    if key != "score" and number is not None:
                        extras.setdefault(str(key), [math.nan] * n)[i] = number
                result = result["score"]
            rewards.append(float(result) if isinstance(result, (bool, np.bool_)) else result)
        return rewards, extras
    if style == "openrlhf" and isinstance(returned, dict):
        if "rewards" not in returned:
            keys = ", ".join(map(repr, returned)) or "none"
            raise RewardError(f"reward function {name} returned a dict without 'rewards' (keys: {keys}); OpenRLHF's "
                              f"reward_func returns the rewards or {{'rewards': ..., 'scores': ..., 'extra_logs': "
                              f"{{name: values}}}}")
        logs = returned.get("extra_logs") or {}
        if not isinstance(logs, dict):
            raise RewardError(f"reward function {name} returned 'extra_logs' as a {_type_name(logs)}; it must be a "
                              f"dict of name: values")
        named = [("scores", returned.get("scores")), *logs.items()]
        return returned["rewards"], {str(k): rows for k, v in named if (rows := _per_row(v, n)) is not None}
    return returned, {}


def _loggable(value) -> float | None:
    """`value` as a finite float to log (a bool as 0/1), or None."""
    number = float(value) if isinstance(value, (bool, np.bool_)) else _as_number(value)
    return number if number is not None and math.isfinite(number) else None


def _per_row(value, n: int) -> list[float] | None:
    """`value` as n numbers to log: one number repeated, or one per completion (NaN where one is not a
    number); None when it is neither."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()  # a 0-d one becomes its number
    one = _loggable(value)
    if one is not None:
        return [one] * n
    if isinstance(value, (list, tuple)) and len(value) == n:
        return [math.nan if (x := _loggable(v)) is None else x for v in value]
    return None


def _extra_name(key: str) -> str:
    """The metric name of a value returned beside a reward; `mean` and `std` name the reward's own numbers."""
    return f"extra_{key}" if key in ("mean", "std") else key


def _as_number(v) -> float | None:
    """`v` as a float if it is a number (int, float, a numpy number, a 0-d numpy array or torch tensor
    of a real dtype), else None. A bool is no number here: True for 1.0 is a slip more often than not."""
    if isinstance(v, torch.Tensor):
        if v.dim() or v.dtype == torch.bool or v.is_complex():
            return None
        v = v.item()
    elif isinstance(v, np.ndarray):
        if v.ndim or v.dtype.kind not in "iuf":
            return None
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return None
    try:
        return float(v)
    except OverflowError:  # an int beyond float64
        return math.copysign(math.inf, v)


def _type_name(v) -> str:
    kind = type(v)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.partition('.')[0]}.{kind.__name__}"


def _excerpt(v, width: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= width else text[: width - 3] + "..."


def _rewards(name: str, returned, p_txt: Sequence[str], c_txt: Sequence[str]) -> list[float]:
    """What reward function `name` returned as floats (NaN for None), or a RewardError naming the
    function and the sample: the wrong count, a value that is not a number or None, a non-finite
    number or one beyond float32's range."""
    if isinstance(returned, (str, bytes, dict)) or not hasattr(returned, "__iter__"):
        raise RewardError(f"reward function {name} returned a {_type_name(returned)} ({_excerpt(returned)}); it must "
                          f"return a list with one reward per completion")
    values = list(returned)
    if len(values) != len(p_txt):
        raise RewardError(f"reward function {name} returned {len(values)} rewards for {len(p_txt)} completions")
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        x = _as_number(v)
        where = f"at index {i} (prompt {p_txt[i]!r}, completion {c_txt[i]!r})"
        if x is None:
            bool_hint = " (for a bool, return float(x))" if isinstance(v, (bool, np.bool_)) else ""
            raise RewardError(f"reward function {name} returned a {_type_name(v)} ({_excerpt(v)}) {where}; a reward is "
                              f"a number (int, float, a numpy or torch scalar) or None (not applicable){bool_hint}")
        if not math.isfinite(x):
            raise RewardError(f"reward function {name} returned {v!r} for prompt {p_txt[i]!r}, completion "
                              f"{c_txt[i]!r}; rewards must be finite numbers (or None: not applicable)")
        if abs(x) > FLOAT32_MAX:
            raise RewardError(f"reward function {name} returned {x!r} {where}: beyond float32's range (±3.4e38), in "
                              f"which rewards are trained on; scale it down")
        out.append(x)
    return out


def completion_ids(rollout) -> list[list[int]]:
    """Each completion's sampled token ids (the rollout's mask: up to EOS; an agent's own turns)."""
    return [c[m.bool()].tolist() for c, m in zip(rollout.completions.cpu(), rollout.mask.cpu())]


def function_rewards(extras: dict) -> dict[str, torch.Tensor]:
    """Each reward function's rewards (B,) among `score_rollout`'s extras ("rewards/<name>/mean"), by
    the function's name; NaN where it returned None or ran out of time."""
    return {key.removeprefix("rewards/").removesuffix("/mean"): values for key, values in extras.items()
            if key.startswith("rewards/") and key.endswith("/mean")}


def fill_unscored(rewards: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards (B,) with each NaN, a completion no reward function scored because one ran out of
    time or an episode whose environment failed, replaced by the mean reward of its prompt's scored
    completions (0.0 where none was), and
    (B,) bool: which they were). The trainer zeroes their loss mask: they carry no gradient, and
    the fill leaves their group's mean where the scored completions put it."""
    unscored = rewards.isnan()
    filled = rewards.clone()
    ids = ids.to(rewards.device)
    for i in unscored.nonzero()[:, 0].tolist():
        same = (ids == ids[i]) & ~unscored
        filled[i] = rewards[same].mean() if same.any() else 0.0
    return filled, unscored


def score_rollout(task, ids: torch.Tensor, rollout, reward_fn=None, *, step: int = 0, max_steps: int = 0,
                  epoch: float = 0.0, log: RewardLog | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Rewards (B,) (or (B, N) per token), exact-match flags (B,) and extra per-row metrics
    {name: (B,)} for a rollout of problems `ids`.

    Exact match always comes from the task's verifier (it is the accuracy we report; a task scored
    by reward functions alone, open prompts, has none: zeros, and is not scored twice); the reward is
    the task's unless `reward_fn` is given: RewardFunctions, a list of functions (called as TRL calls
    them) or one function (either style; see the module docstring). Their weighted sum replaces the
    task's reward (NaN where a function's time ran out and no other scored the completion:
    `fill_unscored`), and each function's per-row rewards join the extras as "rewards/<name>/mean"
    (NaN where it returned None, so average them over the rows that are not NaN). An episode whose
    environment failed has NaN in all of them (`leave_out_failed`). `step`, `max_steps` and `epoch`
    reach the functions as `trainer_state`; `log` collects what they logged."""
    from ..generation.agent import leave_out_failed

    state = TrainerState(step, max_steps, epoch)
    if reward_fn is not None and isinstance(getattr(task, "reward", None), RewardFunctions):
        # open prompts scored by reward functions alone (`PromptTask`: the run's own after `score_with`, or
        # reward.cls's instance, from which the run's are built too): no verifier, so scored once, by the run's
        rewards, per_function = RewardFunctions.of(reward_fn).score(task, ids, rollout, state, log)
        episode = task.episode_metrics(rollout) if hasattr(task, "episode_metrics") else {}
        return leave_out_failed(rollout, rewards, torch.zeros(len(ids)), {**episode, **per_function})
    rewards, exact, extras = task.score_rollout(ids, rollout)
    if reward_fn is None:
        return rewards, exact, extras
    rewards, per_function = RewardFunctions.of(reward_fn).score(task, ids, rollout, state, log)
    return leave_out_failed(rollout, rewards, exact, {**extras, **per_function})


def call_reward_fn(reward_fn: RewardFn, p_txt: Sequence[str], c_txt: Sequence[str], columns: dict) -> torch.Tensor:
    """`reward_fn(prompts, completions, **columns)` called positionally as a float tensor (B,), or a
    RewardError that names the function and the sample (None is refused here: nothing else scores it)."""
    name = function_name(reward_fn)
    kind, value = _outcome(lambda: reward_fn(p_txt, c_txt, **columns))
    if kind == "raised":
        raise _raised(name, value, p_txt, c_txt, style="positional") from value
    values = _rewards(name, value, p_txt, c_txt)
    for i, v in enumerate(values):
        if math.isnan(v):
            raise RewardError(f"reward function {name} returned None for prompt {p_txt[i]!r}, completion "
                              f"{c_txt[i]!r}; it is the only reward, so it must score every completion")
    return torch.tensor(values, dtype=torch.float32)


def overlong_penalty(max_completion_length: int, buffer_len: int, penalty_factor: float = 1.0) -> RewardFn:
    """DAPO's overlong reward shaping as a TRL reward function (verl's DAPORewardManager with
    `reward_model.overlong_buffer.{len, penalty_factor}` and max_resp_len, OpenRLHF's
    `--overlong_buffer_len --overlong_penalty_factor`). A completion of L tokens (its `completion_ids`,
    the end-of-sequence token counted, as verl and OpenRLHF count a response) gets

        -min(max(L - (max_completion_length - buffer_len), 0), buffer_len) / buffer_len * penalty_factor

    0 up to max_completion_length - buffer_len tokens, then down linearly to -penalty_factor at
    max_completion_length (task.max_new_tokens). DAPO adds it to the answer's score: list it beside
    the function that scores the answer, `reward_funcs=[compute_score, overlong_penalty(512, 128)]`,
    or from YAML bind its arguments in a module of your own (`overlong = overlong_penalty(512, 128)`
    in my_rewards.py, then `reward.funcs: [my_rewards.py:overlong]`)."""
    for name, value in (("max_completion_length", max_completion_length), ("buffer_len", buffer_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"overlong_penalty: {name} must be a whole number of tokens >= 1, got {value!r}")
    if buffer_len > max_completion_length:
        raise ValueError(f"overlong_penalty: buffer_len={buffer_len} is longer than max_completion_length="
                         f"{max_completion_length}; the buffer is the last tokens before the length limit")
    if isinstance(penalty_factor, bool) or not isinstance(penalty_factor, (int, float)) or \
            not 0 <= penalty_factor < math.inf:
        raise ValueError(f"overlong_penalty: penalty_factor must be a finite number >= 0, got {penalty_factor!r}")
    expected = max_completion_length - buffer_len  # the longest completion with no penalty

    def overlong_penalty(completion_ids, **kwargs) -> list[float]:
        over = [min(max(len(ids) - expected, 0), buffer_len) for ids in completion_ids]  # tokens into the buffer
        return [-k / buffer_len * penalty_factor if k else 0.0 for k in over]

    return overlong_penalty


def build_reward(cfg, *, reward_fn=None, reward_funcs=None, reward_weights=None) -> RewardFunctions | None:
    """The reward that replaces the task's in RL, from the Python arguments or the `reward` config
    section `cfg`, the first given of: `reward_funcs` (one function or a list, each called as TRL
    calls it, weighted by `reward_weights`); `reward_fn` (one function in either style, or a list as
    reward_funcs); `reward.funcs` (pkg.module:function each, weighted by `reward.weights`);
    `reward.cls` (one instance, either style). None: the task's own reward. Each function's time on
    a batch is bounded by `reward.funcs_timeout_s`."""
    if reward_fn is not None and reward_funcs is not None:
        raise ValueError("pass reward_fn or reward_funcs, not both (reward_funcs takes one function or a list)")
    timeout_s = getattr(cfg, "funcs_timeout_s", DEFAULT_TIMEOUT_S)
    if reward_funcs is not None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        return RewardFunctions(funcs, reward_weights, timeout_s=timeout_s)
    if reward_fn is not None:
        reward = RewardFunctions.of(reward_fn, timeout_s)
        return reward if reward_weights is None else RewardFunctions(reward.funcs, reward_weights, reward.positional,
                                                                      timeout_s=reward.timeout_s)
    if reward_weights is not None:
        raise ValueError("reward_weights needs reward_funcs (one weight per function)")
    if cfg is not None and cfg.funcs:
        return RewardFunctions([load_reward_function(spec) for spec in cfg.funcs], cfg.weights or None,
                               timeout_s=timeout_s)
    if cfg is not None and cfg.cls:
        return RewardFunctions.of(load_reward_class(cfg.cls), timeout_s)
    return None


def _load(spec: str, key: str) -> Any:
    """The object `spec` names, "package.module:name" (found on sys.path, then in the current directory)
    or "path/to/file.py:name" (`load_file_module`), or a one-line RewardError naming `key`."""
    module_name, _, attr = spec.rpartition(":")
    try:
        module = load_file_module(module_name) if module_name.endswith(".py") else import_module(module_name)
        return getattr(module, attr)
    except Exception as e:  # whatever importing the user's module raised, said in one line
        raise RewardError(f"{key}={spec!r}: cannot load it ({type(e).__name__}: {e})") from None


def load_file_module(path: str):
    """The module a `.py` file defines, run once per process (as verl loads custom_reward_function.path
    and OpenRLHF a --remote_rm_url file): a relative path is the current directory's; the module is
    registered in sys.modules under a name made from its absolute path, so its functions pickle."""
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no file {path} (from {Path.cwd()})")
    name = "lmrl_file_" + "".join(c if c.isalnum() else "_" for c in str(file.with_suffix("")))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_reward_function(spec: str) -> RewardFn:
    """The reward function `spec` ("package.module:function" or "path/to/file.py:function") names; a
    class there is built with no arguments and its instance is the function."""
    obj = _load(spec, "reward.funcs")
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as e:
            raise RewardError(f"reward.funcs={spec!r}: {obj.__name__}() raised {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise RewardError(f"reward.funcs={spec!r}: {type(obj).__name__} object is not callable")
    if obj is overlong_penalty:  # a factory: its arguments make the function
        raise RewardError(f"reward.funcs={spec!r} makes a reward function from its arguments: bind them in a module "
                          f"of your own (overlong = overlong_penalty(max_completion_length, buffer_len, "
                          f"penalty_factor)) and name that (my_rewards.py:overlong)")
    return obj


def load_reward_class(spec: str):
    """An instance of the class `spec` names ("package.module:ClassName" or "path/to/file.py:ClassName"),
    built with no arguments: a reward function, called in the style its `__call__` shows (TRL's,
    lmrl's positional, verl's compute_score, OpenRLHF's reward_func; `RewardFunctions.of`). A function
    that takes arguments is not a class: it is refused, naming `reward.funcs`, where reward functions go
    (built with no arguments, it would fail on its own missing parameters)."""
    obj = _load(spec, "reward.cls")
    name = spec.rpartition(":")[2]
    if not inspect.isclass(obj) and callable(obj) and _needs_arguments(obj):
        raise RewardError(f"reward.cls={spec!r} names a reward function, {name}{inspect.signature(obj)}, not a "
                          f"class: name it in reward.funcs (reward.funcs=[{spec}])")
    try:
        instance = obj()
    except Exception as e:
        raise RewardError(f"reward.cls={spec!r}: {name}() raised {type(e).__name__}: {e}") from None
    if not callable(instance):
        raise RewardError(f"reward.cls={spec!r}: a {type(instance).__name__} instance is not callable; the class "
                          f"needs a __call__ that scores completions (as a reward.funcs entry does)")
    return instance


def _needs_arguments(func) -> bool:
    """Whether `func` has a parameter without a default (a reward function, not a class or a factory)."""
    try:
        inspect.signature(func).bind()
    except TypeError:
        return True
    except ValueError:  # no signature to read (some builtins)
        return False
    return False


class RewardModelScorer:
    """A reward function for the RL trainers: `scorer(prompts, completions, **_) -> list[float]`, the
    reward model's score of each prompt + completion, encoded as in reward-model training (a plain
    prompt through the chat template, the completion followed by the end token). Prompts and
    completions may be texts or, as TRL passes a chat task's, message lists; the chat template renders
    them with `chat_template_kwargs` (the run's model.chat_template_kwargs, as TRL renders a reward
    model's texts with its chat_template_kwargs)."""

    def __init__(self, path: str | Path | torch.nn.Module, *, tokenizer=None, device="cpu", batch_size: int = 16,
                 chat: bool = True, chat_template_kwargs: dict | None = None):
        if isinstance(path, torch.nn.Module):  # a loaded AutoModelForSequenceClassification (TRL's reward_funcs entry)
            self.model, self.tokenizer = loaded_reward_model(path, tokenizer, device=device)
            path = path.config.name_or_path
        else:
            self.model, self.tokenizer = load_reward_model(path, device=device)
        self.path = str(path)
        # the name its metrics and errors use: the model's directory name, as TRL names a reward model
        self.__name__ = Path(self.path.rstrip("/")).name or "reward_model"
        self.model.requires_grad_(False)
        hold_template_kwargs(self.tokenizer, chat_template_kwargs or {})
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

    def to(self, device) -> RewardModelScorer:
        self.model.to(device)
        self.device = torch.device(device)
        return self


def loaded_reward_model(model: torch.nn.Module, tokenizer=None, device="cpu"):
    """(RewardModel, tokenizer) over a loaded sequence classifier with one label; without `tokenizer`, the one
    saved with it (loaded from its config's name, as TRL loads a reward model's tokenizer)."""
    from transformers import AutoTokenizer

    from ..models.reward_model import RewardModel

    where = model.config.name_or_path
    if getattr(model.config, "num_labels", None) != 1:
        raise ValueError(f"reward model {where!r} has {model.config.num_labels} labels; a reward model has one")
    if tokenizer is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(where)
        except Exception as e:
            raise ValueError(f"reward model {where!r}: no tokenizer loads from its config's name "
                             f"({type(e).__name__}); score with the model's directory instead") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return RewardModel(model, tokenizer).to(device).eval(), tokenizer
