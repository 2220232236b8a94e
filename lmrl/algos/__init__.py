"""Policy-gradient algorithms on one loop: pure advantage and loss functions (`advantages`,
`losses`) and thin classes that combine them (`reinforce`, `grpo`, `ppo`, `reinforce_pp`, `remax`), each
registered by name in `ALGORITHMS` (a new algorithm is a module with an `@register_algorithm("name")` class)."""

from __future__ import annotations

from .base import ALGORITHMS, Algorithm, register_algorithm
from .reinforce import Reinforce  # registration order is the order `algo.name`'s choices are listed in
from .grpo import GRPO, RLOO
from .ppo import PPO
from .reinforce_pp import ReinforcePlusPlus, ReinforcePlusPlusBaseline
from .remax import ReMax


def build_algorithm(cfg, *, temperature: float = 1.0, ga_steps: int = 1, max_new_tokens: int = 1) -> Algorithm:
    """The algorithm named by `cfg.name` (the `algo` config section)."""
    if cfg.name not in ALGORITHMS:
        raise ValueError(f"algo.name={cfg.name!r} is not one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[cfg.name](cfg, temperature=temperature, ga_steps=ga_steps, max_new_tokens=max_new_tokens)


__all__ = ["ALGORITHMS", "Algorithm", "GRPO", "PPO", "RLOO", "ReMax", "Reinforce", "ReinforcePlusPlus",
           "ReinforcePlusPlusBaseline", "build_algorithm", "register_algorithm"]
