"""Reward functions written as TRL's docs write them, for the tests to name as `reward.funcs` entries
(tests.trl_rewards:reward_len). Each reads a completion's text whether it arrives as text or, from a
chat task, as `[{"role": "assistant", "content": text}]`."""

import re


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def reward_len(completions, **kwargs):
    """TRL's quick-start reward: completions near 20 characters score best."""
    return [-abs(20 - len(_text(c))) for c in completions]


def math_format_reward(completions, kind, **kwargs):
    """1.0 when a completion is a bare number, else 0.0; None (not applicable) on rows that are not
    math (the `kind` column), as TRL's docs do for a reward that grades one task of a mixed data set."""
    return [None if k != "math" else float(re.fullmatch(r"\s*-?\d+\s*", _text(c)) is not None)
            for c, k in zip(completions, kind)]


class Constant:
    """A class named in `reward.funcs`: it is built with no arguments and its instance scores 0.5."""

    def __call__(self, completions, **kwargs):
        return [0.5] * len(completions)
