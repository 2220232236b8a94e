"""Each trainer resumes from the newest checkpoint that loads: the RL trainer, the offline (SFT)
trainer and the EpisodeLearner, in process. A finished run's dir is copied as if the run had been
killed after step N with its newest checkpoint damaged; the resumed copy must skip that checkpoint
(moving it aside, not deleting it), say so in train.log, and end as the uninterrupted run did."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from lmrl.common.data import write_jsonl
from lmrl.train.trainers import build_trainer
from tests.test_offline_trainers import _cfg

VOLATILE = ("perf/", "time/")


def stable(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def killed_copy(full, run_dir, keep_steps):
    """`full`'s run dir as a run killed after the last of `keep_steps` would have left it: its
    checkpoints up to there, every metrics row (the resume must drop the later ones itself)."""
    shutil.copytree(full, run_dir, ignore=shutil.ignore_patterns("model", "summary.json"))
    ckpts = run_dir / "checkpoints"
    for path in ckpts.glob("step_*"):
        if int(path.name[5:]) not in keep_steps:
            shutil.rmtree(path)
    return ckpts


def test_the_rl_trainer_resumes_from_the_checkpoint_before_a_damaged_one(tiny_config, tmp_path):
    keep_all = "train.keep_checkpoints=0"
    build_trainer(tiny_config(keep_all, dir=tmp_path / "full")).train()
    ckpts = killed_copy(tmp_path / "full", tmp_path / "run", keep_steps={2, 4, 6, 8})
    (ckpts / "step_8" / "rng.pt").write_bytes(b"not a torch file")
    summary = build_trainer(tiny_config(keep_all, "run.resume=auto", dir=tmp_path / "run")).train()

    assert summary["steps_done"] == 6
    assert stable(tmp_path / "run") == stable(tmp_path / "full")
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"skipped damaged checkpoint {ckpts / 'step_8'}: rng.pt is cut short: 16 bytes" in log
    assert f"resumed from {ckpts / 'step_6'} (step 6)" in log
    assert (ckpts / "damaged-step_8" / "rng.pt").read_bytes() == b"not a torch file"
    final = "checkpoints/step_10/model.safetensors"
    assert (tmp_path / "run" / final).read_bytes() == (tmp_path / "full" / final).read_bytes()


def test_the_rl_trainer_with_no_checkpoint_to_resume_drops_the_killed_attempts_rows(tiny_config, tmp_path):
    build_trainer(tiny_config(dir=tmp_path / "full")).train()
    killed_copy(tmp_path / "full", tmp_path / "run", keep_steps=set())  # killed before step_2 was saved
    build_trainer(tiny_config("run.resume=auto", dir=tmp_path / "run")).train()
    assert stable(tmp_path / "run") == stable(tmp_path / "full")


def test_the_rl_trainer_stops_with_one_line_when_no_checkpoint_loads(tiny_config, tmp_path):
    build_trainer(tiny_config("train.steps=2", dir=tmp_path / "full")).train()
    ckpts = killed_copy(tmp_path / "full", tmp_path / "run", keep_steps={4})
    (ckpts / "step_4" / "trainer_state.json").write_text("{")
    with pytest.raises(Exception, match=rf"^no checkpoint in {ckpts} loads \(step_4: trainer_state.json is not "
                                         rf"valid JSON \(JSONDecodeError: Expecting property name"):
        build_trainer(tiny_config("train.steps=2", "run.resume=auto", dir=tmp_path / "run")).train()
    assert (ckpts / "step_4").is_dir()


@pytest.fixture(scope="module")
def chars(tmp_path_factory):
    root = tmp_path_factory.mktemp("chars")
    write_jsonl(root / "chars.jsonl", [{"prompt": f"{a}{b}=", "response": f"{b}{a}"} for a in range(10)
                                       for b in range(10)])
    return root


def test_the_offline_trainer_resumes_from_the_checkpoint_before_a_damaged_one(chars, tmp_path):
    over = ["data.train_file=" + str(chars / "chars.jsonl"), "data.eval_file=" + str(chars / "chars.jsonl"),
            "data.batch_size=16", "optim.lr=3e-3", "train.max_steps=8", "train.eval_every=4", "train.keep_checkpoints=0"]
    full = build_trainer(_cfg(chars, tmp_path / "full", "sft", *over, hf=False)).train()
    ckpts = killed_copy(tmp_path / "full", tmp_path / "run", keep_steps={2, 4, 6})
    (ckpts / "step_6" / "optimizer.pt").write_bytes(b"")
    resumed = build_trainer(_cfg(chars, tmp_path / "run", "sft", *over, "run.resume=auto", hf=False)).train()

    assert resumed["best"] == full["best"] and resumed["steps_done"] == 8
    assert stable(tmp_path / "run") == stable(tmp_path / "full")
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"skipped damaged checkpoint {ckpts / 'step_6'}: optimizer.pt is empty: 0 bytes" in log
    assert f"resumed from {ckpts / 'step_4'} (step 4)" in log
    assert (ckpts / "damaged-step_6" / "optimizer.pt").stat().st_size == 0


def test_the_episode_learner_resumes_from_the_checkpoint_before_a_damaged_one(tmp_path, caplog):
    pytest.importorskip("peft")
    from lmrl.train.online import EpisodeLearner, EpisodeLearnerConfig
    from tests.test_online_learner import CHAT, _policy, save_tiny_llama

    save_tiny_llama(tmp_path / "model", max_positions=256)
    cfg = EpisodeLearnerConfig(lr=5e-2, batch_episodes=1, run_dir=str(tmp_path / "run"), ckpt_every=1,
                               keep_checkpoints=0)
    learner = EpisodeLearner(_policy(tmp_path / "model"), cfg)
    learner.add_episode(CHAT, 1.0)
    after_one = {n: p.detach().clone() for n, p in learner.policy.named_parameters() if p.requires_grad}
    learner.add_episode(CHAT, 0.0)
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_1", "step_2"]
    model_file = ckpts / "step_2" / "adapter_model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:100])

    logger = logging.getLogger("lmrl.train.online")  # "lmrl" may not propagate to the root (setup_logging)
    logger.addHandler(caplog.handler)
    try:
        again = EpisodeLearner(_policy(tmp_path / "model"), cfg)
    finally:
        logger.removeHandler(caplog.handler)
    assert again.resumed_from == ckpts / "step_1" and again.state["step"] == 1
    assert f"skipped damaged checkpoint {ckpts / 'step_2'}: adapter_model.safetensors is cut short: 100 bytes" in caplog.text
    assert (ckpts / "damaged-step_2" / "adapter_model.safetensors").stat().st_size == 100
    for n, p in again.policy.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, after_one[n]), n
