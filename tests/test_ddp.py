"""DDP on CPU: two torchrun processes (gloo) train the tiny config; their parameters stay
identical, and only rank 0 writes the run dir."""

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from .conftest import TINY, TINY_NO_WARMUP

# Each rank trains, then saves its own parameters for the test to compare.
WORKER = """
import sys
from safetensors.torch import save_file
from lmrl.config import load_config
from lmrl.train.rl_trainer import RLTrainer
from lmrl.parallel.ddp import shutdown
trainer = RLTrainer(load_config("adder", sys.argv[1:]))
trainer.train()
state = {k: v.clone() for k, v in trainer.module.state_dict().items()}  # policy (+ value); tied weights: a copy each
save_file(state, f"{trainer.run_dir}/params_rank{trainer.dist.rank}.safetensors")
shutdown()
"""


def torchrun(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)


PPO = ["algo.name=ppo", "algo.value_model=head", "algo.ppo_epochs=2", "algo.minibatch_size=8", "train.ga_steps=2"]
GRPO = ["algo.name=grpo", "algo.group_size=4", "algo.kl_coef=0.1", "algo.ppo_epochs=2", "algo.minibatch_size=8"]


DYNAMIC = [*GRPO, "algo.dynamic_sampling=true", "algo.max_sample_batches=3", "task.reward=digits"]


@pytest.mark.parametrize("algo", [[], GRPO, PPO, DYNAMIC], ids=["reinforce", "grpo", "ppo", "grpo-dynamic-sampling"])
def test_two_cpu_processes_keep_identical_parameters(tmp_path, algo):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = tmp_path / "run"
    proc = torchrun(tmp_path, str(script), *TINY, "sft.batch_size=32", "train.rollout_size=32",
                    "train.keep_checkpoints=0", f"run.dir={run}", *algo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    p0, p1 = (load_file(run / f"params_rank{r}.safetensors") for r in (0, 1))
    assert p0.keys() == p1.keys()
    assert all((p0[k] == p1[k]).all() for k in p0), "ranks diverged"
    untrained = load_file(run / "checkpoints" / "step_2" / "model.safetensors")
    prefix = "policy." if algo == PPO else ""
    assert any((p0[prefix + k] != untrained[k]).any() for k in untrained), "training did not change the weights"
    assert "world size 2" in (run / "train.log").read_text()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "a rank other than 0 wrote metrics"


def test_the_completions_log_holds_every_ranks_completions(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = tmp_path / "run"
    proc = torchrun(tmp_path, str(script), *TINY_NO_WARMUP, "train.steps=2", "train.rollout_size=32",
                    "train.log_completions=true", f"run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 32 + [2] * 32  # 16 from each rank, written once by rank 0


@pytest.mark.slow
def test_torchrun_runs_the_cli(tmp_path):
    run = tmp_path / "run"
    proc = torchrun(tmp_path, "-m", "lmrl", "train", "adder", "--debug", f"run.dir={run}", "run.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["rl_steps"] == 4
