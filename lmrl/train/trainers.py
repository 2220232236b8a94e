"""Trainers named after their algorithm, for users coming from TRL:

    GRPOTrainer(load_config("adder-grpo"), reward_fn=my_reward).train()

Each RL trainer is `RLTrainer` with `algo.name` set (and the config re-validated, so e.g. a group size of 1
is refused with the key named); every other `algo.*` option is taken from the config as it is.
`build_trainer(config)` picks the trainer `run.trainer` names (the CLI's `lmrl train` uses it)."""

from __future__ import annotations

import copy

from ..config import Config, validate
from .rl_trainer import RLTrainer


def _with_algorithm(config: Config, name: str) -> Config:
    config = copy.deepcopy(config)
    config.algo.name = name
    validate(config)
    return config


class ReinforceTrainer(RLTrainer):
    def __init__(self, config: Config, **kwargs):
        super().__init__(_with_algorithm(config, "reinforce"), **kwargs)


class RLOOTrainer(RLTrainer):
    def __init__(self, config: Config, **kwargs):
        super().__init__(_with_algorithm(config, "rloo"), **kwargs)


class GRPOTrainer(RLTrainer):
    def __init__(self, config: Config, **kwargs):
        super().__init__(_with_algorithm(config, "grpo"), **kwargs)


class PPOTrainer(RLTrainer):
    def __init__(self, config: Config, **kwargs):
        super().__init__(_with_algorithm(config, "ppo"), **kwargs)


def build_trainer(config: Config, **kwargs):
    """The trainer `run.trainer` names: rl (RLTrainer), sft, dpo or reward."""
    name = config.run.trainer
    if name == "sft":
        from .sft_trainer import SFTTrainer as cls
    elif name == "dpo":
        from .dpo_trainer import DPOTrainer as cls
    elif name == "reward":
        from .reward_trainer import RewardTrainer as cls
    else:
        cls = RLTrainer
    return cls(config, **kwargs)
