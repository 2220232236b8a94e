"""The multi-turn SQL agent environment (DBBench protocol) over a per-episode SQLite sandbox.

    env = SQLEnv(SQLEnvConfig(max_rounds=15))
    messages = [{"role": "system", "content": env.system_prompt},
                {"role": "user", "content": env.reset(task)}]
    obs, reward, done, info = env.step(agent_text)   # obs: "[('Paris',)]", "Error: ...", ...

Rewards: an answer turn ends the episode with `reward_correct` or `reward_wrong`; a turn that
breaks the protocol earns `-invalid_action_penalty` and the episode goes on; reaching `max_rounds`
turns (the answer turn counts) without an answer ends it with `reward_timeout`. Other turns earn
0, so an episode's return is the sum of its step rewards (`info["episode_reward"]`). Questions are
checked with `checking.answers_match`, modifications by hashing the final table in the `main`
schema (`checking.table_md5`, whatever the answer says). The database is fresh on `reset` and
closed when the episode ends. It is a `Sandbox` (its own worker process, for model SQL) unless the
env is made with `sandbox=InProcessSandbox`, for scripted episodes whose SQL is trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checking import answers_match, table_md5
from .protocol import parse_action, render_task, system_prompt
from .sandbox import InProcessSandbox, Sandbox, SandboxLimits
from .tasks import SQLTask

OUTCOMES = ("correct", "wrong", "timeout")


@dataclass
class SQLEnvConfig:
    max_rounds: int = 15  # agent turns per episode, the answer turn included (DBBench: 15)
    max_rows: int = 100  # rows shown per query; more are cut with a [TRUNCATED] note
    max_chars: int = 800  # characters per observation (DBBench: 800)
    query_timeout_s: float = 2.0  # wall-clock limit of one statement
    reward_correct: float = 1.0  # an answer that matches the label (or a table that matches answer_md5)
    reward_wrong: float = -0.1  # any other answer
    reward_timeout: float = -0.3  # max_rounds turns without an answer
    invalid_action_penalty: float = 0.0  # subtracted (>= 0) from the reward of each turn that breaks the protocol
    answer_tolerance: float = 1e-2  # absolute tolerance for numeric answers (DBBench: 1e-2)

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1 (got {self.max_rounds})")
        if self.invalid_action_penalty < 0:
            raise ValueError(f"invalid_action_penalty is subtracted, so it must be >= 0 "
                             f"(got {self.invalid_action_penalty}); write 0.05 for a penalty of 0.05")
        if self.answer_tolerance < 0:
            raise ValueError(f"answer_tolerance must be >= 0 (got {self.answer_tolerance})")
        self.limits()  # validates max_rows, max_chars and query_timeout_s

    @classmethod
    def from_section(cls, env) -> SQLEnvConfig:
        """The environment an `env` config section (`lmrl.config.EnvConfig`) describes."""
        return cls(**{k: getattr(env, k) for k in (
            "max_rounds", "max_rows", "max_chars", "query_timeout_s", "reward_correct", "reward_wrong",
            "reward_timeout", "invalid_action_penalty")})

    def limits(self) -> SandboxLimits:
        return SandboxLimits(max_rows=self.max_rows, max_chars=self.max_chars, query_timeout_s=self.query_timeout_s)


class SQLEnv:
    """One episode at a time: `reset(task)`, then `step(turn_text)` until done."""

    def __init__(self, config: SQLEnvConfig | None = None, sandbox: type[Sandbox | InProcessSandbox] = Sandbox):
        self.config = config or SQLEnvConfig()
        self.sandbox = sandbox  # the database class of each episode
        self.system_prompt = system_prompt(self.config.max_rounds)
        self.task: SQLTask | None = None
        self._db: Sandbox | InProcessSandbox | None = None
        self.rounds = self.invalid_actions = 0
        self.episode_reward = 0.0

    def reset(self, task: SQLTask) -> str:
        """Start an episode on a fresh copy of the task's table; returns the first user message."""
        self.close()
        self._db = self.sandbox(task.table, self.config.limits())
        self.task, self.rounds, self.invalid_actions, self.episode_reward = task, 0, 0, 0.0
        return render_task(task)

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """Play one agent turn: (observation, reward, done, info). info holds action (operation, answer
        or invalid), invalid_reason (invalid turns), rounds, invalid_actions, outcome (None until
        done, then correct, wrong or timeout), skill and episode_reward (the sum so far)."""
        if self._db is None:
            raise RuntimeError("SQLEnv.step() needs an episode: call reset(task) first (and again after done)")
        cfg = self.config
        self.rounds += 1
        last_round = self.rounds >= cfg.max_rounds
        action = parse_action(action_text)
        info = {"action": action.kind}
        reward, outcome = 0.0, None
        if action.kind == "answer":
            outcome = "correct" if self._is_correct(action.answer) else "wrong"
            reward = cfg.reward_correct if outcome == "correct" else cfg.reward_wrong
            observation = f"Final answer received: {outcome}."
        elif action.kind == "invalid":
            self.invalid_actions += 1
            reward = -cfg.invalid_action_penalty
            info["invalid_reason"] = action.reason
            observation = (f"Invalid action: {action.reason}. Reply with 'Action: Operation' and one ```sql block, "
                           f"or 'Action: Answer' and 'Final Answer: [...]'.")
        else:
            observation = "" if last_round else self._db.run(action.sql)
        if outcome is None and last_round:
            outcome, reward = "timeout", reward + cfg.reward_timeout
            observation = f"Round limit reached: {cfg.max_rounds} turns without a final answer."
        self.episode_reward += reward
        info.update(rounds=self.rounds, invalid_actions=self.invalid_actions, outcome=outcome,
                    skill=self.task.skill, episode_reward=self.episode_reward)
        if outcome is not None:
            self.close()
        return observation, reward, outcome is not None, info

    def truncate(self) -> tuple[float, dict]:
        """End the episode without an answer because the rollout cannot go on (its context is full,
        or it allows fewer turns than `max_rounds`): scored as a timeout. Returns (reward, info)."""
        if self._db is None:
            raise RuntimeError("SQLEnv.truncate() needs a running episode")
        reward = self.config.reward_timeout
        self.episode_reward += reward
        info = {"action": "truncated", "rounds": self.rounds, "invalid_actions": self.invalid_actions,
                "outcome": "timeout", "skill": self.task.skill, "episode_reward": self.episode_reward}
        self.close()
        return reward, info

    def _is_correct(self, answer: list) -> bool:
        task = self.task
        if task.is_modification:
            rows = self._db.table_rows()
            return rows is not None and table_md5(rows) == task.answer_md5
        return answers_match(answer, task.label, self.config.answer_tolerance)

    def close(self) -> None:
        """Discard the episode's database (also done when an episode ends)."""
        if self._db is not None:
            self._db.close()
            self._db = None
