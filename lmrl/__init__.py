"""lmrl: reinforcement-learning post-training of language models."""

from .common.errors import ConfigError

__version__ = "0.1.0"

# Names loaded on first use: the config (its choices are the algorithm, task and schedule registries)
# and the trainers import torch, which light modules such as `lmrl.tasks.math_reward` (imported by
# reward worker processes) must not pull in through this package.
_LAZY = {"AdderRLConfig": "config", "MultiplierRLConfig": "config", "Config": "config", "load_config": "config",
         "RLTrainer": "train.rl_trainer", "ReinforceTrainer": "train.trainers", "RLOOTrainer": "train.trainers",
         "GRPOTrainer": "train.trainers", "PPOTrainer": "train.trainers", "SFTTrainer": "train.sft_trainer",
         "DPOTrainer": "train.dpo_trainer", "RewardTrainer": "train.reward_trainer", "build_trainer": "train.trainers",
         "evaluate_file": "train.file_eval"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'lmrl' has no attribute {name!r}")


__all__ = ["ConfigError", *_LAZY]
