"""An environment's episodes as the trainer's task (`task.name: env`).

    task = EnvTask(lambda: GuessEnv(), tokenizer, train_episodes=10_000, heldout_episodes=64,
                   max_turns=4, max_new_tokens=32)
    ro = task.rollout(policy, task.sample_train_ids(8, gen))   # an AgentRollout, one episode per id
    rewards, success, extras = task.score_rollout(ids, ro)

Problem ids are episode seeds: training id i plays `reset(seed=i)`; held-out id `train_episodes + j`
plays `reset(seed=HELDOUT_SEED + j)`, a seed no training episode uses, so evaluation is on episodes
never trained on. An episode's reward is its return (the environment's rewards summed); it
succeeded when its last info says `success` (True/False), else when its return is above 0.
An environment may report numbers in `info["metrics"]` (e.g. `{"invalid_moves": 2}`): each is
logged as `rollout/<name>`, averaged over the batch's episodes. `env/errors` is the fraction of
episodes whose environment broke (see `lmrl.generation.agent.run_episodes`); such an episode is left
out of the rewards, success and metrics (NaN, `leave_out_failed`). Each episode's environment is
made on the thread that runs all its calls; a factory that raises or hangs fails that episode only."""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..envs.protocol import HELDOUT_SEED, is_bool
from ..generation.agent import AgentRollout, Stepper, leave_out_failed, run_episodes
from ..generation.sampling import Sampling


class EnvTask:
    def __init__(self, make_env: Callable, tokenizer, *, train_episodes: int = 100_000, heldout_episodes: int = 64,
                 max_turns: int = 8, max_new_tokens: int = 128, max_context: int = 2048,
                 step_timeout_s: float | None = 30.0, workers: int = 8, system_prompt: str = "",
                 preamble: list[dict] | None = None, tools: list[dict] | None = None, name: str = "env"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"environment {name}: episodes are chats, so the model's tokenizer needs a chat template")
        if train_episodes >= HELDOUT_SEED:
            raise ValueError(f"train_episodes={train_episodes} must stay below the held-out seeds ({HELDOUT_SEED})")
        self.make_env, self.tokenizer, self.name = make_env, tokenizer, name
        self.n_train, self.max_turns, self.turn_tokens = train_episodes, max_turns, max_new_tokens
        self.max_context, self.step_timeout_s, self.workers, self.tools = max_context, step_timeout_s, workers, tools
        # the learner's length budget (Dr. GRPO's constant normaliser): every agent turn at its longest
        self.max_new_tokens = max_new_tokens * max_turns
        self.heldout_ids = torch.arange(train_episodes, train_episodes + heldout_episodes)
        self.preamble = list(preamble) if preamble is not None else (
            [{"role": "system", "content": system_prompt}] if system_prompt else [])

    def seed(self, i: int) -> int:
        """The seed problem id `i` resets its environment with."""
        return i if i < self.n_train else HELDOUT_SEED + i - self.n_train

    # -- the trainer's task protocol -------------------------------------------------------------
    def sample_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(self.n_train, (n,), generator=generator)

    def rollout(self, policy, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, repetition_penalty: float = 1.0, greedy: bool = False,
                generator: torch.Generator | None = None) -> AgentRollout:
        with Stepper(self.workers, self.step_timeout_s) as stepper:
            envs = stepper.make([self.make_env] * len(ids), self.name)
            return run_episodes(policy, envs, seeds=[self.seed(i) for i in ids.tolist()], preamble=self.preamble,
                                tools=self.tools, max_turns=self.max_turns, max_new_tokens=self.turn_tokens,
                                max_context=self.max_context, greedy=greedy, generator=generator, stepper=stepper,
                                sampling=Sampling(temperature, top_k, top_p, min_p, repetition_penalty))

    def texts(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[list[str], list[str]]:
        """(each episode's first observation, the episode after it: turns and observations, role-tagged)."""
        openings, episodes = self.conversations(ids, rollout)
        prompts = ["\n".join(str(m.get("content", "")) for m in opening[len(self.preamble):]) for opening in openings]
        return prompts, ["\n".join(f"[{m['role']}] {m.get('content', '')}" for m in e) for e in episodes]

    def conversations(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[list, list]:
        """(each episode's opening messages, the messages after it), as TRL's reward functions get a chat."""
        return rollout.split_transcripts()

    def reward_kwargs(self, ids: torch.Tensor) -> dict:
        return {"seed": [self.seed(i) for i in ids.tolist()]}

    def score_rollout(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(returns (B,), success flags (B,), {turns, env/errors, and the environments' info["metrics"]}),
        NaN for an episode whose environment failed (but its turns and env/errors)."""
        infos = rollout.infos
        success = torch.tensor([float(episode_success(i, r)) for i, r in zip(infos, rollout.rewards.tolist())])
        failed = rollout.failed if rollout.failed is not None else torch.zeros(len(infos), dtype=torch.bool)
        extras = {"turns": torch.tensor([float(i.get("turns", 0)) for i in infos]), "env/errors": failed.float()}
        metrics = [i.get("metrics") if isinstance(i.get("metrics"), dict) else {} for i in infos]
        for name in sorted({k for m in metrics for k, v in m.items() if _is_number(v)}):
            extras[name] = torch.tensor([float(m[name]) if _is_number(m.get(name)) else math.nan for m in metrics])
        return leave_out_failed(rollout, rollout.rewards.clone(), success, extras)


def episode_success(info: dict, episode_return: float) -> bool:
    """Whether an episode succeeded: its last info's `success` when it says (a bool), else a return above 0."""
    said = info.get("success")
    return bool(said) if is_bool(said) else episode_return > 0


def _is_number(v) -> bool:
    """A finite int or float (a bool counts as 0 or 1) that a float holds."""
    if not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an int past float's range
        return False
