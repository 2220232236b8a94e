"""The run lifecycle the trainers share (lmrl/train/lifecycle.py), seen through the RL trainer: the
schedule, best-model and early-stopping settings mean the same as in the offline trainers."""

import json

import pytest
import torch

from lmrl import checkpoint as ckpt
from lmrl.common.errors import ConfigError, TrainingError
from lmrl.train.rl_trainer import RLTrainer


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scripted_evaluations(trainer, monkeypatch, values, key="eval/accuracy"):
    """Makes the trainer's evaluations report `values` in turn under `key` (the rest fixed)."""
    values = list(values)

    def evaluate():
        value = values.pop(0)
        return {"eval/accuracy": 0.5, "eval/reward": 0.5, "eval/length_mean": 3.0, key: value}

    monkeypatch.setattr(trainer, "evaluate", evaluate)


def names_unknown_until_evaluated(monkeypatch):
    """Scripted evaluations report names the config cannot tell in advance: the trainer checks
    train.best_metric against the first evaluation instead."""
    monkeypatch.setattr(RLTrainer, "eval_metric_names", lambda self, config: None)


def test_rl_plateau_schedule_uses_the_configured_factor_and_patience(tiny_config, monkeypatch):
    cfg = tiny_config("sft.steps=0", "train.steps=3", "train.eval_every=1", "optim.lr=1e-3",
                      "schedule.name=plateau", "schedule.plateau_factor=0.25", "schedule.plateau_patience=1",
                      "schedule.min_lr_ratio=0.01")
    trainer = RLTrainer(cfg)
    scripted_evaluations(trainer, monkeypatch, [0.5] * 5)  # the start, then every step: never better
    trainer.train()
    lrs = [r["train/lr"] for r in read_metrics(cfg.run_dir) if "train/lr" in r]
    # patience 1: each evaluation without a gain multiplies the lr by 0.25 (the defaults would be 0.5 after 2)
    assert lrs == pytest.approx([1e-3, 2.5e-4, 6.25e-5])


def test_rl_keeps_the_lowest_value_of_a_loss_like_best_metric(tiny_config, monkeypatch):
    names_unknown_until_evaluated(monkeypatch)
    cfg = tiny_config("sft.steps=0", "train.steps=4", "train.eval_every=1", "train.best_metric=eval/loss")
    trainer = RLTrainer(cfg)
    scripted_evaluations(trainer, monkeypatch, [0.9, 0.7, 0.3, 0.8, 0.6], key="eval/loss")
    summary = trainer.train()
    assert summary["best"]["step"] == 2 and summary["best"]["value"] == pytest.approx(0.3)
    saved = json.loads((cfg.run_dir / "checkpoints" / "best" / ckpt.TRAINER_STATE_FILE).read_text())
    assert saved == {"step": 2, "eval/loss": pytest.approx(0.3)}


def test_rl_stops_early_after_patience_evaluations_without_a_gain(tiny_config, monkeypatch):
    cfg = tiny_config("sft.steps=0", "train.steps=10", "train.eval_every=1", "train.patience=2")
    trainer = RLTrainer(cfg)
    scripted_evaluations(trainer, monkeypatch, [0.6, 0.7, 0.7, 0.65, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])
    summary = trainer.train()
    # best 0.7 at step 1; steps 2 and 3 bring no gain: the run ends after step 3
    assert summary["stopped_early"] and summary["steps_done"] == 3
    assert summary["best"] == {"value": 0.7, "step": 1, "accuracy": 0.7}
    assert "early stop at step 3" in (cfg.run_dir / "train.log").read_text()
    assert ckpt.latest_checkpoint(cfg.run_dir / "checkpoints").name == "step_3"


@pytest.mark.parametrize("metric,values,threshold", [
    ("eval/accuracy", [0.5, 0.8, 0.95, 0.97, 0.99], 0.95),  # reached exactly at step 2
    ("eval/loss", [0.9, 0.7, 0.3, 0.2, 0.1], 0.4),          # a loss reaches it from above
])
def test_rl_stops_once_the_best_metric_reaches_the_stopping_threshold(tiny_config, monkeypatch, metric, values,
                                                                       threshold):
    names_unknown_until_evaluated(monkeypatch)
    cfg = tiny_config("sft.steps=0", "train.steps=4", "train.eval_every=1", f"train.best_metric={metric}",
                      f"train.stopping_threshold={threshold}")
    trainer = RLTrainer(cfg)
    scripted_evaluations(trainer, monkeypatch, values, key=metric)
    summary = trainer.train()
    assert summary["stopped_early"] and summary["steps_done"] == 2
    assert summary["best"]["step"] == 2 and summary["best"]["value"] == pytest.approx(values[2])
    assert f"early stop at step 2: {metric} is" in (cfg.run_dir / "train.log").read_text()


def test_an_early_stopped_rl_run_resumed_stays_stopped(tiny_config, monkeypatch):
    cfg = tiny_config("sft.steps=0", "train.steps=6", "train.eval_every=1", "train.patience=1", "train.ckpt_every=1")
    trainer = RLTrainer(cfg)
    scripted_evaluations(trainer, monkeypatch, [0.6, 0.5] + [0.9] * 10)
    assert trainer.train()["steps_done"] == 1
    resumed = RLTrainer(tiny_config("sft.steps=0", "train.steps=6", "train.eval_every=1", "train.patience=1",
                                    "run.resume=auto"))
    scripted_evaluations(resumed, monkeypatch, [0.9] * 10)
    summary = resumed.train()
    assert summary["steps_done"] == 1 and summary["stopped_early"]


def test_run_trainer_choices_are_the_trainers_build_trainer_knows():
    from lmrl.config.schema import TRAINERS as CONFIG_TRAINERS
    from lmrl.train.trainers import TRAINERS

    assert set(CONFIG_TRAINERS) == set(TRAINERS)


def test_resume_from_names_the_checkpoint_another_run_continues_from(tiny_config, tmp_path):
    first = tiny_config("train.ckpt_every=1", "train.keep_checkpoints=0", dir=tmp_path / "a")
    RLTrainer(first).train()
    again = tiny_config("run.resume=auto", f"run.resume_from={tmp_path / 'a' / 'checkpoints' / 'step_6'}",
                        dir=tmp_path / "b")
    RLTrainer(again).train()
    volatile = ("perf/", "time/")
    rows = {d: [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in read_metrics(tmp_path / d)]
            for d in ("a", "b")}
    assert rows["b"][0]["step"] == 7 and rows["b"] == [r for r in rows["a"] if r["step"] > 6]


def test_every_logged_row_carries_the_runs_wall_time_so_far(tiny_config):
    cfg = tiny_config("train.steps=4", "train.log_every=1")
    RLTrainer(cfg).train()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["time/elapsed_s"] for r in rows]
    assert len(elapsed) == len(rows) and elapsed == sorted(elapsed) and elapsed[0] > 0
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert round(elapsed[-1], 2) <= summary["time_s"]["total"]  # the summary rounds to 1/100 s


def test_the_trainers_step_adamw_with_its_fused_kernel_on_a_cpu(tiny_config):
    trainer = RLTrainer(tiny_config("train.steps=1"))
    trainer.train()
    assert isinstance(trainer.optimizer, torch.optim.AdamW) and trainer.optimizer.defaults["fused"]


def test_a_learning_rate_that_blows_up_the_policy_stops_with_one_line_and_checkpoints_intact(tiny_config):
    # optim.lr=1e10: NaN probabilities reached torch.multinomial while sampling, a traceback (issue 45)
    cfg = tiny_config("sft.lr=1e10", "optim.lr=1e10", "train.steps=20")
    with pytest.raises(TrainingError) as raised:
        RLTrainer(cfg).train()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("the policy's outputs became non-finite after step ")
    assert "lower optim.lr (sft.lr for a warm-up)" in message
    ckpt_dir = cfg.run_dir / "checkpoints"
    assert not list(ckpt_dir.glob(".tmp-*"))
    assert all(ckpt.check_checkpoint(path) is None for path in ckpt.list_checkpoints(ckpt_dir))


def test_a_best_metric_the_run_does_not_report_is_refused_before_the_model_loads(tiny_config, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr("lmrl.train.rl_trainer.build_run", no_model)
    cfg = tiny_config("train.best_metric=eval/acuracy")
    with pytest.raises(ConfigError) as raised:
        RLTrainer(cfg)
    assert str(raised.value) == ("train.best_metric='eval/acuracy' is not an eval metric of this run: it reports "
                                 "eval/accuracy, eval/length_mean, eval/reward; did you mean 'eval/accuracy'?")
    assert not cfg.run_dir.exists()


def test_the_eval_metrics_a_task_declares_are_what_its_evaluation_reports(tiny_config):
    trainer = RLTrainer(tiny_config())
    assert set(trainer.evaluate()) == trainer.eval_metric_names(trainer.config)


def test_a_best_metric_missing_from_the_first_evaluation_stops_in_one_line_with_checkpoints_intact(
        tiny_config, monkeypatch):
    names_unknown_until_evaluated(monkeypatch)  # as for a task whose metrics only its evaluation says
    cfg = tiny_config("train.best_metric=eval/bogus")  # warm-up 1-4 (checkpoints 2 and 4), evaluated at 4
    with pytest.raises(ConfigError) as raised:
        RLTrainer(cfg).train()
    message = str(raised.value)
    assert message == (f"train.best_metric='eval/bogus' is not an eval metric of this run: its evaluation after "
                       f"step 4 reports eval/accuracy, eval/length_mean, eval/reward. The checkpoints in "
                       f"{cfg.run_dir / 'checkpoints'} are as they were: set train.best_metric to one of these and "
                       f"continue with --resume")
    ckpt_dir = cfg.run_dir / "checkpoints"
    assert [p.name for p in ckpt.list_checkpoints(ckpt_dir)] == ["step_2"]
    assert ckpt.check_checkpoint(ckpt_dir / "step_2") is None and not list(ckpt_dir.glob(".tmp-*"))


def test_resume_from_a_weights_only_or_damaged_checkpoint_is_one_line(tiny_config, tmp_path, capsys):
    from lmrl.cli.commands import main
    from tests.conftest import TINY_NO_WARMUP

    first = tiny_config("sft.steps=0", "train.steps=2", "train.eval_every=1", "train.ckpt_every=1", dir=tmp_path / "a")
    RLTrainer(first).train()
    capsys.readouterr()
    ckpts = tmp_path / "a" / "checkpoints"
    again = [*TINY_NO_WARMUP, "train.steps=2", f"run.dir={tmp_path / 'b'}"]
    assert main(["train", "adder", *again, "--resume_from_checkpoint", str(ckpts / "best")]) == 1
    assert capsys.readouterr().err == (
        f"lmrl train: error: {ckpts / 'best'} is a weights-only checkpoint (the best evaluation's weights, without "
        f"the optimizer, RNG and trainer state a run resumes from): resume from a step_N checkpoint such as "
        f"{ckpts / 'step_2'}, or start a new run from these weights with model.init_from={ckpts / 'best'}\n")
    (ckpts / "step_1" / "rng.pt").write_bytes(b"")  # damaged: the automatic resume would pass over it
    assert main(["train", "adder", *again, "--resume_from_checkpoint", str(ckpts / "step_1")]) == 1
    rng_size = json.loads((ckpts / "step_1" / "manifest.json").read_text())["files"]["rng.pt"]
    assert capsys.readouterr().err == (f"lmrl train: error: cannot resume from {ckpts / 'step_1'}: rng.pt is empty: "
                                       f"0 bytes, manifest.json lists {rng_size:,}\n")


def test_a_run_of_no_steps_evaluates_the_initial_model_and_says_so(tiny_config):
    # sft.steps=0 train.steps=0: no step at all, and the last line still formats
    cfg = tiny_config("sft.steps=0", "train.steps=0")
    summary = RLTrainer(cfg).train()
    assert summary["warmup_accuracy"] is None and summary["steps_done"] == 0
    last = (cfg.run_dir / "train.log").read_text().strip().splitlines()[-1]
    assert f"held-out accuracy: final {summary['final_accuracy']:.3f} | " in last


def test_a_resume_puts_back_a_best_checkpoint_a_killed_save_had_moved_aside(tiny_config):
    cfg = tiny_config("sft.steps=0", "train.steps=2", "train.eval_every=1")
    RLTrainer(cfg).train()
    ckpts = cfg.run_dir / "checkpoints"
    best = json.loads((ckpts / "best" / ckpt.TRAINER_STATE_FILE).read_text())
    (ckpts / "best").rename(ckpts / ".tmp-best-4242-old")  # killed between write_atomically's two renames
    (ckpts / ".tmp-best-4242").mkdir()
    RLTrainer(tiny_config("sft.steps=0", "train.steps=2", "train.eval_every=1", "run.resume=auto")).train()
    assert json.loads((ckpts / "best" / ckpt.TRAINER_STATE_FILE).read_text()) == best
    assert not list(ckpts.glob(".tmp-*"))
    assert (f"put back {ckpts / 'best'}, which a save killed between its two renames had moved aside"
            in (cfg.run_dir / "train.log").read_text())
