"""Environments by name: `env.id` is a registered name, `package.module:factory` (the user's own
class or function), `skyrl:<id>` (a skyrl-gym environment) or `textarena:<id>` (a TextArena game).

    @register_env("guess", help="guess a number between 1 and 10")
    def guess_factory(config, **kwargs):
        return lambda: GuessEnv(**kwargs)          # called once per episode

A registered entry is a function `(config, **kwargs) -> factory`, where `config` is the run's
whole config (None from Python without one), `kwargs` come from `env.kwargs`, and `factory()` makes
one environment (see `lmrl.envs.protocol`). An entry may declare the config section of its own
options (`section="sql", options=SQLEnvConfig`; the config then has `sql.*` keys) and a builder of
its whole task (`task(config, *, tokenizer, **_)`, for an environment whose episodes need more than
a factory: a fixed task list, a worked example before each episode, its own reward columns).
`package.module:factory` names any callable that returns an environment when called with
`env.kwargs`: a class is the usual one."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..common.errors import ConfigError

LIBRARIES = ("skyrl", "textarena")  # `env.id=<library>:<id>`: lmrl.envs.<library>.factory(id, **kwargs)


@dataclass(frozen=True)
class EnvSpec:
    name: str
    make: Callable
    help: str = ""
    section: str = ""
    options: type | None = None
    task: Callable | None = None


ENVS: dict[str, EnvSpec] = {}  # lmrl's own register when `lmrl.tasks` is imported (the SQL agent: tasks/sql)


def register_env(name: str, *, help: str = "", section: str = "", options: type | None = None,
                 task: Callable | None = None):
    """Function decorator: `env.id: <name>` makes its environments with the decorated function."""
    if ":" in name:
        raise ValueError(f"register_env({name!r}): a registered name has no ':' (that spells package.module:factory)")

    def register(make: Callable) -> Callable:
        known = ENVS.get(name)
        if known is not None and known.make is not make:
            raise ValueError(f"environment {name!r} is already registered (by {known.make.__module__}."
                             f"{known.make.__qualname__})")
        ENVS[name] = EnvSpec(name, make, help, section, options, task)
        return make

    return register


def load_object(path: str, what: str = "env.id"):
    """The object `package.module:name` names, or a ConfigError of one line."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what}={path!r} must look like package.module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{what}={path!r}: cannot import {module_name} ({e})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what}={path!r}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def env_factory(env_id: str, config=None, kwargs: dict | None = None) -> Callable:
    """The zero-argument factory of environments `env_id` names (see the module docstring)."""
    kwargs = dict(kwargs or {})
    if not env_id:
        raise ConfigError(f"task.name=env needs env.id: a registered environment ({', '.join(registered()) or 'none'}), "
                          f"package.module:factory, skyrl:<id> or textarena:<id>")
    library, sep, inner = env_id.partition(":")
    if sep and library in LIBRARIES:
        module = importlib.import_module(f"{__package__}.{library}")
        try:
            return module.factory(inner, **kwargs)
        except ValueError as e:
            raise ConfigError(f"env.id={env_id}: {e}") from None
    if sep:
        target = load_object(env_id)
        if not callable(target):
            raise ConfigError(f"env.id={env_id!r} names a {type(target).__name__}, not a class or function")
        return lambda: target(**kwargs)
    spec = env_spec(env_id)
    return spec.make(config, **kwargs)


def env_spec(name: str) -> EnvSpec:
    if name not in ENVS:
        raise ConfigError(f"env.id={name!r} is not a registered environment ({', '.join(ENVS) or 'none'}); write "
                          f"package.module:factory for your own, or skyrl:<id> / textarena:<id>")
    return ENVS[name]


def registered() -> list[str]:
    return list(ENVS)
