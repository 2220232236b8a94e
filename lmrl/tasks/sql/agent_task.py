"""The SQL agent as a trainer task: episodes against `SQLEnv`, played by a Hugging Face policy.

    task = SQLAgentTask(tokenizer, SQLEnvConfig(max_rounds=5, train_tasks=2000, heldout_per_skill=10))
    ro = task.rollout(policy, task.sample_train_ids(8, gen), temperature=1.0)   # an AgentRollout
    rewards, correct, extras = task.score_rollout(ids, ro)

It speaks the trainer's task protocol (see `lmrl.tasks.math_task`): problem ids number the training
tasks 0..T-1 and the held-out ones T..T+H-1, `rollout` plays one episode per id (all of a step's
episodes batched turn by turn, see `lmrl.generation.agent`), and the reward is the episode's return
(the config's `reward_correct`, `reward_wrong` or `reward_timeout`, minus any invalid-action
penalties). Accuracy is the success rate.

Tasks come from the procedural generator (the config's `train_tasks` of its `skills`, drawn
uniformly; held-out: `heldout_per_skill` of each skill) or from DBBench-format JSONL files
(`train_file`, `test_file`). Procedural train and held-out tasks never share a task (the split is a
function of the task's content).
"""

from __future__ import annotations

import torch

from ..env_task import HELDOUT_SEED, EnvTask
from .env import SQLEnv, SQLEnvConfig
from .procedural import ProceduralSQLTasks
from .protocol import example_turns, system_prompt
from .tasks import SQLTask, load_dbbench


def episode_preamble(env_config: SQLEnvConfig, one_shot: bool = True) -> list[dict]:
    """The messages before each episode's task: the system prompt, then (one_shot) a worked episode.
    The example's assistant turns say `"training": false`: context, never loss, for whoever trains
    on the conversation (SFT on demonstrations, an `EpisodeLearner` fed by the trainer)."""
    example = [dict(m, training=False) if m["role"] == "assistant" else m for m in example_turns()] if one_shot else []
    return [{"role": "system", "content": system_prompt(env_config.max_rounds)}] + example


def sql_tasks(options: SQLEnvConfig, *, n_train: int | None = None, seed: int = 0, train_file: str | None = None,
              test_file: str | None = None) -> tuple[list[SQLTask], list[SQLTask]]:
    """(training tasks, held-out tasks): procedural ones of `options.skill_names()` (`options.train_tasks`, or
    `n_train`; held out: `options.heldout_per_skill` of every skill), or DBBench records from the files given."""
    skills = options.skill_names()
    n_train = options.train_tasks if n_train is None else n_train
    train = load_dbbench(train_file) if train_file else ProceduralSQLTasks(seed, "train", skills=skills).take(n_train)
    if test_file:
        return train, load_dbbench(test_file)
    return train, [t for i, skill in enumerate(skills) for t in
                   ProceduralSQLTasks(seed + 1000 + i, "heldout", skills=(skill,)).take(options.heldout_per_skill)]


class SQLEpisodes:
    """The SQL environment over a fixed list of tasks, in the environment protocol: `reset(seed)`
    opens training task `seed % len(train)`, or held-out task `seed - HELDOUT_SEED` for a held-out
    seed, and returns its question; `step` plays a turn in `SQLEnv`."""

    name = "sql"

    def __init__(self, config: SQLEnvConfig, train: list[SQLTask], heldout: list[SQLTask]):
        self.env, self.train, self.heldout = SQLEnv(config), train, heldout

    def reset(self, seed: int | None = None) -> str:
        seed = seed or 0
        task = self.heldout[seed - HELDOUT_SEED] if seed >= HELDOUT_SEED else self.train[seed % len(self.train)]
        return self.env.reset(task)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        observation, reward, done, info = self.env.step(action)
        return observation, reward, done, _with_metrics(info)

    def truncate(self) -> tuple[float, dict]:
        reward, info = self.env.truncate()
        return reward, _with_metrics(info)

    def close(self) -> None:
        self.env.close()


def _with_metrics(info: dict) -> dict:
    return {**info, "success": info.get("outcome") == "correct",
            "metrics": {"invalid_actions": info.get("invalid_actions", 0),
                        "timeout_rate": float(info.get("outcome") == "timeout")}}


class SQLAgentTask(EnvTask):
    """The SQL agent on the tasks `sql_tasks` draws from `env_config` (`n_train` overrides its
    `train_tasks`) or reads from DBBench files."""

    def __init__(self, tokenizer, env_config: SQLEnvConfig | None = None, *, n_train: int | None = None,
                 seed: int = 0, train_file: str | None = None, test_file: str | None = None,
                 max_new_tokens: int = 128, max_context: int = 2048,
                 one_shot: bool = True, max_turns: int | None = None, step_timeout_s: float | None = None,
                 workers: int = 8):
        self.env_config = env_config or SQLEnvConfig()
        train, heldout = sql_tasks(self.env_config, n_train=n_train, seed=seed, train_file=train_file,
                                   test_file=test_file)
        self.tasks: list[SQLTask] = train + heldout
        rounds = self.env_config.max_rounds if max_turns is None else min(max_turns, self.env_config.max_rounds)
        super().__init__(lambda: SQLEpisodes(self.env_config, train, heldout), tokenizer, train_episodes=len(train),
                         heldout_episodes=len(heldout), max_turns=rounds, max_new_tokens=max_new_tokens,
                         max_context=max_context, step_timeout_s=step_timeout_s, workers=workers,
                         preamble=episode_preamble(self.env_config, one_shot), name="sql")
        self.system_prompt = system_prompt(self.env_config.max_rounds)

    def skills(self, ids: torch.Tensor) -> list[str]:
        return [self.tasks[i].skill for i in ids.tolist()]

    def reward_kwargs(self, ids: torch.Tensor) -> dict:
        return {"skill": self.skills(ids), "label": [list(self.tasks[i].label) for i in ids.tolist()]}


def per_skill_success(task: SQLAgentTask, ids: torch.Tensor, infos: list[dict]) -> dict[str, float]:
    """Success rate of each skill among episodes of tasks `ids` with their infos (`AgentRollout.infos`)."""
    totals: dict[str, list[int]] = {}
    for skill, info in zip(task.skills(ids), infos):
        won, n = totals.setdefault(skill, [0, 0])
        totals[skill] = [won + (info.get("outcome") == "correct"), n + 1]
    return {skill: won / n for skill, (won, n) in sorted(totals.items())}
