"""Exact resume: a run stopped by SIGKILL (or Ctrl-C) and resumed writes the same metrics as a
run that never stopped. Timing metrics (perf/*, time/*) are the only values allowed to differ."""

import json
import os
import signal
import subprocess
import sys

import pytest

from lmrl import checkpoint as ckpt
from lmrl.train.rl_trainer import RLTrainer

from .conftest import TINY

# Trains the tiny config in a child process and kills it with SIGKILL right after step KILL_AT.
CHILD = """
import os, signal, sys
from lmrl.config import load_config
from lmrl.train.rl_trainer import RLTrainer
overrides, kill_at = sys.argv[1:-1], int(sys.argv[-1])
trainer = RLTrainer(load_config("adder", overrides))
end_step = trainer.end_step
def end_step_then_die(*args, **kwargs):
    end_step(*args, **kwargs)
    if trainer.state["step"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
trainer.end_step = end_step_then_die
trainer.train()
"""

VOLATILE = ("perf/", "time/")


def stable_metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def run_child(overrides, kill_at):
    return subprocess.run([sys.executable, "-c", CHILD, *overrides, str(kill_at)], capture_output=True, text=True,
                          timeout=300)


GRPO_KL = ["algo.name=grpo", "algo.group_size=4", "algo.kl_coef=0.1", "algo.ppo_epochs=2", "algo.minibatch_size=8"]
PPO = ["algo.name=ppo", "algo.value_model=separate", "algo.kl_coef=0.1", "algo.kl_target=0.01", "algo.kl_in_reward=true",
       "algo.ppo_epochs=2", "algo.minibatch_size=8"]


@pytest.mark.parametrize("kill_at, resumes_from, algo", [
    (3, "step_2", []),  # in the warm-up
    (9, "step_8", []),  # in RL
    pytest.param(9, "step_8", GRPO_KL, marks=pytest.mark.slow),  # with a reference model and minibatch shuffling
    (9, "step_8", PPO),  # with a value model, a reference and an adaptive KL coefficient
    pytest.param(9, "step_8", ["train.ema_decay=0.5"], marks=pytest.mark.slow),  # evaluating an average of the weights
    # replaying failed prompts
    pytest.param(9, "step_8", ["train.replay_fraction=0.5", "train.replay_size=8"], marks=pytest.mark.slow),
], ids=["warmup", "reinforce", "grpo-kl", "ppo", "reinforce-ema", "reinforce-replay"])
def test_a_run_killed_with_sigkill_resumes_exactly(tmp_path, kill_at, resumes_from, algo):
    args = TINY + ["train.steps=8"] + algo
    reference = run_child(args + [f"run.dir={tmp_path / 'ref'}"], kill_at=-1)
    assert reference.returncode == 0, reference.stderr

    killed_dir = tmp_path / "killed"
    killed = run_child(args + [f"run.dir={killed_dir}"], kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL
    assert ckpt.latest_checkpoint(killed_dir / "checkpoints").name == resumes_from
    assert not (killed_dir / "summary.json").exists()

    resumed = run_child(args + [f"run.dir={killed_dir}", "run.resume=auto"], kill_at=-1)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {killed_dir / 'checkpoints' / resumes_from}" in resumed.stderr
    assert stable_metrics(killed_dir) == stable_metrics(tmp_path / "ref")
    ref_summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    summary = json.loads((killed_dir / "summary.json").read_text())
    for key in ["warmup_accuracy", "final_accuracy", "best", "sft_examples"]:
        assert summary[key] == ref_summary[key], key


def partial_credit_reward(task, ctrl_c_at_call=None):
    """The verifier's partial credit as a user reward function; sends Ctrl-C during call N."""
    calls = {"n": 0}

    def reward(prompts, completions):
        calls["n"] += 1
        if calls["n"] == ctrl_c_at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return [task.score(p, c) for p, c in zip(prompts, completions)]

    return reward


def test_ctrl_c_saves_a_checkpoint_and_resume_continues_exactly(tiny_config, tmp_path):
    reference = RLTrainer(tiny_config("task.reward=digits", dir=tmp_path / "ref"))
    reference.reward_fn = partial_credit_reward(reference.task)
    reference.train()

    cfg = tiny_config("task.reward=digits", dir=tmp_path / "interrupted")
    trainer = RLTrainer(cfg)
    trainer.reward_fn = partial_credit_reward(trainer.task, ctrl_c_at_call=3)  # during RL step 3
    result = trainer.train()
    assert result == {"interrupted": True, "step": 7, "signal": "SIGINT"}  # the step in flight finishes, then it saves
    assert ckpt.latest_checkpoint(cfg.run_dir / "checkpoints").name == "step_7"
    assert "interrupted: checkpoint saved at step 7" in (cfg.run_dir / "train.log").read_text()

    resumed = RLTrainer(tiny_config("task.reward=digits", "run.resume=auto", dir=cfg.run_dir))
    resumed.reward_fn = partial_credit_reward(resumed.task)
    resumed.train()
    assert stable_metrics(cfg.run_dir) == stable_metrics(reference.run_dir)
