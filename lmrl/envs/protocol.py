"""What a text environment is to lmrl, and the checks that hold an environment to it.

    class Guess:                                   # any class with these two methods
        def reset(self, seed=None):                # -> the first observation (or (observation, info))
            self.secret = random.Random(seed).randint(1, 10)
            return "Guess my number between 1 and 10."
        def step(self, action):                    # the agent's turn as text
            won = action.strip() == str(self.secret)
            return ("Right." if won else "Wrong."), float(won), won, False, {}

An observation is text (it goes back to the model as a user turn) or a list of chat messages (e.g.
`{"role": "tool", ...}` results, or a whole opening conversation from `reset`). `step` returns
Gymnasium's five values `(observation, reward, terminated, truncated, info)`: `terminated` when the
task ended (won, lost, answered), `truncated` when a limit of the environment's own cut it short.
The four values of lmrl's first agent protocol, `(observation, reward, done, info)`, are read as
`terminated=done, truncated=False`. Optional: `close()` (called when an episode ends), `truncate()
-> (reward, info)` (the episode is cut short by the rollout: turn or context limit), `get_reward()
-> float` (a final reward read when the episode ends, TRL's `environment_factory` convention).

`reset` is called as `reset(seed=seed)`, by keyword, as Gymnasium calls it (a `gymnasium.Env` takes
its seed keyword-only). `terminated` and `truncated` are bools (numpy's too). In `info`, `success`
(when present) is a bool saying whether the episode won, and `metrics` a dict of numbers to log.

`as_step` and `as_reset` turn what an environment returned into checked values, or raise `EnvError`
with one line naming the environment and what it returned (`check_env` runs both on one episode,
as Gymnasium's `check_env` does, for an environment's author)."""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

# Held-out episodes reset with seeds from here on; training episodes with seeds below it. An environment
# that draws problems from a fixed set keeps the two apart by this line (see lmrl.envs.skyrl).
HELDOUT_SEED = 1_000_000_000
# Rewards are trained on in float32: a reward (or a return) beyond its range would become inf.
FLOAT32_MAX = 3.4028234663852886e38


class EnvError(Exception):
    """An environment broke the protocol (or raised, or hung): the message is one line that names it."""


@runtime_checkable
class Env(Protocol):
    def reset(self, seed: int | None = None) -> Any: ...
    def step(self, action: str) -> tuple: ...


def env_name(env) -> str:
    """How errors name an environment: its `name` attribute, else the id Gymnasium made it with
    (`env.spec.id`, through any wrappers), else its class."""
    name = getattr(env, "name", None)
    if isinstance(name, str) and name:
        return name
    try:
        spec_id = getattr(getattr(env, "spec", None), "id", None)
    except Exception:  # noqa: BLE001  (a property of the user's that raises: the class names it)
        spec_id = None
    return spec_id if isinstance(spec_id, str) and spec_id else type(env).__name__


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def as_observation(value, who: str, where: str) -> str | list[dict]:
    """`value` as an observation (text, or chat messages each with a role and text content)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        for m in value:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content", ""), str):
                raise EnvError(f"environment {who}: {where} returned a chat message without a text role and "
                               f"content: {_short(m)}")
        return value
    raise EnvError(f"environment {who}: {where} returned {_short(value)} ({type(value).__name__}) as its observation; "
                   f"an observation is text or a list of chat messages ({{'role': ..., 'content': str}})")


def as_reset(result, who: str) -> tuple[str | list[dict], dict]:
    """(observation, info) from what `reset` returned: an observation, or Gymnasium's (observation, info)."""
    if isinstance(result, tuple):
        if len(result) != 2 or not isinstance(result[1], dict):
            raise EnvError(f"environment {who}: reset() returned a {len(result)}-tuple {_short(result)}; return the "
                           f"observation, or (observation, info)")
        return as_observation(result[0], who, "reset()"), result[1]
    return as_observation(result, who, "reset()"), {}


def as_reward(value, who: str, where: str) -> float:
    """A finite float within float32's range from a reward an environment returned (bools and
    numeric strings refused)."""
    if is_bool(value) or not isinstance(value, (int, float)) and not _is_numpy_number(value):
        raise EnvError(f"environment {who}: {where} returned reward {_short(value)} ({type(value).__name__}); "
                       f"a reward is a finite number")
    try:
        reward = float(value)
    except OverflowError:  # an int past float's range
        reward = math.inf
    if not math.isfinite(reward) or abs(reward) > FLOAT32_MAX:
        shown = _short(value, 40) if isinstance(value, int) else reward
        raise EnvError(f"environment {who}: {where} returned reward {shown}; a reward is a finite number within "
                       f"float32's range (±3.4e38), in which rewards train")
    return reward


def _is_numpy_number(value) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0


def is_bool(value) -> bool:
    """True or False: Python's bool, or numpy's (`numpy.bool_`, called `numpy.bool` in numpy 2)."""
    return isinstance(value, bool) or _is_numpy_number(value) and getattr(value.dtype, "kind", "") == "b"


def as_info(info, who: str, where: str) -> dict:
    """`info` (None read as {}) checked: a dict whose `success`, when present, is a bool and whose
    `metrics`, when present, is a dict."""
    info = {} if info is None else info
    if not isinstance(info, dict):
        raise EnvError(f"environment {who}: {where} returned info {_short(info)}; info is a dict (or None)")
    success = info.get("success")
    if success is not None and not is_bool(success):
        raise EnvError(f"environment {who}: {where} returned info['success']={_short(success)} "
                       f"({type(success).__name__}); it is True or False (or left out)")
    metrics = info.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise EnvError(f"environment {who}: {where} returned info['metrics']={_short(metrics)} "
                       f"({type(metrics).__name__}); metrics is a dict of numbers ({{'name': value}})")
    return info


def as_step(result, who: str) -> tuple[str | list[dict], float, bool, bool, dict]:
    """(observation, reward, terminated, truncated, info) from what `step` returned: Gymnasium's five
    values, or lmrl's first protocol's four (observation, reward, done, info)."""
    if not isinstance(result, tuple) or len(result) not in (4, 5):
        size = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
        raise EnvError(f"environment {who}: step() returned {size} {_short(result)}; return (observation, reward, "
                       f"terminated, truncated, info)")
    if len(result) == 4:
        observation, reward, terminated, info = result
        truncated = False
    else:
        observation, reward, terminated, truncated, info = result
    info = as_info(info, who, "step()")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not is_bool(flag):
            raise EnvError(f"environment {who}: step() returned {name}={_short(flag)}; it is True or False")
    reward = as_reward(reward, who, "step()")
    ended = bool(terminated) or bool(truncated)
    if ended and observation is None:
        observation = ""
    return as_observation(observation, who, "step()"), reward, bool(terminated), bool(truncated), info


def check_env(env, action: str = "hello", *, seed: int = 0, max_steps: int = 3) -> None:
    """Plays `max_steps` turns of `action` in `env` from `reset(seed=seed)`, raising `EnvError` with one
    line at the first value that breaks the protocol (a tool for an environment's author)."""
    who = env_name(env)
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise EnvError(f"environment {who}: has no {method}() method")
    as_reset(env.reset(seed=seed), who)
    for _ in range(max_steps):
        _, _, terminated, truncated, _ = as_step(env.step(action), who)
        if terminated or truncated:
            break
    close = getattr(env, "close", None)
    if callable(close):
        close()
