"""Where Ray puts the learner and the rollout workers (`lmrl train ... distributed.backend=ray`),
on local clusters that declare GPUs this CPU machine does not have: Ray hands out GPU ids by the
fractions asked for, and the actors, finding no CUDA in torch, run on the CPU. Colocated (learner
0.5 + worker 0.5) shares one GPU id; split (1 + 1) gets two; a request the cluster cannot grant is
refused before anything starts. Each test starts its own cluster (the GPU count differs)."""

from __future__ import annotations

import re

import pytest

ray = pytest.importorskip("ray")

from lmrl.cli import main  # noqa: E402

TINY = ["run.threads=1", "run.progress=false", "run.tensorboard=false", "model.n_layer=1", "model.n_embd=32",
        "model.n_head=2", "train.steps=2", "sft.steps=2", "train.eval_every=2", "eval.size=16"]


@pytest.fixture
def cluster(request):
    ray.init(num_cpus=3, num_gpus=request.param, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _train(run_dir, *overrides) -> int:
    return main(["train", "adder", f"run.dir={run_dir}", "distributed.backend=ray", "rollout.workers=1", *TINY,
                 *overrides])


def _placements(run_dir) -> dict[str, tuple[str, str, str]]:
    """{"learner" | "rollout worker 0": (node, GPU ids, device)} from the run's log."""
    found = re.findall(r"(learner|rollout worker \d+): Ray node (\S+), GPU ids (\S+), device (\w+)",
                       (run_dir / "train.log").read_text())
    return {who: tuple(rest) for who, *rest in found}


def _held(run_dir) -> dict[str, tuple[dict[str, float], str]]:
    """{"learner" | "rollout worker 0": ({resource: amount Ray gave the actor}, its CUDA_VISIBLE_DEVICES)}."""
    found = re.findall(r"(learner|rollout worker \d+): .*, resources (.+), CUDA_VISIBLE_DEVICES (\S+)",
                       (run_dir / "train.log").read_text())
    return {who: ({name: float(amount) for name, amount in re.findall(r"(\w+) ([\d.]+)", held)}, visible)
            for who, held, visible in found}


@pytest.mark.parametrize("cluster", [1], indirect=True)
def test_colocated_learner_and_worker_share_one_gpu(cluster, tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, "distributed.learner_gpus=0.5", "rollout.worker_gpus=0.5") == 0
    where = _placements(run_dir)
    assert where["learner"][:2] == where["rollout worker 0"][:2]  # same node, same GPU id
    assert where["learner"][1] != "none"
    assert where["learner"][2] == where["rollout worker 0"][2] == "cpu"  # the GPU is Ray's, not torch's
    held = _held(run_dir)
    assert held["learner"] == ({"CPU": 1.0, "GPU": 0.5}, where["learner"][1])  # CUDA sees the one GPU Ray gave
    assert held["rollout worker 0"] == ({"CPU": 1.0, "GPU": 0.5}, where["learner"][1])


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_split_learner_and_worker_get_a_gpu_each(cluster, tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, "distributed.learner_gpus=1", "rollout.worker_gpus=1") == 0
    where = _placements(run_dir)
    gpus = {where["learner"][1], where["rollout worker 0"][1]}
    assert len(gpus) == 2 and "none" not in gpus
    held = _held(run_dir)
    for who in ("learner", "rollout worker 0"):  # a whole GPU each, and CUDA in each sees only its own
        assert held[who] == ({"CPU": 1.0, "GPU": 1.0}, where[who][1])
    assert {held["learner"][1], held["rollout worker 0"][1]} == {"0", "1"}


@pytest.mark.parametrize("cluster", [1], indirect=True)
def test_more_gpus_than_the_cluster_has_are_refused_before_anything_starts(cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _train(run_dir, "distributed.learner_gpus=1", "rollout.worker_gpus=1") == 2
    err = capsys.readouterr().err
    assert "ask for 2 GPUs; the Ray cluster has 1" in err
    assert not (run_dir / "checkpoints").exists()
