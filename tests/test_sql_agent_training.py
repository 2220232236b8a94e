"""The SQL agent through the RL trainer: a tiny Llama built here plays DBBench-protocol episodes
against sandboxed SQLite tables, with a LoRA adapter, callbacks and automatic resume. No hub."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lmrl.config import ConfigError, load_config
from lmrl.tasks.sql.agent_task import SQLAgentTask, per_skill_success
from lmrl.tasks.sql.env import SQLEnvConfig
from lmrl.train.callbacks import Callback
from lmrl.train.rl_trainer import RLTrainer
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sql-agent")
    save_tiny_llama(root / "model", max_positions=2048)
    return root / "model"


def _config(model_dir, run_dir, *overrides):
    # env.max_context leaves room for the opening: system prompt, worked example and task, ~1,200 tiny tokens
    return load_config("sql-agent-smollm2", [
        f"model.path={model_dir}", f"run.dir={run_dir}", "lora.r=4", "lora.target_modules=[all-linear]",
        "task.max_new_tokens=8", "sql.max_rounds=2", "env.max_context=1600", "sql.train_tasks=20",
        "sql.heldout_per_skill=1", "sql.skills=[count, max, insert]", "train.steps=2", "train.rollout_size=4",
        "train.eval_every=2", "train.ckpt_every=1", "eval.size=3", "eval.batch_size=3", "run.progress=false",
        "run.tensorboard=false", "run.threads=1", "optim.lr=1e-2", "train.temperature=1.0", *overrides])


class TurnsReward:
    """`reward.cls` for the test: a random tiny model never answers right, so every episode would
    score the same timeout and no update would move; reward the agent's characters instead."""

    def __call__(self, prompts, completions, skill, label, **kwargs):
        assert len(skill) == len(label) == len(completions)
        return [float(len(c)) for c in completions]


class Recorder(Callback):
    def __init__(self):
        self.episodes, self.steps, self.checkpoints = [], [], []

    def on_episode_end(self, trainer, episode):
        self.episodes.append(episode)

    def on_step_end(self, trainer, step, metrics):
        self.steps.append(step)

    def on_checkpoint(self, trainer, path):
        self.checkpoints.append(path.name)


def test_sql_agent_trains_its_adapter_and_reports_episodes_to_callbacks(tiny_dir, tmp_path):
    recorder = Recorder()
    trainer = RLTrainer(_config(tiny_dir, tmp_path / "run", "reward.cls=tests.test_sql_agent_training:TurnsReward"),
                        callbacks=[recorder])
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    summary = trainer.train()

    assert summary["rl_steps"] == 2 and 0.0 <= summary["final_accuracy"] <= 1.0
    for n, p in trainer.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), f"frozen base weight {n} changed"
    assert any(p.abs().sum() > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n), "adapter did not train"
    # 4 episodes per step, each with its whole conversation, the agent's log-probs and its return
    assert len(recorder.episodes) == 8 and {e.step for e in recorder.episodes} == {1, 2}
    start = len(trainer.task.preamble)  # the system prompt and the worked example come first
    assert start == 5 and trainer.task.preamble[0]["role"] == "system"
    for e in recorder.episodes:
        assert e.messages[:start] == trainer.task.preamble
        assert [m["role"] for m in e.messages[start:start + 2]] == ["user", "assistant"]
        assert e.prompt == e.messages[start]["content"]
        assert e.info["outcome"] in ("correct", "wrong", "timeout") and 1 <= e.info["turns"] <= 2
        assert e.reward == len(e.completion)  # the custom reward replaced the environment's
        assert e.completion.startswith("[assistant] ") and e.messages[start + 1]["content"] in e.completion
        assert len(e.logprobs) > 0 and (e.logprobs <= 0).all()
    assert recorder.steps == [1, 2] and recorder.checkpoints[:1] == ["step_1"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    for key in ("rollout/turns", "rollout/invalid_actions", "rollout/timeout_rate", "eval/accuracy", "eval/turns"):
        assert key in keys, key
    saved = load_file(str(tmp_path / "run" / "checkpoints" / "step_2" / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)


def test_a_restarted_sql_run_resumes_from_its_latest_checkpoint(tiny_dir, tmp_path):
    RLTrainer(_config(tiny_dir, tmp_path / "run", "train.steps=1")).train()
    recorder = Recorder()
    RLTrainer(_config(tiny_dir, tmp_path / "run", "train.steps=2"), callbacks=[recorder]).train()
    assert recorder.steps == [2]  # the preset's run.resume=auto picked up step 1
    log = (tmp_path / "run" / "train.log").read_text()
    assert "resumed from" in log and "step_1" in log


def test_held_out_sql_tasks_are_balanced_over_skills_and_never_trained_on(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    task = SQLAgentTask(tok, SQLEnvConfig(max_rounds=2, train_tasks=50, heldout_per_skill=3, skills=["count", "sum"]))
    held = task.skills(task.heldout_ids)
    assert sorted(held) == ["count"] * 3 + ["sum"] * 3
    train_ids = {task.tasks[i].id for i in range(task.n_train)}
    assert not train_ids & {task.tasks[i].id for i in task.heldout_ids.tolist()}
    assert task.sample_train_ids(100, torch.Generator().manual_seed(0)).max() < task.n_train


def test_per_skill_success_counts_correct_episodes_by_skill(tiny_dir):
    from transformers import AutoTokenizer

    options = SQLEnvConfig(train_tasks=4, heldout_per_skill=1, skills=["count", "sum"])
    task = SQLAgentTask(AutoTokenizer.from_pretrained(tiny_dir), options)
    ids = task.heldout_ids.repeat(2)  # count, sum, count, sum
    infos = [{"outcome": "correct"}, {"outcome": "wrong"}, {"outcome": "timeout"}, {"outcome": "correct"}]
    assert per_skill_success(task, ids, infos) == {"count": 0.5, "sum": 0.5}


@pytest.mark.parametrize("override, needle", [
    ("sql.skills=[count, joins]", "sql.skills"),
    ("sql.invalid_action_penalty=-0.1", "sql.invalid_action_penalty"),
    ("env.max_context=8", "env.max_context"),
    ("sql.max_round=3", "sql.max_rounds"),
])
def test_bad_sql_settings_fail_at_config_time_naming_the_key(tiny_dir, tmp_path, override, needle):
    with pytest.raises(ConfigError, match=needle):
        _config(tiny_dir, tmp_path / "run", override)
