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
schema (`checking.table_md5`, whatever the answer says). That hash is AgentBench's, which reads at
most 170 rows (MySQL's group_concat cut at 1024 bytes): on a longer table, a DELETE or UPDATE of a
row past the cut is judged correct when the agent does nothing. With `strict_hash` the final table
is compared, every row, with the table the task's reference statement makes (a task without one
keeps AgentBench's check). The database is fresh on `reset` and
closed when the episode ends. It is a `Sandbox` (its own worker process, for model SQL) unless the
env is made with `sandbox=InProcessSandbox`, for scripted episodes whose SQL is trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common.options import Section, option
from .checking import answers_match, table_md5
from .procedural import SKILLS
from .protocol import parse_action, render_task, system_prompt
from .sandbox import InProcessSandbox, Sandbox, SandboxLimits
from .tasks import SQLTask


@dataclass
class SQLEnvConfig(Section):
    """The SQL environment's options: the `sql` config section (`env.id: sql`), and `SQLEnv`'s config."""
    max_rounds: int = option(15, "agent turns per episode, the answer turn included (DBBench: 15); the episode "
                                 "also ends at env.max_turns, whichever comes first", ge=1)
    max_rows: int = option(100, "rows shown per query result; more are cut with a [TRUNCATED] note", ge=1)
    max_chars: int = option(800, "characters per observation; more are cut with [TRUNCATED] (DBBench: 800)", ge=1)
    query_timeout_s: float = option(2.0, "wall-clock limit of one SQL statement", gt=0)
    reward_correct: float = option(1.0, "reward of a correct final answer (or table state)")
    reward_wrong: float = option(-0.1, "reward of a wrong final answer")
    reward_timeout: float = option(-0.3, "reward of an episode that ends with no answer")
    invalid_action_penalty: float = option(0.0, "subtracted for each turn that breaks the protocol (>= 0; write "
                                                "0.05 for a penalty of 0.05)", ge=0)
    answer_tolerance: float = option(1e-2, "absolute tolerance for numeric answers (DBBench: 1e-2)", ge=0)
    strict_hash: bool = option(False, "modifications: compare every row of the final table with what the task's "
                                      "reference statement makes (false: AgentBench's hash, which reads at most 170 "
                                      "rows, so a change past them goes unseen)")
    train_tasks: int = option(2000, "procedural training tasks (distinct), unless task.train_file holds DBBench "
                                    "records", ge=1)
    heldout_per_skill: int = option(10, "procedural held-out tasks of each skill, unless task.test_file holds "
                                        "DBBench records", ge=1)
    skills: list = option([], "procedural skills to draw from (empty: all of filter, count, sum, avg, max, min, "
                              "ranking, group_by, comparison, insert, update, delete)", choices=SKILLS)

    def __post_init__(self):
        problems = self.problems("sql")
        if problems:
            raise ValueError(problems[0])

    def skill_names(self) -> tuple[str, ...]:
        """The procedural skills tasks are drawn from: `skills`, or every skill when it is empty."""
        return tuple(self.skills) or SKILLS

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
            expected = self._whole_table_md5(task) if self.config.strict_hash else None
            if expected is not None:
                return rows is not None and table_md5(rows, max_bytes=None) == expected
            return rows is not None and table_md5(rows) == task.answer_md5
        return answers_match(answer, task.label, self.config.answer_tolerance)

    def _whole_table_md5(self, task: SQLTask) -> str | None:
        """The hash of every row of the table the task's reference statement makes (trusted SQL, run
        in-process); None when the task has none or it fails."""
        if not task.reference_sql:
            return None
        with InProcessSandbox(task.table, self.config.limits()) as db:
            ok = db.execute(task.reference_sql)[1]
            rows = db.table_rows() if ok else None
        return None if rows is None else table_md5(rows, max_bytes=None)

    def close(self) -> None:
        """Discard the episode's database (also done when an episode ends)."""
        if self._db is not None:
            self._db.close()
            self._db = None
