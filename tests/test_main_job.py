"""The main job end to end (slow: minutes on a laptop CPU). The exact figures are the benchmark's
business (benchmarks/adder_rl_vs_sft.py); this checks the shape: the warm-up's label budget leaves it
far from the top, and RL, reading no labels, takes it most of the way."""

import json

import pytest

from lmrl.config import load_config
from lmrl.train.rl_trainer import RLTrainer


@pytest.mark.slow
def test_default_adder_rl_does_the_work(tmp_path):
    cfg = load_config("adder", [f"run.dir={tmp_path / 'adder'}", "run.progress=false"])
    summary = RLTrainer(cfg).train()
    assert summary["sft_examples"] == 500
    assert summary["warmup_accuracy"] < 0.69
    assert summary["rl_gain"] >= 0.30
    assert summary["final_accuracy"] >= 0.95
    assert json.loads((tmp_path / "adder" / "summary.json").read_text())["final_accuracy"] == summary["final_accuracy"]
