"""Every script in examples/ runs (in its --quick form) and reports what it trained."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))
# SmolLM2 from its GGUF file: a minute or more each on a 2-core CPU; the built-in GPT's own-reward and
# GRPO examples half a minute each (train_adder.py, the main job's API, stays in the fast set)
SLOW = {"rlhf_smollm2.py", "trl_grpo.py", "trl_dpo.py", "sql_agent_own_loop.py", "train_math_lora.py",
        "own_environment.py", "trl_tools.py", "train_grpo.py", "custom_reward.py"}


@pytest.mark.parametrize("script", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW else p
                                    for p in EXAMPLES], ids=[p.name for p in EXAMPLES])
def test_example_runs(script, tmp_path):
    proc = subprocess.run([sys.executable, str(script), "--quick"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "after RL" in proc.stdout or "held-out" in proc.stdout
    assert list((tmp_path / "runs").glob("*/summary.json"))
