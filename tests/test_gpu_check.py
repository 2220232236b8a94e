"""The prepared device check (`scripts/gpu_check.sh`, `make gpu-check`) run as its CPU dry run, so it
cannot rot before a GPU machine runs it: every stage runs in its own process, each is reported with
its figures in one JSON, and a stage cut off by the run's budget is reported as not run. The whole
dry run takes minutes on two cores (`slow`); the default suite runs the stages that exercise the
driver, a random-weight Hugging Face model and the torchrun path (a one-process group, gloo)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ["env", "install", "cuda-tests", "models", "grpo-smollm2", "grpo-qwen1.5b", "ddp", "fsdp", "adder"]


def dry_run(tmp_path: Path, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    proc = subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(out), "--work",
                           str(tmp_path / "work"), *args], capture_output=True, text=True, timeout=timeout)
    found = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else {}
    return proc, found


@pytest.mark.slow  # half a minute: three stages in child processes
def test_the_dry_runs_driver_model_and_torchrun_stages_run_and_report(tmp_path):
    proc, found = dry_run(tmp_path, "--stages", "env,install,ddp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(found) == ["env", "install", "ddp"]
    assert all(r["ok"] and r["error"] is None and r["seconds"] > 0 for r in found.values()), found
    assert found["env"]["cuda_available"] is False and found["env"]["torch"]
    assert found["install"]["how"] == "already importable"
    ddp = found["ddp"]
    assert ddp["backend"] == "gloo" and ddp["world_size"] == 1 and ddp["ddp_code_path"] is True
    assert ddp["step_s_median"] > 0 and ddp["peak_rss_mib"] > 0
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "===== ddp" in log and "world size 1" in log


def test_a_stage_left_under_a_quarter_of_its_time_limit_is_reported_not_run(tmp_path):
    """On the CPU env's limit is 60 s and adder's 120 s: a 28 s budget lets env run (over its quarter,
    15 s) and leaves adder less than its quarter, 30 s."""
    proc, found = dry_run(tmp_path, "--stages", "env,adder", "--budget-s", "28")
    assert proc.returncode == 1
    assert found["env"]["ok"], found["env"]
    assert found["adder"]["ok"] is False and found["adder"]["seconds"] == 0.0
    assert found["adder"]["error"].startswith("not run: ") and "left of the run's budget of 28s" in found["adder"]["error"]
    proc, found = dry_run(tmp_path, "--stages", "env", "--budget-s", "4")
    assert found["env"] == {"ok": False, "seconds": 0.0, "error": "not run: 4s left of the run's budget of 4s"}


def test_an_unknown_stage_is_refused_naming_the_stages(tmp_path):
    proc, _ = dry_run(tmp_path, "--stages", "env,gpu")
    assert proc.returncode == 2 and "unknown stage 'gpu'" in proc.stderr and "grpo-qwen1.5b" in proc.stderr


@pytest.mark.slow
def test_every_stage_of_the_dry_run_runs_and_is_ok(tmp_path):
    proc, found = dry_run(tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(found) == STAGES
    assert all(r["ok"] for r in found.values()), {k: r["error"] for k, r in found.items() if not r["ok"]}
    assert found["cuda-tests"]["skipped"] > 0 and found["cuda-tests"]["passed"] == 0  # no GPU here
    for key in ("grpo-smollm2", "grpo-qwen1.5b"):
        g = found[key]
        assert g["steps"] == 2 and g["update_fraction"] == 1.0  # algo.skip_zero_advantage=false: every row
        assert g["loop_tokens_per_s"] > 0 and g["generate_tokens_per_s"] > 0
        assert g["plan_peak_gib"] > 0 and g["plan_step_s"] > 0 and "cuda_graph" not in g  # the CPU: no graph
    assert found["models"]["qwen1.5b"]["parameters"] > found["models"]["smollm2"]["parameters"]  # the vocabularies
    assert found["fsdp"]["fsdp_code_path"] is True and found["fsdp"]["backend"] == "gloo"
    assert found["adder"]["rl_steps"] == 10
