"""lmrl: reinforcement-learning post-training of language models."""

from .config import AdderRLConfig, Config, ConfigError, MultiplierRLConfig, load_config

__version__ = "0.1.0"


def __getattr__(name):  # the trainer imports torch: load it only when asked for
    if name == "RLTrainer":
        from .train.loop import RLTrainer

        return RLTrainer
    raise AttributeError(f"module 'lmrl' has no attribute {name!r}")


__all__ = ["AdderRLConfig", "MultiplierRLConfig", "Config", "ConfigError", "load_config", "RLTrainer"]
