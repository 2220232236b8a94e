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
`env.kwargs`: a class is the usual one. Its module is imported from `sys.path`, else from the
current directory, as `python -m lmrl` would find it (the `lmrl` console script does not put the
current directory on `sys.path`)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
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
        if inspect.isclass(make) or not _takes_a_config(make):
            what = f"the class {make.__name__}" if inspect.isclass(make) else f"{getattr(make, '__name__', make)!r}"
            raise ValueError(f"@register_env({name!r}) decorates a function (config, **kwargs) -> factory, where "
                             f"factory() makes one environment; {what} is not one: register e.g. `def make(config, "
                             f"**kwargs): return lambda: MyEnv(**kwargs)`, or name a class as "
                             f"env.id=package.module:MyEnv")
        known = ENVS.get(name)
        if known is not None and known.make is not make:
            raise ValueError(f"environment {name!r} is already registered (by {known.make.__module__}."
                             f"{known.make.__qualname__})")
        ENVS[name] = EnvSpec(name, make, help, section, options, task)
        return make

    return register


def _takes_a_config(make: Callable) -> bool:
    try:
        inspect.signature(make).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): calling it will tell
        pass
    return True


def load_object(path: str, what: str = "env.id"):
    """The object `package.module:name` names, or a ConfigError of one line. The module is looked
    for on `sys.path`, then in the current directory (see the module docstring)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what}={path!r} must look like package.module:name")
    try:
        module = import_module(module_name)
    except ImportError as e:
        where = (f"; looked on sys.path and in the current directory {os.getcwd()}: put its directory on PYTHONPATH"
                 if getattr(e, "name", None) == module_name.partition(".")[0] else "")
        raise ConfigError(f"{what}={path!r}: cannot import {module_name} ({e}{where})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what}={path!r}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def import_module(module_name: str):
    """`importlib.import_module(module_name)`, trying the current directory too when no package on
    `sys.path` has the module's top level (where `python -m` finds it: it puts the directory first)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        if e.name != module_name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
    sys.path.append(here)  # after the installed packages: the current directory shadows none of them
    return importlib.import_module(module_name)


def importable_name(obj) -> str | None:
    """The `package.module:qualname` that `load_object` finds `obj` by, or None (a lambda, a local
    class, one defined in the script being run)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__" or "<" in qualname:
        return None
    try:
        found = load_object(f"{module}:{qualname}")
    except ConfigError:
        return None
    return f"{module}:{qualname}" if found is obj else None


def env_factory(env_id: str, config=None, kwargs: dict | None = None) -> Callable:
    """The zero-argument factory of environments `env_id` names (see the module docstring)."""
    kwargs = dict(kwargs or {})
    if not env_id:
        raise ConfigError(f"task.name=env needs env.id: a registered environment ({', '.join(registered()) or 'none'}), "
                          f"package.module:factory, skyrl:<id> or textarena:<id> (a run trained with env_factory= "
                          f"records it as env.id only when it is importable, e.g. not a lambda or a class of the "
                          f"script being run: set env.id in the run's config.yaml to package.module:factory)")
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
    try:
        return spec.make(config, **kwargs)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001  (the registered function's own failure, e.g. a kwarg it does not take)
        raise ConfigError(f"env.id={env_id}: its registered function {spec.make.__qualname__}(config, **env.kwargs) "
                          f"raised {type(e).__name__}: {e} (env.kwargs={kwargs})") from None


def env_spec(name: str) -> EnvSpec:
    if name not in ENVS:
        raise ConfigError(f"env.id={name!r} is not a registered environment ({', '.join(ENVS) or 'none'}); write "
                          f"package.module:factory for your own, or skyrl:<id> / textarena:<id> (a name registered "
                          f"in a module of your own exists only once that module is imported: name its factory "
                          f"as package.module:factory instead)")
    return ENVS[name]


def registered() -> list[str]:
    return list(ENVS)
