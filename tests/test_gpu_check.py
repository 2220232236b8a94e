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


def load_gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


SITE = "/usr/lib/python3/site-packages/"
LLAMA = frame(SITE + "transformers/models/llama/modeling_llama.py", 118, "forward")
MODULE = frame(SITE + "torch/nn/modules/module.py", 1784, "_call_impl")
LOSS = frame(str(REPO / "lmrl" / "algos" / "base.py"), 40, "loss")


def test_live_at_peak_sums_the_blocks_alive_at_the_allocated_peak_by_their_site():
    g = load_gpu_check()
    MiB = 2**20
    events = [
        {"action": "alloc", "addr": 1, "size": 100 * MiB, "frames": [MODULE, LLAMA]},  # 100
        {"action": "alloc", "addr": 2, "size": 50 * MiB, "frames": [LLAMA]},  # 150
        {"action": "segment_alloc", "addr": 9, "size": 999 * MiB, "frames": []},  # not an allocation
        {"action": "free_requested", "addr": 7, "size": 30 * MiB, "frames": []},  # from before the trace: 120
        {"action": "free_completed", "addr": 7, "size": 30 * MiB, "frames": []},  # counted at the request
        {"action": "alloc", "addr": 3, "size": 200 * MiB, "frames": [LOSS]},  # 320: the peak
        {"action": "free_requested", "addr": 3, "size": 200 * MiB, "frames": []},  # 120
        {"action": "alloc", "addr": 4, "size": 150 * MiB, "frames": []},  # 270
    ]
    found = g.live_at_peak(events, baseline=1024 * MiB)
    assert found["peak_after_event"] == 5 and found["events"] == 8
    assert found["baseline_gib"] == 1.0 and found["peak_gib"] == round((1024 + 320) / 1024, 3)
    assert found["live_at_peak"] == [
        {"where": "lmrl/algos/base.py:40 loss", "gib": round(200 / 1024, 3), "blocks": 1},
        {"where": "transformers/models/llama/modeling_llama.py:118 forward", "gib": round(150 / 1024, 3),
         "blocks": 2}]
    # the sites past `top` are summed into one line; a trace that only frees peaks before its first event
    assert g.live_at_peak(events, top=1)["live_at_peak"][-1] == {"where": "1 other sites",
                                                                 "gib": round(150 / 1024, 3), "blocks": 2}
    nothing = g.live_at_peak([{"action": "free_requested", "addr": 5, "size": 10, "frames": []}], baseline=2**30)
    assert nothing["peak_gib"] == 1.0 and nothing["peak_after_event"] == -1 and nothing["live_at_peak"] == []


def test_an_allocation_without_a_python_frame_outside_torch_is_named_as_such():
    g = load_gpu_check()
    assert g.allocation_site([MODULE]).startswith("no Python frame")
    assert g.allocation_site([frame("??", 0, "at::native::empty"), MODULE, LOSS]) == "lmrl/algos/base.py:40 loss"


def test_the_update_trace_records_from_the_first_episode_to_the_first_update_only(monkeypatch):
    import torch

    g = load_gpu_check()
    calls = []
    events = [{"action": "alloc", "addr": 1, "size": 2**30, "frames": [LLAMA]}]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 2**30)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kw: calls.append(enabled))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"device_traces": [events], "segments": []})
    trace = g.UpdateMemoryTrace()
    trace.on_update_end(None, 0)  # the warm-up's update, before any episode: nothing recorded
    assert calls == [] and trace.breakdown is None
    for _ in range(3):
        trace.on_episode_end(None, None)
    trace.on_update_end(None, 1)
    trace.on_episode_end(None, None)
    trace.on_update_end(None, 2)
    assert calls == ["all", None]
    assert trace.breakdown["peak_gib"] == 2.0 and trace.breakdown["live_at_peak"][0]["blocks"] == 1
