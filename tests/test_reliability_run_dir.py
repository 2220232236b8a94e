"""One run dir, one run: a run holds its dir's lock for as long as it trains, so a second run on it
(fresh or `--resume`) is refused in one line instead of dying on the other's temporary checkpoint
folder (issue 45)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmrl.config import ConfigError, load_config
from lmrl.train.run_dir import prepare_run_dir, unlock_run_dir

REPO = Path(__file__).resolve().parents[1]
HOLD = """
import sys
from lmrl.config import load_config
from lmrl.train.run_dir import prepare_run_dir
cfg = load_config("adder", sys.argv[1:])
print(prepare_run_dir(cfg), flush=True)
sys.stdin.read()  # hold the run dir until the test closes our stdin
"""


class OtherRun:
    """A second process that has prepared (and so holds) a run dir, with `overrides`."""

    def __init__(self, *overrides: str, cwd: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen([sys.executable, "-c", HOLD, *overrides], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
        self.dir = Path(cwd, self.process.stdout.readline().strip())

    def end(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


def test_a_resume_on_a_run_dir_another_process_holds_is_refused(tmp_path):
    run = tmp_path / "run"
    other = OtherRun(f"run.dir={run}", "run.resume=auto", cwd=tmp_path)
    try:
        with pytest.raises(ConfigError, match=rf"run dir {run} is in use by another lmrl run \(pid "
                                              rf"{other.process.pid}\); wait for it to end or choose another run.dir"):
            prepare_run_dir(load_config("adder", [f"run.dir={run}", "run.resume=auto"]))
    finally:
        other.end()
    assert prepare_run_dir(load_config("adder", [f"run.dir={run}", "run.resume=auto"])) == run  # free once it ended
    unlock_run_dir(run)


def test_a_fresh_run_on_an_explicit_dir_another_process_holds_is_refused(tmp_path):
    run = tmp_path / "run"
    other = OtherRun(f"run.dir={run}", cwd=tmp_path)
    try:
        with pytest.raises(ConfigError, match="is in use by another lmrl run"):
            prepare_run_dir(load_config("adder", [f"run.dir={run}"]))
    finally:
        other.end()


def test_a_fresh_run_with_the_default_dir_moves_past_one_another_process_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other = OtherRun("run.name=same", cwd=tmp_path)
    try:
        assert other.dir == tmp_path / "runs" / "same"
        cfg = load_config("adder", ["run.name=same"])
        assert prepare_run_dir(cfg) == Path("runs/same-2")  # nothing written there yet, but it is taken
        unlock_run_dir(Path("runs/same-2"))
    finally:
        other.end()


def test_one_process_may_prepare_its_own_run_dir_again(tmp_path):
    cfg = load_config("adder", [f"run.dir={tmp_path / 'run'}", "run.resume=auto"])
    assert prepare_run_dir(cfg) == prepare_run_dir(cfg)  # e.g. a trainer built again to resume in-process
    unlock_run_dir(tmp_path / "run")
    unlock_run_dir(tmp_path / "run")


def test_a_resumed_trainer_takes_the_lock_and_gives_it_back_when_it_ends(tiny_config, tmp_path):
    from lmrl.train.rl_trainer import RLTrainer

    run = tmp_path / "run"
    cfg = tiny_config("train.steps=1", "sft.steps=1", dir=run)
    other = OtherRun(f"run.dir={run}", "run.resume=auto", cwd=tmp_path)
    try:
        with pytest.raises(ConfigError, match="is in use by another lmrl run"):
            RLTrainer(tiny_config("run.resume=auto", dir=run))
    finally:
        other.end()
    RLTrainer(cfg).train()
    OtherRun(f"run.dir={run}", "run.resume=auto", cwd=tmp_path).end()  # free again: it would fail to start
