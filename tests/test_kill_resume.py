"""Kill and resume, end to end: `python -m lmrl train adder` in a child process, SIGKILLed at chosen
points (before the first checkpoint, in the middle of a checkpoint's write, right after one, at
random moments), then started again with `--resume` until it finishes. Its metrics.jsonl must equal
an uninterrupted run's row for row (wall-clock keys perf/* and time/* aside) with no step twice, and
its final weights must be the same bytes. Also: a damaged latest checkpoint is skipped (and kept,
moved aside) and the run resumes from the one before with the same result."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmrl import checkpoint as ckpt
from lmrl.config import load_config
from lmrl.train.run_dir import RunLog

REPO = Path(__file__).resolve().parent.parent

# 16 steps (4 warm-up, 12 RL) in a few seconds on one CPU thread. Checkpoints after steps 2, 4 (the
# warm-up's end), 6, 8, ..., 14 and 16 (the last), two kept; held-out evaluations at 4, 8, 12, 16.
ARGS = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.n_position=16", "task.ndigit=2",
        "task.heldout_size=100", "task.reward=per_digit", "sft.steps=4", "sft.examples=64", "sft.batch_size=16",
        "train.steps=12", "train.rollout_size=16", "train.log_every=1", "train.eval_every=4",
        "train.ckpt_every=2", "train.keep_checkpoints=2", "eval.size=50", "eval.batch_size=50",
        "run.progress=false", "run.tensorboard=false", "run.threads=1"]
LAST_STEP = 16
VOLATILE = ("perf/", "time/")

# Runs the CLI's `python -m lmrl`, after arranging for the process to SIGKILL itself at the point
# that LMRL_TEST_KILL_AT names:
#   row:N    right after metrics.jsonl gets step N's row
#   save:N   while step_N is being written: every file but manifest.json and trainer_state.json is
#            in checkpoints/.tmp-step_N-<pid>/
#   saved:N  right after step_N is renamed into place, before older checkpoints are pruned
# or to send SIGTERM, as a scheduler pre-empting the job does:
#   term:N         to itself, right after metrics.jsonl gets step N's row
#   term-parent:N  to its parent (torchrun's agent, which passes it on to every rank), likewise
BOOT = r"""
import os, runpy, signal, sys

def die():
    os.kill(os.getpid(), signal.SIGKILL)

kind, _, n = os.environ.get("LMRL_TEST_KILL_AT", "").partition(":")
if kind == "row":
    from lmrl.log import sinks
    log = sinks.JsonlSink.log
    def log_then_die(self, step, metrics, **context):
        log(self, step, metrics, **context)
        if step == int(n):
            die()
    sinks.JsonlSink.log = log_then_die
elif kind in ("term", "term-parent"):
    from lmrl.log import sinks
    log = sinks.JsonlSink.log
    def log_then_terminate(self, step, metrics, **context):
        log(self, step, metrics, **context)
        if step == int(n):
            os.kill(os.getpid() if kind == "term" else os.getppid(), signal.SIGTERM)
    sinks.JsonlSink.log = log_then_terminate
elif kind == "save":
    from lmrl import checkpoint as ckpt
    from lmrl.checkpoint import store
    def write_model_then_die(tmp, model, state_json):
        if tmp.name.startswith(f".tmp-step_{n}-"):
            ckpt.save_weights_file(model, tmp / ckpt.MODEL_FILE)
            die()
        write(tmp, model, state_json)
    write, store._write_model_and_state = store._write_model_and_state, write_model_then_die
elif kind == "saved":
    from lmrl.checkpoint import store
    def write_then_die(final, write_files):
        path = write_atomically(final, write_files)
        if final.name == f"step_{n}":
            die()
        return path
    write_atomically, store.write_atomically = store.write_atomically, write_then_die
elif kind:
    raise SystemExit(f"LMRL_TEST_KILL_AT={kind}:{n}?")
sys.argv = ["lmrl", *sys.argv[1:]]
runpy.run_module("lmrl", run_name="__main__", alter_sys=True)
"""


def start(run_dir: Path, *, resume: bool, kill_at: str = "") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), LMRL_TEST_KILL_AT=kill_at)
    cmd = [sys.executable, "-c", BOOT, "train", "adder", *ARGS, f"run.dir={run_dir}"] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, env=env, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stable(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in rows(run_dir)]


def state_of(run_dir: Path) -> str:
    """Where a killed attempt stopped: its last metrics row and what checkpoints/ holds (a save's
    unfinished temporary dir shown as .tmp-step_<N>)."""
    steps = [r["step"] for r in rows(run_dir)] if (run_dir / "metrics.jsonl").exists() else []
    ckpt_dir = run_dir / "checkpoints"
    names = sorted(p.name.rsplit("-", 1)[0] if p.name.startswith(".tmp-") else p.name
                   for p in ckpt_dir.iterdir()) if ckpt_dir.is_dir() else []
    return f"rows up to step {steps[-1] if steps else None} ({len(steps)}), checkpoints {names}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    code, out = finish(start(run_dir, resume=False))
    assert code == 0, out
    assert [r["step"] for r in rows(run_dir)] == list(range(1, LAST_STEP + 1))
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    steps = [r["step"] for r in rows(run_dir)]
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    assert stable(run_dir) == stable(reference)
    summary, expected = (json.loads((d / "summary.json").read_text()) for d in (run_dir, reference))
    assert {k: v for k, v in summary.items() if k != "time_s"} == {k: v for k, v in expected.items() if k != "time_s"}
    final = f"checkpoints/step_{LAST_STEP}/model.safetensors"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()


def run_with_kills(run_dir: Path, kills: list[str], *, first_resume: bool = False) -> list[str]:
    """Start the run, let it SIGKILL itself at each of `kills` in turn (each attempt after the first
    with --resume), then resume it once more to the end. Returns where each kill left the run."""
    states = []
    for i, kill_at in enumerate(kills):
        code, out = finish(start(run_dir, resume=first_resume or i > 0, kill_at=kill_at))
        assert code == -signal.SIGKILL, f"the attempt to be killed at {kill_at} ended with {code}:\n{out}"
        states.append(f"{kill_at}: {state_of(run_dir)}")
    code, out = finish(start(run_dir, resume=True))
    assert code == 0, f"after kills {states}:\n{out}"
    print(*states, sep="\n")
    return states


@pytest.mark.slow
def test_killed_before_the_first_checkpoint_resumes_without_a_duplicate_row(tmp_path, reference):
    """Issue 8: killed after step 1's row, before the first checkpoint (step 2): the resume starts from
    step 0 and must drop the killed attempt's rows rather than write step 1 again."""
    run_dir = tmp_path / "run"
    states = run_with_kills(run_dir, ["row:1"])
    assert states == ["row:1: rows up to step 1 (1), checkpoints []"]
    assert_same_run(run_dir, reference)


@pytest.mark.slow
def test_a_fresh_run_dir_with_resume_starts_from_step_0(tmp_path, reference):
    run_dir = tmp_path / "run"
    states = run_with_kills(run_dir, ["row:1"], first_resume=True)
    assert states == ["row:1: rows up to step 1 (1), checkpoints []"]
    assert_same_run(run_dir, reference)


@pytest.mark.slow
def test_killed_at_chosen_points_resumes_exactly(tmp_path, reference):
    run_dir = tmp_path / "run"
    states = run_with_kills(run_dir, [
        "save:2",  # writing the first checkpoint: nothing to resume from yet
        "row:3",  # after step_2
        "saved:4",  # the warm-up's boundary checkpoint just in place, before pruning
        "save:8",  # writing an RL checkpoint: resumes from step_6
        "row:9",  # an RL step after an evaluation
        "save:16",  # writing the last checkpoint
    ])
    assert [s.split(": ", 1)[1] for s in states] == [
        "rows up to step 2 (2), checkpoints ['.tmp-step_2']",
        "rows up to step 3 (3), checkpoints ['step_2']",
        "rows up to step 4 (4), checkpoints ['best', 'step_2', 'step_4']",
        "rows up to step 8 (8), checkpoints ['.tmp-step_8', 'best', 'step_4', 'step_6']",
        "rows up to step 9 (9), checkpoints ['best', 'step_6', 'step_8']",
        "rows up to step 16 (16), checkpoints ['.tmp-step_16', 'best', 'step_12', 'step_14']",
    ]
    assert_same_run(run_dir, reference)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.slow
def test_killed_at_random_moments_resumes_exactly(tmp_path, reference):
    """SIGKILL from outside at random moments: when metrics.jsonl reaches a random row count, or when
    a new checkpoint temporary dir appears (a save in progress), whichever the attempt's draw picks
    (seeded; LMRL_TEST_SEED=<n> repeats a draw). Where each kill landed is printed."""
    seed = int(os.environ.get("LMRL_TEST_SEED", random.randrange(10**6)))
    print(f"LMRL_TEST_SEED={seed}")
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    ckpts, metrics = run_dir / "checkpoints", run_dir / "metrics.jsonl"
    states = []
    for attempt in range(4):
        done = len(rows(run_dir)) if metrics.exists() else 0
        # a row count past what earlier attempts wrote, or (always possible) the next save
        target = rng.choice(["tmp"] + ([rng.randint(done + 1, LAST_STEP)] if done < LAST_STEP else []))
        # a killed save's temporary dir stays until the next save: only one made by this attempt counts
        old = set(ckpts.iterdir()) if ckpts.is_dir() else set()
        proc = start(run_dir, resume=attempt > 0)
        while proc.poll() is None:
            if target == "tmp":
                hit = ckpts.is_dir() and any(p.name.startswith(".tmp-") for p in set(ckpts.iterdir()) - old)
            else:
                hit = metrics.exists() and metrics.read_text().count("\n") >= target
            if hit:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.0005)
        code, out = finish(proc)
        states.append(f"{target}: {code} {state_of(run_dir)}")
        if code == 0:  # finished before the kill
            break
        assert code == -signal.SIGKILL, out
    else:
        code, out = finish(start(run_dir, resume=True))
        assert code == 0, f"seed {seed}, {states}:\n{out}"
    print(*states, sep="\n")
    assert_same_run(run_dir, reference)


@pytest.mark.slow
@pytest.mark.parametrize("name, how", [("model.safetensors", "truncated"), ("optimizer.pt", "empty"),
                                       ("rng.pt", "garbage"), ("trainer_state.json", "garbage")])
def test_a_damaged_latest_checkpoint_is_skipped_kept_and_the_run_resumes_from_the_one_before(tmp_path, reference,
                                                                                            name, how):
    run_dir = tmp_path / "run"
    code, out = finish(start(run_dir, resume=False, kill_at="row:11"))
    assert code == -signal.SIGKILL, out
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "step_10", "step_8"]
    file = ckpts / "step_10" / name
    data = file.read_bytes()
    damaged = {"truncated": data[: len(data) // 2], "empty": b"", "garbage": random.Random(0).randbytes(len(data))}[how]
    file.write_bytes(damaged)

    code, out = finish(start(run_dir, resume=True))
    assert code == 0, out
    log = (run_dir / "train.log").read_text()
    assert f"skipped damaged checkpoint {ckpts / 'step_10'}: {name} " in log
    assert "moved to damaged-step_10 (not deleted); resuming from step_8" in log
    assert f"resumed from {ckpts / 'step_8'} (step 8)" in log
    assert (ckpts / "damaged-step_10" / name).read_bytes() == damaged
    assert_same_run(run_dir, reference)


@pytest.mark.slow
def test_every_checkpoint_damaged_stops_the_resume_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    code, out = finish(start(run_dir, resume=False, kill_at="row:5"))
    assert code == -signal.SIGKILL, out
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "step_2", "step_4"]
    (ckpts / "step_4" / "model.safetensors").unlink()
    (ckpts / "step_2" / "rng.pt").write_bytes(b"")
    code, out = finish(start(run_dir, resume=True))
    assert code == 1
    assert out.strip().splitlines()[-1] == (
        f"lmrl train: error: no checkpoint in {ckpts} loads (step_4: model.safetensors is missing (manifest.json "
        f"lists it, {os.path.getsize(ckpts / 'step_2' / 'model.safetensors'):,} bytes); step_2: rng.pt is empty: "
        f"0 bytes, manifest.json lists {_rng_size(ckpts)}); repair one, or move them out of {ckpts} to start again "
        f"from step 0")
    assert "Traceback" not in out
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "step_2", "step_4"]


def _rng_size(ckpts: Path) -> str:
    return f"{json.loads((ckpts / 'step_2' / 'manifest.json').read_text())['files']['rng.pt']:,}"


# --- SIGTERM (a scheduler's pre-emption, `timeout`, Kubernetes) handled as Ctrl-C ----------------

def test_sigterm_finishes_the_step_saves_a_checkpoint_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    code, out = finish(start(run_dir, resume=False, kill_at="term:9"))
    assert code == 128 + signal.SIGTERM, out
    assert "stop requested (SIGTERM): finishing this step, then saving a checkpoint" in out
    assert out.strip().splitlines()[-1].endswith("interrupted: checkpoint saved at step 9; continue with --resume")
    ckpts = run_dir / "checkpoints"
    assert ckpt_names(ckpts) == ["best", "step_8", "step_9"] and ckpt.check_checkpoint(ckpts / "step_9") is None
    assert ckpt.holds_optimizer(ckpts / "step_9")  # a step within RL: everything an exact resume reads


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_resumes_exactly(tmp_path, reference):
    run_dir = tmp_path / "run"
    code, out = finish(start(run_dir, resume=False, kill_at="term:11"))
    assert code == 128 + signal.SIGTERM, out
    code, out = finish(start(run_dir, resume=True))
    assert code == 0, out
    assert_same_run(run_dir, reference)


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_every_rank_after_the_same_step_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), LMRL_TEST_KILL_AT="term-parent:7")
    boot = tmp_path / "boot.py"
    boot.write_text(BOOT)
    ddp = ["sft.batch_size=32", "train.rollout_size=32", f"run.dir={run_dir}"]
    # torchrun's grace before SIGKILL is 30 s by default; a loaded CI host can take longer to finish a step and save
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--shutdown_timeout=120",
           str(boot), "train", "adder", *ARGS, *ddp]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0  # torchrun itself ends as terminated
    assert "forcefully exiting via" not in proc.stderr, "torchrun killed a rank before it saved"
    log = (run_dir / "train.log").read_text()
    assert "stop requested (SIGTERM)" in log, proc.stderr[-3000:]
    # the signal travels through torchrun's agent: the ranks stop after step 7 or a step later, together
    saved = re.search(r"interrupted: checkpoint saved at step (\d+); continue with --resume", log)
    assert saved and int(saved[1]) in (7, 8), log
    # torchrun prints its own SignalException's traceback; no rank printed one
    assert str(REPO / "lmrl") not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr[-3000:]
    ckpts, step = run_dir / "checkpoints", int(saved[1])
    assert ckpt.latest_checkpoint(ckpts).name == f"step_{step}" and ckpt.check_checkpoint(ckpts / f"step_{step}") is None
    env["LMRL_TEST_KILL_AT"] = ""
    proc = subprocess.run(cmd + ["--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {ckpts / f'step_{step}'} (step {step})" in (run_dir / "train.log").read_text()
    assert [r["step"] for r in rows(run_dir)] == list(range(1, LAST_STEP + 1))


def ckpt_names(ckpts: Path) -> list[str]:
    return sorted(p.name for p in ckpts.iterdir())


# --- metrics.jsonl on resume (in process, fast) -----------------------------------------------

def write_rows(path: Path, steps) -> None:
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in steps))


def test_runlog_resuming_from_no_checkpoint_drops_every_row_of_the_killed_attempt(tmp_path):
    cfg = load_config("adder", ARGS + [f"run.dir={tmp_path}", "run.resume=auto"])
    write_rows(tmp_path / "metrics.jsonl", [0, 1, 2])
    log = RunLog(tmp_path, cfg, total_steps=LAST_STEP, resume_step=None)
    log.log(1, {"x": 1.0})
    log.close()
    assert [r["step"] for r in rows(tmp_path)] == [1]


def test_runlog_resuming_from_a_checkpoint_keeps_the_rows_up_to_its_step(tmp_path):
    cfg = load_config("adder", ARGS + [f"run.dir={tmp_path}", "run.resume=auto"])
    write_rows(tmp_path / "metrics.jsonl", [1, 2, 3, 4, 5])
    log = RunLog(tmp_path, cfg, total_steps=LAST_STEP, resume_step=4)
    log.log(5, {"x": 5.0})
    log.close()
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4, 5]


def test_runlog_in_a_fresh_run_dir_creates_metrics(tmp_path):
    cfg = load_config("adder", ARGS + [f"run.dir={tmp_path / 'new'}", "run.resume=auto"])
    (tmp_path / "new").mkdir()
    log = RunLog(tmp_path / "new", cfg, total_steps=LAST_STEP, resume_step=None)
    log.log(1, {"x": 1.0})
    log.close()
    assert [r["step"] for r in rows(tmp_path / "new")] == [1]
