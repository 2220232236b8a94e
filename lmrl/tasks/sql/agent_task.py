"""The SQL agent as a trainer task: episodes against `SQLEnv`, played by a Hugging Face policy.

    task = SQLAgentTask(tokenizer, SQLEnvConfig(max_rounds=5), n_train=2000, heldout_per_skill=10)
    ro = task.rollout(policy, task.sample_train_ids(8, gen), temperature=1.0)   # an AgentRollout
    rewards, correct, extras = task.score_rollout(ids, ro)

It speaks the trainer's task protocol (see `lmrl.tasks.math_task`): problem ids number the training
tasks 0..T-1 and the held-out ones T..T+H-1, `rollout` plays one episode per id (all of a step's
episodes batched turn by turn, see `lmrl.rollout.agent`), and the reward is the episode's return
(correct +1, wrong -0.1, timeout -0.3, minus any invalid-action penalties). Accuracy is the
success rate.

Tasks come from the procedural generator (every skill, drawn uniformly; held-out: the same number
of each skill) or from DBBench-format JSONL files (`train_file`, `test_file`). Procedural train
and held-out tasks never share a task (the split is a function of the task's content).
"""

from __future__ import annotations

import torch

from ...rollout.agent import AgentRollout, run_episodes
from .env import SQLEnv, SQLEnvConfig
from .procedural import SKILLS, ProceduralSQLTasks
from .protocol import example_turns, system_prompt
from .tasks import SQLTask, load_dbbench


def episode_preamble(env_config: SQLEnvConfig, one_shot: bool = True) -> list[dict]:
    """The messages before each episode's task: the system prompt, then (one_shot) a worked episode.
    The example's assistant turns say `"training": false`: context, never loss, for whoever trains
    on the conversation (SFT on demonstrations, an `EpisodeLearner` fed by the trainer)."""
    example = [dict(m, training=False) if m["role"] == "assistant" else m for m in example_turns()] if one_shot else []
    return [{"role": "system", "content": system_prompt(env_config.max_rounds)}] + example


class SQLAgentTask:
    def __init__(self, tokenizer, env_config: SQLEnvConfig | None = None, *, n_train: int = 2000,
                 heldout_per_skill: int = 10, skills=SKILLS, seed: int = 0, train_file: str | None = None,
                 test_file: str | None = None, max_new_tokens: int = 128, max_context: int = 2048,
                 one_shot: bool = True):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the SQL agent is a chat: its model's tokenizer needs a chat template")
        self.tokenizer, self.env_config = tokenizer, env_config or SQLEnvConfig()
        self.turn_tokens, self.max_context = max_new_tokens, max_context
        # the learner's length budget (Dr. GRPO's constant normaliser): every agent turn at its longest
        self.max_new_tokens = max_new_tokens * self.env_config.max_rounds
        train = load_dbbench(train_file) if train_file else ProceduralSQLTasks(seed, "train", skills=skills).take(n_train)
        if test_file:
            heldout = load_dbbench(test_file)
        else:  # a balanced held-out set: the same number of tasks of every skill
            heldout = [t for i, skill in enumerate(skills)
                       for t in ProceduralSQLTasks(seed + 1000 + i, "heldout", skills=(skill,)).take(heldout_per_skill)]
        self.tasks: list[SQLTask] = train + heldout
        self.n_train = len(train)
        self.heldout_ids = torch.arange(len(train), len(self.tasks))
        self.system_prompt = system_prompt(self.env_config.max_rounds)
        self.preamble = episode_preamble(self.env_config, one_shot)

    def sample_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(self.n_train, (n,), generator=generator)

    def skills(self, ids: torch.Tensor) -> list[str]:
        return [self.tasks[i].skill for i in ids.tolist()]

    # -- the trainer's task protocol -------------------------------------------------------------
    def rollout(self, policy, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                greedy: bool = False, generator: torch.Generator | None = None) -> AgentRollout:
        envs, openings = [], []
        for i in ids.tolist():
            env = SQLEnv(self.env_config)
            first = env.reset(self.tasks[i])
            envs.append(env)
            openings.append(self.preamble + [{"role": "user", "content": first}])
        return run_episodes(policy, envs, openings, max_turns=self.env_config.max_rounds,
                            max_new_tokens=self.turn_tokens, max_context=self.max_context, temperature=temperature,
                            top_k=top_k, top_p=top_p, greedy=greedy, generator=generator)

    def texts(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[list[str], list[str]]:
        """(each task's question, the episode after it: agent turns and observations, role-tagged)."""
        start = len(self.preamble)
        prompts = [t[start]["content"] for t in rollout.transcripts]
        episodes = ["\n".join(f"[{m['role']}] {m['content']}" for m in t[start + 1:]) for t in rollout.transcripts]
        return prompts, episodes

    def conversations(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[list, list]:
        """(each episode's opening messages: preamble and task, the messages after it: agent turns as
        assistant messages, observations as user messages), as TRL's reward functions get a chat episode."""
        start = len(self.preamble)
        return [t[:start + 1] for t in rollout.transcripts], [t[start + 1:] for t in rollout.transcripts]

    def reward_kwargs(self, ids: torch.Tensor) -> dict:
        return {"skill": self.skills(ids), "label": [list(self.tasks[i].label) for i in ids.tolist()]}

    def score_rollout(self, ids: torch.Tensor, rollout: AgentRollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Returns (B,), success flags (B,) and per-episode {turns, invalid_actions, timeout_rate}."""
        infos = rollout.infos
        correct = torch.tensor([float(i.get("outcome") == "correct") for i in infos])
        extras = {"turns": torch.tensor([float(i.get("turns", 0)) for i in infos]),
                  "invalid_actions": torch.tensor([float(i.get("invalid_actions", 0)) for i in infos]),
                  "timeout_rate": torch.tensor([float(i.get("outcome") == "timeout") for i in infos])}
        return rollout.rewards.clone(), correct, extras


def per_skill_success(task: SQLAgentTask, ids: torch.Tensor, infos: list[dict]) -> dict[str, float]:
    """Success rate of each skill among episodes of tasks `ids` with their infos (`AgentRollout.infos`)."""
    totals: dict[str, list[int]] = {}
    for skill, info in zip(task.skills(ids), infos):
        won, n = totals.setdefault(skill, [0, 0])
        totals[skill] = [won + (info.get("outcome") == "correct"), n + 1]
    return {skill: won / n for skill, (won, n) in sorted(totals.items())}
