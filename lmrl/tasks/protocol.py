"""What the RL trainer uses of a task, and nothing else (`lmrl.train.rl_trainer` reads no other member).

A task owns its problems, split once into training and held-out ids that never overlap (one number
line per task, so "RL never sees a held-out problem" is structural), samples completions with a
policy, and scores them. Every task in `lmrl.tasks` satisfies `Task`; the arithmetic tasks also
satisfy `LabeledTask` (the supervised warm-up), open prompts scored by a reward model
`ScoredByModel` (PPO's critic starts as that model), the chat tasks (math, prompts, the SQL
agent) `Conversational` (reward functions get their prompts and completions as message lists), and
the tasks that read rows from files (math, prompts) `Sourced` (evaluation splits its metrics by the
rows' data source).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from ..generation.rollout import Rollout


@runtime_checkable
class Task(Protocol):
    heldout_ids: torch.Tensor  # (H,) the held-out problems, evaluated greedily
    max_new_tokens: int  # the completion budget (the constant of loss_level=constant)

    def sample_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n,) training problem ids (with replacement), drawn from `generator`. A task whose training
        problems are rows 0 .. n_train - 1 of a set says so with an `n_train` attribute: the trainer then
        draws them in epochs (`train.prompt_order`), and this method serves `train.prompt_order=random`."""

    def rollout(self, policy, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                greedy: bool = False, generator: torch.Generator | None = None) -> Rollout:
        """Completions of problems `ids` sampled from `policy` (one row per id). The trainer also passes
        `min_p=` and `repetition_penalty=` when the config sets them (`Sampling.rollout_keywords`): the
        built-in tasks take both; a task whose rollout takes neither (nor **kwargs) is refused at start-up
        when one is set, and runs as it is otherwise."""

    def score_rollout(self, ids: torch.Tensor, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(rewards (B,) or per token (B, N), exact-match flags (B,), {name: (B,) per-row extras})."""

    def texts(self, ids: torch.Tensor, rollout: Rollout) -> tuple[list[str], list[str]]:
        """(prompts, completions) as text, for a user's reward function and callbacks."""

    def reward_kwargs(self, ids: torch.Tensor) -> dict[str, list[Any]]:
        """The columns of each row a reward function gets as keyword lists (e.g. ground_truth)."""


@runtime_checkable
class LabeledTask(Task, Protocol):
    """A task the supervised warm-up can train on: fixed-length answers to a budget of labeled problems."""

    tokenizer: Any  # its vocab_size sizes the built-in GPT
    answer_len: int  # answer tokens per problem: the warm-up's loss covers the last answer_len positions

    def sample_distinct_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n,) distinct training problem ids: the label budget."""

    def labeled(self, ids: torch.Tensor) -> torch.Tensor:
        """(n, prompt + answer) token rows with their answers: the only place a run reads labels."""


@runtime_checkable
class ScoredByModel(Task, Protocol):
    """A task whose reward is a learned reward model's score."""

    reward_model: torch.nn.Module | None


@runtime_checkable
class Conversational(Task, Protocol):
    """A task whose prompts are conversations: reward functions called as TRL calls them get these."""

    def conversations(self, ids: torch.Tensor, rollout: Rollout) -> tuple[list, list]:
        """(prompts, completions) as TRL passes a chat data set's: a prompt is its message list, a
        completion the messages after it (`[{"role": "assistant", "content": text}]` for one turn);
        a row used as plain text keeps its text prompt and completion."""


@runtime_checkable
class Sourced(Task, Protocol):
    """A task whose rows may name the data set they came from (verl's `data_source`): held-out
    evaluation also reports each source's accuracy and reward (`lmrl.train.evaluate`)."""

    def row_sources(self, ids: torch.Tensor) -> list[str | None] | None:
        """Each row's source (None for a row without one), or None when no row of `ids` names one."""
