"""lmrl: reinforcement-learning post-training of language models."""

from .config import AdderRLConfig, Config, ConfigError, MultiplierRLConfig, load_config

__version__ = "0.1.0"


_TRAINERS = {"RLTrainer": "rl_trainer", "ReinforceTrainer": "trainers", "RLOOTrainer": "trainers",
             "GRPOTrainer": "trainers", "PPOTrainer": "trainers", "SFTTrainer": "sft_trainer",
             "DPOTrainer": "dpo_trainer", "RewardTrainer": "reward_trainer", "build_trainer": "trainers"}


def __getattr__(name):  # the trainers import torch: load them only when asked for
    if name in _TRAINERS:
        import importlib

        return getattr(importlib.import_module(f".train.{_TRAINERS[name]}", __name__), name)
    raise AttributeError(f"module 'lmrl' has no attribute {name!r}")


__all__ = ["AdderRLConfig", "MultiplierRLConfig", "Config", "ConfigError", "load_config", *_TRAINERS]
