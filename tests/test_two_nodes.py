"""Two machines simulated on one, and a worker lost mid-run (all `slow`: each starts real clusters).

Ray: a head node and a worker node started as separate `ray start --block` processes (their own
temp dir; token authentication off, RAY_AUTH_MODE=disabled, as on a private network), the run
launched by the CLI against the head's address. The head declares one (fake) GPU and one CPU, so
the learner (`distributed.learner_gpus=1`) can only go there and both rollout workers only to the
worker node. A rollout worker's process killed there is replaced and the run finishes; the worker
node's processes all killed at once (a machine lost) after a third node has joined: both workers are
replaced there and the run finishes. (docs/architecture.md, "Ray".)

torchrun: two nodes over localhost (`--nnodes=2`, c10d rendezvous on 127.0.0.1, one rank each,
gloo), rank 1's process killed mid-run. Without restarts both nodes stop, the checkpoints written so
far are intact, and the same two commands with `--resume` finish the run; with `--max-restarts=1` and
`--resume` from the start, torchrun restarts every rank, which resume from the newest checkpoint and
finish without a second launch (with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, see torchrun_nodes).
(docs/architecture.md, "DDP".)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"
TINY = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.n_position=16", "task.ndigit=2",
        "task.heldout_size=100", "task.reward=per_digit", "sft.steps=4", "sft.examples=64", "sft.batch_size=16",
        "train.rollout_size=16", "train.log_every=1", "train.eval_every=10", "train.ckpt_every=4",
        "train.stopping_threshold=null", "eval.size=32", "eval.batch_size=32", "run.mixed_precision=",
        "run.progress=false", "run.tensorboard=false", "run.threads=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition, timeout: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for p in procs:
            assert p.poll() is None, f"{what}: a process ended first ({p.args[:3]} exit {p.returncode})"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        time.sleep(0.2)


def stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """Ends a process this test started (its own session: it and what it started)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- Ray: a head and worker nodes ------------------------------------------------------------------
class RayCluster:
    def __init__(self):
        # a short path of its own: Ray's socket paths must stay under 108 bytes
        self.port, self.temp = free_port(), Path(tempfile.mkdtemp(prefix="lmrl-ray-", dir="/tmp"))
        self.env = dict(os.environ, RAY_AUTH_MODE="disabled")  # Ray 2.5x turns token authentication on
        self.nodes: list[subprocess.Popen] = []

    def start_node(self, *args: str) -> subprocess.Popen:
        """A `ray start --block` node process; returns once it says it is up (joined the cluster)."""
        log = self.temp / f"node{len(self.nodes)}.log"
        where = [f"--port={self.port}", "--head", "--include-dashboard=false"] if not self.nodes else \
            [f"--address=127.0.0.1:{self.port}"]
        proc = subprocess.Popen([str(RAY), "start", "--block", *where, f"--temp-dir={self.temp}",
                                 "--node-ip-address=127.0.0.1", "--object-store-memory=100000000",
                                 "--disable-usage-stats", *args], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                env=self.env, start_new_session=True)
        self.nodes.append(proc)
        wait_for(lambda: "Ray runtime started" in log.read_text(), 90, f"ray node {len(self.nodes) - 1}", [proc])
        return proc

    def train(self, run_dir: Path, *overrides: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "lmrl", "train", "adder", *TINY, f"run.dir={run_dir}", "distributed.backend=ray",
               f"distributed.address=127.0.0.1:{self.port}", "rollout.workers=2", "distributed.learner_gpus=1",
               "rollout.worker_cpus=1", "distributed.learner_cpus=1", *overrides]
        return subprocess.Popen(cmd, cwd=run_dir.parent, env=dict(self.env, PYTHONPATH=str(REPO)),
                                stdout=open(run_dir.parent / "train.out", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def close(self) -> None:
        for proc in reversed(self.nodes):
            stop(proc, grace=3)  # a Ray node drains for up to 30 s on SIGTERM: nothing here needs it
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def ray_cluster():
    cluster = RayCluster()
    cluster.start_node("--num-cpus=1", "--num-gpus=1")  # the head: room for the learner only
    yield cluster
    cluster.close()


def placements(run_dir: Path) -> dict[str, tuple[str, int]]:
    """{"learner" | "rollout worker i": (node id prefix, pid)} from the run's log."""
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
    return {who: (node, int(pid)) for who, node, pid in
            re.findall(r"(learner|rollout worker \d+): Ray node (\S+), .*?, pid (\d+),", log)}


def finished(proc: subprocess.Popen, run_dir: Path, timeout: float = 240) -> dict:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        code = None
    out = (run_dir.parent / "train.out").read_text()
    assert code == 0, f"exit {code}:\n{out[-4000:]}"
    return json.loads((run_dir / "summary.json").read_text())


def test_ray_rollout_worker_killed_on_the_worker_node_is_replaced_and_the_run_finishes(ray_cluster, tmp_path):
    ray_cluster.start_node("--num-cpus=2")  # the worker node: both rollout workers go here
    run_dir = tmp_path / "run"
    proc = ray_cluster.train(run_dir, "train.steps=40", "rollout.max_restarts=1")
    wait_for(lambda: len(rows(run_dir)) >= 8 and "rollout worker 1" in placements(run_dir), 180, "RL under way",
             [proc])
    where = placements(run_dir)
    assert where["rollout worker 0"][0] == where["rollout worker 1"][0] != where["learner"][0]
    os.kill(where["rollout worker 0"][1], signal.SIGKILL)  # a process of the worker node's, started for this test
    summary = finished(proc, run_dir)
    assert summary["rl_steps"] == 40
    assert "rollout worker 0 failed" in (run_dir / "train.log").read_text()
    steps = [r["step"] for r in rows(run_dir)]
    assert steps == list(range(1, 45))


def test_ray_worker_node_lost_mid_run_its_workers_move_to_another_node_and_the_run_finishes(ray_cluster, tmp_path):
    lost = ray_cluster.start_node("--num-cpus=2")
    run_dir = tmp_path / "run"
    proc = ray_cluster.train(run_dir, "train.steps=250", "rollout.max_restarts=1")
    wait_for(lambda: len(rows(run_dir)) >= 8 and "rollout worker 1" in placements(run_dir), 180, "RL under way",
             [proc])
    ray_cluster.start_node("--num-cpus=2")  # a machine joins, then the first worker machine goes, all at once
    os.killpg(lost.pid, signal.SIGKILL)  # the node's processes: its `ray start`, raylet and rollout workers
    lost.wait()
    at = len(rows(run_dir))
    summary = finished(proc, run_dir)
    assert summary["rl_steps"] == 250 and at < 4 + 250
    log = (run_dir / "train.log").read_text()
    assert "rollout worker 0 failed" in log and "rollout worker 1 failed" in log


# -- torchrun: two nodes over localhost --------------------------------------------------------------
# Each rank's process writes its pid to pids/rank<RANK>-attempt<restart count>, then runs the CLI.
BOOT = """
import faulthandler, os, runpy, sys
from pathlib import Path
faulthandler.dump_traceback_later(90)  # a rank still running after 90 s prints where it is (the run takes ~20 s)
pids = Path(os.environ["LMRL_TEST_PIDS"])
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
(pids / f"rank{os.environ['RANK']}-attempt{attempt}").write_text(str(os.getpid()))
sys.argv = ["lmrl", *sys.argv[1:]]
runpy.run_module("lmrl", run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def rendezvous_store():
    """The c10d rendezvous store in a process of its own (as on a cluster, where it is a third party):
    hosted inside one agent, it goes when that agent exits, and the other agent's shutdown then fails."""
    port = free_port()
    code = ("import time, torch.distributed as d\n"
            f"store = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False)\n"
            "time.sleep(3600)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    wait_for(lambda: _listening(port), 60, "the rendezvous store", [proc])
    yield port
    stop(proc, grace=3)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def torchrun_nodes(tmp_path: Path, run_dir: Path, port: int, *args: str, restarts: int = 0) -> list[subprocess.Popen]:
    """Two torchrun agents (two "nodes", one rank each) meeting at the rendezvous store on 127.0.0.1:port."""
    boot, pids = tmp_path / "boot.py", tmp_path / "pids"
    boot.write_text(BOOT)
    pids.mkdir(exist_ok=True)
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: each attempt's rank 0 hosts a fresh store for the process group.
    # The store torchrun shares with the workers by default outlives a restart, and the ranks of the node
    # that did not fail then read the dead ranks' addresses from the attempt before (refused, or a hang).
    env = dict(os.environ, PYTHONPATH=str(REPO), LMRL_TEST_PIDS=str(pids), OMP_NUM_THREADS="1",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    launch = len(list(tmp_path.glob("node*.out"))) // 2  # a fresh rendezvous id for each launch
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=lmrl-{launch}", "--rdzv_conf=is_host=false",
           f"--max-restarts={restarts}", "--monitor-interval=0.5", str(boot), "train", "adder", *TINY,
           f"run.dir={run_dir}", "run.device=cpu", *args]
    return [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=open(tmp_path / f"node{i}-{launch}.out", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True) for i in range(2)]


def wait_all(procs: list[subprocess.Popen], tmp_path: Path, timeout: float = 240) -> list[int | None]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            stop(p)
            codes.append(None)
    return codes


def outputs(tmp_path: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(tmp_path.glob("node*.out")))


def kill_rank_1_when(tmp_path: Path, run_dir: Path, procs, steps: int) -> None:
    pid_file = tmp_path / "pids" / "rank1-attempt0"
    wait_for(lambda: len(rows(run_dir)) >= steps and pid_file.exists(), 180, "RL under way", procs)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # rank 1's process, started by this test's torchrun


def test_torchrun_two_nodes_rank_killed_stops_with_checkpoints_intact_and_resume_finishes(tmp_path,
                                                                                           rendezvous_store):
    from lmrl import checkpoint as ckpt

    run_dir = tmp_path / "run"
    procs = torchrun_nodes(tmp_path, run_dir, rendezvous_store, "train.steps=40")
    kill_rank_1_when(tmp_path, run_dir, procs, steps=12)
    codes = wait_all(procs, tmp_path, timeout=120)
    assert all(c not in (0, None) for c in codes), f"both nodes should stop: {codes}\n{outputs(tmp_path)}"
    stopped_at = len(rows(run_dir))
    assert stopped_at < 4 + 40
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and int(latest.name.split("_")[1]) >= 8
    assert ckpt.check_checkpoint(latest) is None  # every file the manifest lists is there and loads

    procs = torchrun_nodes(tmp_path, run_dir, rendezvous_store, "train.steps=40", "--resume")
    codes = wait_all(procs, tmp_path)
    assert codes == [0, 0], outputs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rl_steps"] == 40
    steps = [r["step"] for r in rows(run_dir)]
    assert steps == list(range(1, 45)), "a resumed run keeps one row per step"
    assert f"resumed from {latest}" in (run_dir / "train.log").read_text()


def test_torchrun_two_nodes_with_max_restarts_restart_every_rank_and_the_run_goes_on(tmp_path, rendezvous_store):
    run_dir = tmp_path / "run"
    procs = torchrun_nodes(tmp_path, run_dir, rendezvous_store, "train.steps=40", "--resume", restarts=1)
    kill_rank_1_when(tmp_path, run_dir, procs, steps=12)
    codes = wait_all(procs, tmp_path)
    assert codes == [0, 0], outputs(tmp_path)
    # the failed node counts a restart (its rank starts again as attempt 1); the other node re-joins the new
    # rendezvous round without counting one, so its new rank writes attempt 0 again
    assert (tmp_path / "pids" / "rank1-attempt1").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rl_steps"] == 40
    assert [r["step"] for r in rows(run_dir)] == list(range(1, 45))
    assert "resumed from" in (run_dir / "train.log").read_text()
