"""Trainers named after their algorithm, for users coming from TRL:

    GRPOTrainer(load_config("adder-grpo"), reward_fn=my_reward).train()

Each RL trainer is `RLTrainer` with `algo.name` set (and the config re-validated, so e.g. a group size of 1
is refused with the key named); every other `algo.*` option is taken from the config as it is.
`build_trainer(config)` picks the trainer `run.trainer` names (the CLI's `lmrl train` uses it)."""

from __future__ import annotations

from ..config import Config, validate
from .dpo_trainer import DPOTrainer
from .reward_trainer import RewardTrainer
from .rl_trainer import RLTrainer
from .sft_trainer import SFTTrainer


class AlgorithmTrainer(RLTrainer):
    """`RLTrainer` with `algo.name` set to the class's `algorithm` (on the trainer's own copy of the
    config: the caller's is not changed)."""


class ReinforceTrainer(AlgorithmTrainer):
    algorithm = "reinforce"


class RLOOTrainer(AlgorithmTrainer):
    algorithm = "rloo"


class GRPOTrainer(AlgorithmTrainer):
    algorithm = "grpo"


class PPOTrainer(AlgorithmTrainer):
    algorithm = "ppo"


# run.trainer's values (declared in lmrl.config.schema.TRAINERS), each the trainer class that names it
TRAINERS = {cls.trainer_key: cls for cls in (RLTrainer, SFTTrainer, DPOTrainer, RewardTrainer)}


def build_trainer(config: Config, **kwargs):
    """The trainer `run.trainer` names (see TRAINERS; the config check refuses any other name)."""
    validate(config)
    return TRAINERS[config.run.trainer](config, **kwargs)
