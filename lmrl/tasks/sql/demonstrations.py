"""Demonstrations for the SQL agent's supervised warm-up: scripted episodes played in the real `SQLEnv`.

    convo = demonstration(task, SQLEnvConfig(max_rounds=3, max_chars=300))   # messages, or None
    train, test, stats = write_demo_splits("data/sql-demos", 240, 24, cfg)   # {"messages"} rows

An RL run from the base SmolLM2-135M finds no successes to reinforce (0 of 24 held-out tasks), so
it first imitates solved episodes. Each is a procedural training task played by a script:

    [system prompt, worked example]   the episode's preamble (`agent_task.episode_preamble`)
    user       the task, as `SQLEnv.reset` writes it
    assistant  a short plan, `Action: Operation` and one ```sql block holding the reference statement
    user       the environment's observation of that statement (the sandbox's own text)
    assistant  `Action: Answer` and `Final Answer: [...]`: the first column of the observed rows for
               a question, `[]` after a change (the table itself is checked)

The text the model learns from is the text it sees in RL: the opening messages are the agent
task's, and the observation and the reward come from the environment (its database in this
process: the scripted SQL is the task's own reference statement), so a demonstration is kept
only when its scripted episode earns `reward_correct`, and skipped (counted) otherwise: a result
cut at `max_chars`, or an answer the checker refuses. The worked example's assistant turns say
`"training": false` (as in RL's preamble): context, not something to learn again in every row.

Tasks come from the procedural generator's training split only (the split is a function of a
task's content, so no held-out task can be drawn, whatever the seed); skills take turns so every
skill has the same number of demonstrations; train and test rows never share a task.
"""

from __future__ import annotations

import ast
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...common.data import write_jsonl
from .agent_task import episode_preamble
from .env import SQLEnv, SQLEnvConfig
from .procedural import SKILLS, build_task, is_heldout
from .sandbox import InProcessSandbox
from .tasks import SQLTask

# The plan before the operation: one short sentence, as the system prompt asks, and short because a turn
# has task.max_new_tokens tokens (an INSERT of five columns is ~65 tokens without it).
PLANS = {
    "filter": "I will select the matching rows.",
    "count": "I will count the matching rows.",
    "sum": "I will use SUM.",
    "avg": "I will use AVG.",
    "max": "I will use MAX.",
    "min": "I will use MIN.",
    "ranking": "I will sort the rows.",
    "group_by": "I will group the rows.",
    "comparison": "I will use a subquery.",
    "insert": "I will insert the row.",
    "update": "I will update the row.",
    "delete": "I will delete the matching rows.",
}
DEFAULT_PLAN = "I will query the table."


@dataclass
class DemoStats:
    """What a demonstration writer made: rows per split and skill, and the tasks it skipped."""
    train: Counter = field(default_factory=Counter)  # skill -> rows
    test: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # reason -> tasks

    def __str__(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items())) or "none"
        return (f"{sum(self.train.values())} train and {sum(self.test.values())} test demonstrations over "
                f"{len(self.train | self.test)} skills; skipped tasks: {skipped}")


def operation_turn(task: SQLTask) -> str:
    """The first agent turn: a plan, then the reference statement as an operation."""
    if not task.reference_sql:
        raise ValueError(f"task {task.id} has no reference_sql to demonstrate")
    return f"{PLANS.get(task.skill, DEFAULT_PLAN)}\nAction: Operation\n```sql\n{task.reference_sql.rstrip(';')};\n```"


def answer_turn(task: SQLTask, observation: str) -> str | None:
    """The answer turn after `observation`, or None when the observation is not a full list of rows
    (an error, or a result cut at max_chars)."""
    if task.is_modification:
        return "The change is made.\nAction: Answer\nFinal Answer: []"
    try:
        rows = ast.literal_eval(observation)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, tuple) and r for r in rows):
        return None
    answer = json.dumps([row[0] for row in rows], ensure_ascii=False)
    return f"The query returned the answer.\nAction: Answer\nFinal Answer: {answer}"


def demonstration(task: SQLTask, env_config: SQLEnvConfig, *, one_shot: bool = True) -> tuple[list[dict] | None, str]:
    """(the messages of a solved scripted episode of `task`, "") or (None, why it was skipped)."""
    if env_config.max_rounds < 2:
        raise ValueError(f"a demonstration takes 2 turns (an operation and the answer); max_rounds is "
                         f"{env_config.max_rounds}")
    env = SQLEnv(env_config, sandbox=InProcessSandbox)  # the reference SQL is trusted: no worker process needed
    try:
        messages = episode_preamble(env_config, one_shot) + [{"role": "user", "content": env.reset(task)}]
        operation = operation_turn(task)
        observation, _, done, info = env.step(operation)
        if done or info["action"] != "operation":
            return None, "the operation was not run"
        answer = answer_turn(task, observation)
        if answer is None:
            return None, "result not readable (an error or cut at max_chars)"
        _, _, done, info = env.step(answer)
        if not done or info["outcome"] != "correct" or info["episode_reward"] != env_config.reward_correct:
            return None, f"episode not rewarded as correct ({info.get('outcome')})"
    finally:
        env.close()
    return messages + [{"role": "assistant", "content": operation}, {"role": "user", "content": observation},
                       {"role": "assistant", "content": answer}], ""


def demonstrations(n: int, env_config: SQLEnvConfig, *, seed: int = 0, skills=SKILLS, one_shot: bool = True,
                   exclude: set[str] = frozenset(), stats: DemoStats | None = None,
                   split: str = "train") -> list[tuple[SQLTask, list[dict]]]:
    """`n` (task, messages) pairs over distinct procedural training tasks not in `exclude` (task ids),
    the skills taking turns. Skipped tasks are counted in `stats.skipped`."""
    stats = stats if stats is not None else DemoStats()
    rng, out, seen = random.Random(seed), [], set(exclude)
    for k in range(n):
        skill = skills[k % len(skills)]
        for _ in range(10_000):
            task = build_task(rng, skill)
            if task is None or is_heldout(task) or task.id in seen:
                continue
            seen.add(task.id)
            messages, why = demonstration(task, env_config, one_shot=one_shot)
            if messages is not None:
                break
            stats.skipped[why] += 1
        else:
            raise RuntimeError(f"no demonstrable {skill!r} task in 10,000 draws")  # a bug, not bad luck
        getattr(stats, split)[skill] += 1
        out.append((task, messages))
    return out


def write_demo_splits(out_dir: str | Path, n_train: int, n_test: int, env_config: SQLEnvConfig, *,
                      seed: int = 0, skills=SKILLS, one_shot: bool = True) -> tuple[Path, Path, DemoStats]:
    """OUT_DIR/train.jsonl and OUT_DIR/test.jsonl of {"messages": [...]} rows (test: other tasks,
    for the SFT validation loss). Returns (train path, test path, stats)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats = DemoStats()
    train = demonstrations(n_train, env_config, seed=seed, skills=skills, one_shot=one_shot, stats=stats)
    test = demonstrations(n_test, env_config, seed=seed + 1, skills=skills, one_shot=one_shot, stats=stats,
                          exclude={task.id for task, _ in train}, split="test")
    paths = []
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        paths.append(write_jsonl(out / name, ({"messages": messages, "task_id": task.id, "skill": task.skill}
                                              for task, messages in rows)))
    return paths[0], paths[1], stats
