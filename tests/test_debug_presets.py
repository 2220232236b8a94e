"""`lmrl train PRESET --debug` runs every shipped preset end to end in seconds after the model loads:
the preset shrunk (steps, batches, held-out rows, completion lengths), with the stages it has and no
other. The SmolLM2 presets load a 135M model and are marked slow."""

import json

import pytest

from lmrl.cli import main
from lmrl.config import debug_overrides, list_presets, load_config

ARITHMETIC = ["adder", "adder-grpo", "adder-ppo", "adder-rloo", "multiplier"]
SMOLLM2 = ["math-grpo-smollm2", "dpo-smollm2", "rm-smollm2", "sql-sft-smollm2", "sql-agent-smollm2", "env-smollm2"]
NEEDS_A_DOWNLOAD = ["math-grpo-qwen-gpu"]  # its model is not on a machine without a hub


def test_every_shipped_preset_is_covered_here():
    assert sorted(ARITHMETIC + SMOLLM2 + NEEDS_A_DOWNLOAD + ["ppo-rm-smollm2"]) == list_presets()


@pytest.mark.parametrize("preset", list_presets())
def test_debug_keeps_the_presets_stages_and_shrinks_them(preset):
    full = load_config(preset)
    small = load_config(preset, debug_overrides(full))
    if full.run.trainer == "rl":
        assert bool(small.sft.steps) == bool(full.sft.steps) and 1 <= small.train.steps <= 4
        group = full.algo.group_size * full.train.ga_steps
        assert small.eval.size <= 64 and small.train.rollout_size <= max(32, group)
        assert small.algo.name == full.algo.name and small.algo.group_size == full.algo.group_size
    else:
        assert 1 <= small.train.max_steps <= 4 and 1 <= small.data.eval_size <= 4
        assert small.data.train_file == full.data.train_file  # the real run's data, never a shrunken copy


def _debug(preset, run_dir, *overrides):
    assert main(["train", preset, "--debug", f"run.dir={run_dir}", "run.progress=false", *overrides]) == 0
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("preset", ARITHMETIC)
def test_debug_runs_an_arithmetic_preset(preset, tmp_path):
    summary = _debug(preset, tmp_path / "run")
    full = load_config(preset)
    assert summary["steps_done"] == 4 and summary["sft_steps"] == min(full.sft.steps, 4)


@pytest.mark.slow
@pytest.mark.parametrize("preset", SMOLLM2)
def test_debug_runs_a_smollm2_preset(preset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # data the preset generates lands here
    summary = _debug(preset, tmp_path / "run")
    assert summary["steps_done"] >= 1


@pytest.mark.slow
def test_debug_runs_ppo_against_a_debug_reward_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rm = _debug("rm-smollm2", tmp_path / "rm")
    summary = _debug("ppo-rm-smollm2", tmp_path / "ppo", f"reward.model={rm['exported']}")
    assert summary["steps_done"] == 4 and "eval/reward" in summary["final_eval"]
