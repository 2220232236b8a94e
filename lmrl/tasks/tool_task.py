"""Prompts answered with tools, as TRL's GRPOTrainer runs `tools=` and `environment_factory=`.

    task = ToolPromptTask(prompt_task, tools=[calculator], environment_factory=None, max_turns=4)

Each prompt becomes an episode in `lmrl.envs.tools.ToolEnv`: the model's turn is parsed for tool
calls (the Hermes `<tool_call>{...}</tool_call>` format the Qwen, SmolLM3 and Hermes templates
use), each call runs and its result goes back as a `{"role": "tool"}` message, and the episode ends
at the first turn without a call (or at `env.max_turns`, or the context limit). The tools are
offered through the chat template's `tools=` when it renders them, else as a system message in the
same format. With `environment_factory`, each episode gets its own instance: `reset(**row)` runs
first (a string it returns joins the prompt), its public methods are tools, and `get_reward()`
(when it defines one) is a reward source named after its class, as in TRL.

Each episode's instance is made, reset, called and read (`get_reward()`, as the episode ends) on
one thread of its own (`lmrl.generation.agent.Stepper`), so a resource it opens in `__init__` (a
sqlite3 connection) works in every call; plain `tools=` functions run on their episode's thread too,
or in the trainer's thread, one call after another, with `env.step_timeout_s=0` (as TRL runs them:
for a tool that uses a thread-bound resource made at import). An instance that cannot be made or
reset, or whose `get_reward()` raises or returns anything but a finite number, fails its episode
only, as any environment's failure does (`env/errors`; no reward, no gradient).

The reward comes from the task's reward functions (which get the episode as messages, the
episode's environment instances as `environments=`, None for one that could not be made, and
their `get_reward()` values as `environment_rewards=`); the loss covers the model's own turns only."""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ..common.errors import ConfigError
from ..envs.protocol import EnvError
from ..envs.registry import load_object
from ..envs.tools import ToolEnv, environment_tools, template_renders_tools, tool_schemas, tools_system_prompt
from ..generation.agent import AgentRollout, Stepper, leave_out_failed, run_episodes
from ..generation.sampling import Sampling
from .prompt_task import PromptTask


def load_tools(paths: list) -> list[Callable]:
    """`env.tools` entries (`package.module:function`, or functions from Python) as callables."""
    return [load_object(p, "env.tools") if isinstance(p, str) else p for p in paths]


class _ToolEpisode(ToolEnv):
    """A ToolEnv whose opening carries the tools' system text, for templates that do not render `tools=`."""

    def __init__(self, *args, system_text: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.system_text = system_text

    def reset(self, seed: int | None = None) -> list[dict]:
        messages = super().reset(seed)
        if not self.system_text:
            return messages
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{self.system_text}"}] + messages[1:]
        return [{"role": "system", "content": self.system_text}] + messages


class ToolPromptTask(PromptTask):
    def __init__(self, base: PromptTask, *, tools: list[Callable] = (), environment_factory: Callable | None = None,
                 max_turns: int = 8, max_context: int = 4096, step_timeout_s: float | None = 30.0, workers: int = 8):
        self.__dict__.update(base.__dict__)  # the same rows, split, rendering and reward as the plain task
        self.plain = base
        self.tools, self.environment_factory = list(tools), environment_factory
        self.max_turns, self.max_context = max_turns, max_context
        self.step_timeout_s, self.workers = step_timeout_s, workers
        probe = _probe(environment_factory) if environment_factory is not None else None
        every = self.tools + (environment_tools(probe) if probe is not None else [])
        if not every:
            raise ValueError("a tool task needs tools= or an environment_factory whose class has public methods")
        try:
            self.schemas = tool_schemas(every)
        except ValueError as e:  # a tool the schema cannot be read from: the user's to fix, said in one line
            raise ConfigError(str(e)) from None
        self.reward_source = (type(probe).__name__ if probe is not None and callable(getattr(probe, "get_reward", None))
                              else None)
        self.template_tools = template_renders_tools(self.tokenizer)
        self.system_text = "" if self.template_tools else tools_system_prompt(self.schemas)
        self.turn_tokens = self.max_new_tokens
        self.max_new_tokens = self.turn_tokens * max_turns  # the learner's length budget over every turn

    def _prompt_messages(self, row: dict) -> list[dict]:
        messages = self._messages(row)
        if messages is None:  # tools need a conversation: a plain-text prompt becomes the user's message
            messages = [{"role": "user", "content": self.prompt_template.format(prompt=row["prompt"])}]
        return messages

    def rollout(self, policy, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, repetition_penalty: float = 1.0, greedy: bool = False,
                generator: torch.Generator | None = None) -> AgentRollout:
        factory = self.environment_factory
        name = f"ToolEnv({getattr(factory, '__name__', 'environment_factory')})" if factory is not None else "ToolEnv"
        with Stepper(self.workers, self.step_timeout_s) as stepper:
            envs = stepper.make([functools.partial(self._episode, self.rows[i]) for i in ids.tolist()], name)
            ro = run_episodes(policy, envs, seeds=ids.tolist(), tools=self.schemas if self.template_tools else None,
                              max_turns=self.max_turns, max_new_tokens=self.turn_tokens, max_context=self.max_context,
                              sampling=Sampling(temperature, top_k, top_p, min_p, repetition_penalty), greedy=greedy,
                              generator=generator, stepper=stepper, final_reward=self.reward_source is not None)
        # what reward functions get as `environments=`
        ro.environments = [None if isinstance(e, EnvError) else e.environment for e in envs]
        return ro

    def _episode(self, row: dict) -> _ToolEpisode:
        """One episode of `row` (with its own environment_factory instance, made here)."""
        environment = self.environment_factory() if self.environment_factory is not None else None
        columns = {k: v for k, v in row.items() if k not in ("prompt", "messages")}
        return _ToolEpisode(self.tools, prompt=self._prompt_messages(row), row=columns, environment=environment,
                            system_text=self.system_text)

    def conversations(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[list, list]:
        """(each prompt's messages, the episode after them: assistant turns and tool results)."""
        return rollout.split_transcripts()

    def texts(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[list[str], list[str]]:
        """(each prompt as the model saw it, the episode after it with tool results role-tagged)."""
        _, episodes = self.conversations(ids, rollout)
        tagged = [[m["content"] if m["role"] == "assistant" else f"[{m['role']}] {m['content']}" for m in e]
                  for e in episodes]
        return self.prompts(ids), ["\n".join(e) for e in tagged]

    def score_rollout(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The prompt task's scores and the episodes' tool metrics, NaN for an episode whose environment
        failed (`leave_out_failed`)."""
        rewards, exact, extras = super().score_rollout(ids, rollout)
        return leave_out_failed(rollout, rewards, exact, {**extras, **self.episode_metrics(rollout)})

    @staticmethod
    def episode_metrics(rollout: AgentRollout) -> dict[str, torch.Tensor]:
        """Per-episode tool calls and failed calls (each episode's totals), turns and environment errors
        (logged beside the reward functions' own, see `lmrl.tasks.rewards.score_rollout`)."""
        infos = rollout.infos
        failed = rollout.failed if rollout.failed is not None else torch.zeros(len(infos), dtype=torch.bool)
        return {"tools/calls": torch.tensor([float(i.get("tool_calls_total", 0)) for i in infos]),
                "tools/failures": torch.tensor([float(i.get("tool_failures_total", 0)) for i in infos]),
                "turns": torch.tensor([float(i.get("turns", 0)) for i in infos]), "env/errors": failed.float()}


def environment_reward(name: str) -> Callable:
    """The reward source of an environment_factory class that defines `get_reward`, named after the class:
    a reward function giving each episode's `get_reward()` as the rollout read it when the episode ended
    (`environment_rewards=`; None for an episode whose environment failed, which is left out anyway)."""

    def reward(environment_rewards=None, **_):
        if environment_rewards is None:
            raise ValueError(f"{name}'s get_reward needs the episodes' environment_rewards (a tool task's rollout)")
        return list(environment_rewards)

    reward.__name__ = reward.__qualname__ = name
    return reward


def _probe(environment_factory: Callable):
    """One instance made now, so that a factory that cannot make one fails before any model runs."""
    try:
        probe = environment_factory()
    except Exception as e:  # noqa: BLE001  (whatever the user's factory raises, said in one line)
        raise ConfigError(f"environment_factory: making an environment failed: {type(e).__name__}: {e}") from None
    return probe


def with_tools(task: PromptTask, tools: list, config, environment_factory: Callable | None = None) -> ToolPromptTask:
    """`task` answered with `tools` (env.tools entries or functions) under the `env` section's limits; a task
    already answered with tools (env.tools) takes these besides its own."""
    tools = load_tools(tools)
    if isinstance(task, ToolPromptTask):
        tools, environment_factory = task.tools + tools, environment_factory or task.environment_factory
        task = task.plain
    e = config.env
    return ToolPromptTask(task, tools=tools, environment_factory=environment_factory,
                          max_turns=e.max_turns, max_context=e.max_context, step_timeout_s=e.step_timeout_s or None,
                          workers=e.workers)
