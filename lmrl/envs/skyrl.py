"""skyrl-gym's text environments as lmrl environments (`pip install 'lmrl[skyrl]'`).

    from lmrl.envs.skyrl import factory

    make_env = factory("gsm8k", data_file="/work/shared/data/gsm8k/train.jsonl")
    env = make_env()
    messages, info = env.reset(seed=0)       # [{"role": "user", "content": "Natalia sold clips ... after \"####\"."}]
    observation, reward, terminated, truncated, info = env.step("... so 48 + 24 = 72.\n#### 72")
    # "", 1.0, True, False, {}

A skyrl-gym environment is built for one problem (its ground truth comes in `extras`, e.g.
`extras["reward_spec"]["ground_truth"]`) and opened with `init(prompt)`, so the problems come from a data
file: `reset(seed)` takes row `seed % len(rows)` (a random row when seed is None), builds the environment for
it with `skyrl_gym.make(env_id, env_config=..., extras=...)` and returns `init`'s opening conversation. A
held-out seed (`HELDOUT_SEED` and above, what lmrl evaluates on) takes a row of `test_file` / `test_rows`
instead, or without them one of the last tenth of the rows, which training seeds then never reach (a set
of fewer than 10 rows is not split).

Rows are SkyRL's dataset format, `{"prompt": [chat messages], "env_class": ..., "reward_spec": {...},
"extra_info": {...}}`, whose fields other than `prompt` and `env_class` become `extras` (as SkyRL's trainer
does), in a JSONL (optionally gzipped) or parquet file, or given as `rows=`. GSM8K's own rows
`{"question", "answer": "... #### 72"}` are turned into that format the way SkyRL's GSM8K preparation does:
the question followed by `GSM8K_INSTRUCTION`, the number after "####" (commas dropped) as the ground truth.

`step(text)` maps skyrl's `{"observations", "reward", "done", "metadata"}` to lmrl's five values:
`terminated = done`, `truncated` False (skyrl has no such flag), `info` = the metadata. No new messages is
the text "", a single user message its text, anything else (tool results, several messages) the messages.

Checked offline here: `gsm8k` (one answer, 1.0 when the number after "#### " equals the ground truth as
text, else 0), `gsm8k_multi_turn` (up to `max_turns` answers, 1.0 ends it, a well-formatted wrong answer
0.2/max_turns) and `aime` (`extras["reward_model"]["ground_truth"]`, "Answer: X", 1.0 or -1.0); the others
registered need a database on disk (`text2sql`), a retrieval server (`search`, `searchcode`) or run the
model's code (`lcb`).
"""

from __future__ import annotations

import copy
import functools
import os
import random
import re
from typing import Callable

from ..common.data import DataError, iter_file_rows
from .protocol import HELDOUT_SEED

# What SkyRL's GSM8K preparation appends to each question (its gsm8k environment reads the answer after "####").
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

_GSM8K_ANSWER = re.compile(r"####\s*(-?[0-9.,]+)")


def _import_skyrl_gym():
    try:
        import skyrl_gym
    except ImportError:
        raise ImportError("skyrl-gym environments need the skyrl-gym package: pip install 'lmrl[skyrl]'") from None
    return skyrl_gym


def factory(env_id: str, *, data_file: str | os.PathLike | None = None, rows: list[dict] | None = None,
            test_file: str | os.PathLike | None = None, test_rows: list[dict] | None = None,
            env_config: dict | None = None, max_turns: int | None = None,
            instruction: str = GSM8K_INSTRUCTION, **unknown) -> Callable[[], "SkyRLEnv"]:
    """A zero-argument callable making `SkyRLEnv`s of the registered skyrl-gym environment `env_id` over
    the problems of `data_file` (or `rows`): training seeds play them, held-out seeds (from `HELDOUT_SEED`)
    the problems of `test_file` (or `test_rows`), or without those the last tenth of the training rows,
    which no training seed then plays (with fewer than 10 rows nothing is held out). `env_config`: the environment's config (SkyRL's
    `skyrl_gym_config.<env_id>`, e.g. text2sql's db_path); `max_turns`: put in every row's extras, as SkyRL's
    generator does; `instruction`: appended to GSM8K-format questions."""
    name = f"skyrl:{env_id}"
    if unknown:
        # A ValueError rather than Python's TypeError: the settings often come from a config's env.kwargs.
        raise ValueError(f"{name}: unknown setting {', '.join(map(repr, unknown))}; the settings are data_file, "
                         f"rows, test_file, test_rows, env_config, max_turns and instruction")
    skyrl_gym = _import_skyrl_gym()
    known = sorted(skyrl_gym.registry)
    if env_id not in known:
        raise ValueError(f"{name}: no skyrl-gym environment of that id; known: {', '.join(known)} (one your own "
                         f"module registers with skyrl_gym.register exists once it is imported: name a factory of it "
                         f"as env.id=package.module:make instead)")
    if (data_file is None) == (rows is None):
        raise ValueError(f"{name}: give the problems as data_file= (JSONL or parquet) or rows=, one of the two")
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
        raise ValueError(f"{name}: max_turns={max_turns!r}; it is a whole number of turns, 1 or more")
    if test_file is not None and test_rows is not None:
        raise ValueError(f"{name}: give the held-out problems as test_file= or test_rows=, not both")
    problems = _problems(data_file, rows, "rows", env_id, name, instruction)
    if test_file is not None or test_rows is not None:
        heldout = _problems(test_file, test_rows, "test_rows", env_id, name, instruction)
    elif len(problems) >= 10:  # the last tenth held out: no training seed reaches it
        cut = len(problems) - len(problems) // 10
        problems, heldout = problems[:cut], problems[cut:]
    else:  # too few to split: held-out seeds play the same problems
        heldout = problems
    config = _as_config(env_config, name)
    make = functools.partial(SkyRLEnv, env_id, problems, config, max_turns, heldout)
    # Build the first problem's environment now, so a missing field or database fails here with its row.
    probe = make()
    probe.reset(seed=0)
    probe.close()
    return make


def _problems(path, rows, what: str, env_id: str, name: str, instruction: str) -> tuple:
    """The problems of a data file or of rows handed in, each as (prompt messages, extras)."""
    if path is not None:
        located, source = _read_rows(path, name), str(path)
    else:
        located, source = [(f"{what}[{i}]", row) for i, row in enumerate(rows)], what
    problems = tuple(_problem(row, where, env_id, name, instruction) for where, row in located)
    if not problems:
        raise ValueError(f"{name}: {source} holds no problems")
    return problems


def _read_rows(path, name: str) -> list[tuple[str, dict]]:
    """(where, row) for each row of a JSONL (`path:line`) or parquet (`path:row N`) file (`iter_file_rows`)."""
    if not os.path.isfile(path):
        raise ValueError(f"{name}: data_file {str(path)!r} is not a file")
    return list(iter_file_rows(path))


def _problem(row, where: str, env_id: str, name: str, instruction: str) -> tuple[list[dict], dict]:
    """(prompt messages, extras) from one row: SkyRL's dataset format, or GSM8K's {question, answer}."""
    if not isinstance(row, dict):
        raise DataError(f"{name}: {where} is a {type(row).__name__}; a row is an object")
    if "prompt" in row:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not (isinstance(prompt, list) and prompt and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in prompt)):
            raise DataError(f"{name}: {where}: 'prompt' is {str(prompt)[:80]!r}; it is a list of "
                            f"{{'role', 'content'}} messages")
        env_class = row.get("env_class")
        if env_class not in (None, env_id):
            raise DataError(f"{name}: {where} is for env_class {env_class!r}, not {env_id!r}")
        # SkyRL's trainer hands every other field of the row to the environment as its extras.
        extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
        return prompt, extras
    if "question" in row and "answer" in row:
        match = _GSM8K_ANSWER.search(str(row["answer"]))
        if match is None:
            raise DataError(f"{name}: {where}: the answer has no final '#### <number>': {str(row['answer'])[-80:]!r}")
        truth = match.group(1).replace(",", "")
        prompt = [{"role": "user", "content": f"{row['question']} {instruction}".strip()}]
        extras = {"reward_spec": {"method": "rule", "ground_truth": truth},
                  "extra_info": {"question": row["question"], "answer": row["answer"]}}
        return prompt, extras
    raise DataError(f"{name}: {where} has keys {', '.join(map(repr, row)) or 'none'}; a row is SkyRL's "
                    f"{{'prompt', 'reward_spec', ...}} or GSM8K's {{'question', 'answer'}}")


def _as_config(env_config, name: str):
    """SkyRL hands environments an OmegaConf DictConfig (read by attribute, e.g. `env_config.db_path`)."""
    from omegaconf import DictConfig, OmegaConf  # a dependency of skyrl-gym

    if env_config is None:
        return OmegaConf.create({})
    if isinstance(env_config, DictConfig):
        return env_config
    if not isinstance(env_config, dict):
        raise ValueError(f"{name}: env_config={env_config!r}; it is a dict of the environment's settings")
    return OmegaConf.create(env_config)


def _observation(messages) -> str | list[dict]:
    """skyrl's new messages as lmrl's observation: "" for none, a lone user message as its text."""
    if not messages:
        return ""
    if isinstance(messages, str):
        return messages
    messages = [dict(m) for m in messages]
    if len(messages) == 1 and messages[0].get("role") == "user" and isinstance(messages[0].get("content"), str):
        return messages[0]["content"]
    return messages


class SkyRLEnv:
    """One skyrl-gym environment per episode behind lmrl's environment protocol (see the module docstring)."""

    def __init__(self, env_id: str, problems: tuple, env_config=None, max_turns: int | None = None,
                 heldout: tuple = ()):
        self._skyrl_gym = _import_skyrl_gym()
        self.env_id = env_id
        self.name = f"skyrl:{env_id}"
        self._problems, self._heldout = problems, heldout
        self._config = env_config if env_config is not None else _as_config(None, self.name)
        self._max_turns = max_turns
        self._env = None
        self._ended = True
        self.row = None

    def reset(self, seed: int | None = None):
        """The opening conversation of training problem `seed % len(problems)`, or for a held-out seed
        (`HELDOUT_SEED` and above) of held-out problem `(seed - HELDOUT_SEED) % len(heldout)`, and info
        {"row", "heldout", "seed"}."""
        self.close()
        if seed is None:
            seed = random.SystemRandom().randrange(len(self._problems))
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"environment {self.name}: seed {seed!r} is not an integer")
        heldout = seed >= HELDOUT_SEED and self._heldout is not self._problems
        table = self._heldout if heldout else self._problems
        index = (seed - HELDOUT_SEED if heldout else seed) % len(table)
        prompt, extras = table[index]
        # Copies: environments keep and extend what they are given, and the problems are shared.
        extras = copy.deepcopy(extras)
        if self._max_turns is not None:
            extras["max_turns"] = self._max_turns
        try:
            env = self._skyrl_gym.make(self.env_id, env_config=self._config, extras=extras)
            messages, metadata = env.init(copy.deepcopy(prompt))
        except Exception as error:  # skyrl-gym reports missing fields as bare asserts and KeyErrors
            detail = f"{type(error).__name__}: {error}".strip().rstrip(":").replace("\n", " ")
            raise ValueError(f"environment {self.name}: building it for problem {index} failed: "
                             f"{detail[:300]}") from None
        self._env, self._ended, self.row = env, False, index
        info = dict(metadata) if isinstance(metadata, dict) else {}
        info.update(row=index, heldout=heldout, seed=seed)
        return [dict(m) for m in messages], info

    def step(self, action: str):
        """skyrl's step of `action` as (observation, reward, terminated, truncated, info)."""
        if self._env is None:
            raise RuntimeError(f"environment {self.name}: step() before reset()")
        if self._ended:
            raise RuntimeError(f"environment {self.name}: step() after the episode ended; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"environment {self.name}: action {action!r} ({type(action).__name__}) is not text")
        out = self._env.step(action)
        done = bool(out["done"])
        info = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        observation = _observation(out.get("observations"))
        reward = float(out["reward"])
        if done:
            info["success"] = reward >= 1.0  # skyrl's text environments give 1.0 for a solved problem only
            self.close()
        return observation, reward, done, False, info

    def close(self) -> None:
        """Closes the episode's skyrl environment (database or tool connections), if any."""
        if self._env is not None and not self._ended:
            self._env.close()
        self._ended = True
