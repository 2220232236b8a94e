"""Text environments: the protocol an environment follows (`protocol`), environments by name
(`registry`: registered, `package.module:factory`, `skyrl:<id>`, `textarena:<id>`), tools as TRL
offers them (`tools`), and adapters for skyrl-gym (`skyrl`) and TextArena (`textarena`), each
imported only when used. Nothing here imports torch."""

from .protocol import Env, EnvError, check_env
from .registry import ENVS, env_factory, register_env

__all__ = ["ENVS", "Env", "EnvError", "check_env", "env_factory", "register_env"]
