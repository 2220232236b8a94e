"""Errors every layer may raise (this module imports nothing of lmrl, so tasks and models can use
it without importing the config layer)."""


class ConfigError(ValueError):
    """A config problem, explained in one line that names the key and its source."""
