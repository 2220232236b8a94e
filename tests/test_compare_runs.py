"""scripts/compare_runs.py: two run dirs agree when metrics (timing fields aside) and weights do."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"


def _run(path: Path, loss: float, seconds: float, weight: float) -> Path:
    path.mkdir(parents=True)
    rows = [{"step": 1, "train/loss": loss, "time/step_s": seconds, "perf/tokens_per_s": 100 / seconds}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    save_file({"w": torch.full((2,), weight)}, str(path / "model.safetensors"))
    return path


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True, timeout=60)


def test_runs_that_differ_only_in_timing_agree(tmp_path):
    done = _compare(_run(tmp_path / "a", 0.5, 1.0, 1.0), _run(tmp_path / "b", 0.5, 3.0, 1.0))
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("same: 1 metrics rows")


def test_a_metric_or_a_weight_that_differs_is_named(tmp_path):
    done = _compare(_run(tmp_path / "a", 0.5, 1.0, 1.0), _run(tmp_path / "b", 0.25, 1.0, 2.0))
    assert done.returncode == 1
    assert done.stdout.splitlines()[:2] == ["metrics.jsonl row 1: train/loss 0.5 != 0.25", "model.safetensors: bytes differ"]
