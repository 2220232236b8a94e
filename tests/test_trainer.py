"""The trainer end to end on a tiny model: what a run writes, the warm-up's label budget, RL's
label-free reward, non-finite losses, failing reward functions, and the run dir's guards."""

import json
import math

import pytest
import torch

from lmrl.config import ConfigError
from lmrl import checkpoint as ckpt
from lmrl.algos import reinforce as reinforce_algo
from lmrl.train.rl_trainer import RLTrainer, TrainingError
from lmrl.tasks.rewards import RewardError


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_writes_config_metrics_log_checkpoints_and_summary(tiny_config):
    cfg = tiny_config("run.tensorboard=true")
    summary = RLTrainer(cfg).train()
    run = cfg.run_dir
    for name in ["config.yaml", "metrics.jsonl", "train.log", "summary.json"]:
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert ckpt.latest_checkpoint(run / "checkpoints").name == "step_10"  # 4 warm-up + 6 RL steps
    assert (run / "checkpoints" / "best" / ckpt.MODEL_FILE).is_file()

    rows = read_metrics(run)
    assert [r["step"] for r in rows] == sorted({r["step"] for r in rows})
    rl = [r for r in rows if "train/policy_loss" in r]
    assert [r["step"] for r in rl] == [5, 6, 7, 8, 9, 10]
    for key in ["train/accuracy", "train/avg_reward", "train/baseline", "train/lr", "perf/tokens_per_s"]:
        assert all(math.isfinite(r[key]) for r in rl), key
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [4, 7, 10]

    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["sft_examples"] == 40 and on_disk["sft_steps"] == 4 and on_disk["rl_steps"] == 6
    assert 0 <= on_disk["warmup_accuracy"] <= 1 and 0 <= on_disk["final_accuracy"] <= 1
    assert on_disk["rl_gain"] == pytest.approx(on_disk["final_accuracy"] - on_disk["warmup_accuracy"])
    times = on_disk["time_s"]
    assert set(times) == {"sft", "rl", "eval", "total"}
    assert times["total"] >= times["sft"] + times["rl"] + times["eval"] > 0
    assert "[rl] Step 6/6 | Loss:" in (run / "train.log").read_text()


def test_the_baseline_in_metrics_follows_the_moving_average(tiny_config):
    cfg = tiny_config("task.reward=digits")
    RLTrainer(cfg).train()
    rl = [r for r in read_metrics(cfg.run_dir) if "train/baseline" in r]
    b = rl[0]["train/avg_reward"]
    assert rl[0]["train/baseline"] == pytest.approx(b)
    for r in rl[1:]:
        b = 0.9 * b + 0.1 * r["train/avg_reward"]
        assert r["train/baseline"] == pytest.approx(b)


def test_token_rewards_keep_one_baseline_per_answer_position(tiny_config):
    cfg = tiny_config("train.steps=2")
    trainer = RLTrainer(cfg)
    trainer.train()
    rl = [r for r in read_metrics(cfg.run_dir) if "train/baseline" in r]
    baseline = trainer.state["algo"]["baseline"]
    assert isinstance(baseline, list) and len(baseline) == trainer.task.answer_len
    assert rl[-1]["train/baseline"] == pytest.approx(sum(baseline) / len(baseline))
    assert rl[0]["train/baseline"] == pytest.approx(rl[0]["train/avg_reward"])  # starts at the first batch mean


def test_warmup_sees_at_most_its_label_budget_and_rl_never_reads_a_label(tiny_config, monkeypatch):
    cfg = tiny_config("sft.examples=25", "sft.batch_size=64")
    trainer = RLTrainer(cfg)
    task = trainer.task
    seen = []
    real_labeled = task.labeled
    monkeypatch.setattr(task, "labeled", lambda ids: seen.append(ids.clone()) or real_labeled(ids))
    run_rl = trainer.reinforce

    def rl_without_labels(stage):
        def refuse(*args):
            raise AssertionError("RL read a label")
        monkeypatch.setattr(task, "labeled", refuse)
        monkeypatch.setattr(task, "target", refuse)  # not even through the verifier
        run_rl(stage)

    monkeypatch.setattr(trainer, "reinforce", rl_without_labels)
    monkeypatch.setattr(task, "score_batch", _verifier_without_target(task))
    trainer.train()
    labeled_ids = torch.cat(seen)
    assert len(seen) == 1 and len(labeled_ids) == len(labeled_ids.unique()) == 25
    assert not torch.isin(labeled_ids, task.heldout_ids).any()


def _verifier_without_target(task):
    """The task's verifier recomputed from the prompt text alone, so RL can run with target() gone."""

    def score_batch(prompts, completions):
        exact = []
        for p, c in zip(prompts, completions):
            a, b = task.operands(task.tokenizer.decode(p))
            answer = f"{task.result(a, b):0{task.answer_len}d}"[::-1]
            exact.append(float(task.tokenizer.decode(c) == answer))
        return torch.tensor(exact), torch.tensor(exact)

    return score_batch


def test_a_user_reward_function_replaces_the_verifier_reward(tiny_config):
    cfg = tiny_config()
    calls = []

    def length_reward(prompts, completions):
        calls.append((list(prompts), list(completions)))
        return [0.25] * len(prompts)

    RLTrainer(cfg, reward_fn=length_reward).train()
    assert len(calls) == cfg.train.steps and all(len(p) == 16 for p, _ in calls)
    assert calls[0][0][0].endswith("=")  # prompts arrive as text
    rl = [r for r in read_metrics(cfg.run_dir) if "train/avg_reward" in r]
    assert all(r["train/avg_reward"] == 0.25 for r in rl)


def test_a_nan_loss_skips_the_update_and_is_counted(tiny_config, monkeypatch):
    cfg = tiny_config("train.steps=3", "train.eval_every=100", "train.ckpt_every=100")
    trainer = RLTrainer(cfg)
    real_loss = reinforce_algo.reinforce_loss
    calls = {"n": 0}
    before = {}

    def nan_on_second(*args, **kwargs):
        calls["n"] += 1
        loss = real_loss(*args, **kwargs)
        if calls["n"] == 2:
            before.update({k: v.clone() for k, v in trainer.model.state_dict().items()})
            return loss * float("nan")
        return loss

    monkeypatch.setattr(reinforce_algo, "reinforce_loss", nan_on_second)
    real_end = trainer.end_step

    def end_step(stage, metrics, *a, **k):
        if calls["n"] == 2 and before:  # right after the NaN step: the weights did not move
            after = trainer.model.state_dict()
            assert all(torch.equal(before[k], after[k]) for k in before)
            before.clear()
        real_end(stage, metrics, *a, **k)

    monkeypatch.setattr(trainer, "end_step", end_step)
    trainer.train()
    rl = [r for r in read_metrics(cfg.run_dir) if "train/nonfinite_skipped" in r]
    assert [r["train/nonfinite_skipped"] for r in rl] == [0, 1, 1]
    assert json.loads((cfg.run_dir / "summary.json").read_text())["nonfinite_skipped"] == 1


def test_repeated_nan_losses_stop_the_run_with_the_last_checkpoint_intact(tiny_config, monkeypatch):
    cfg = tiny_config("train.max_nonfinite=3")
    calls = {"n": 0}
    real_loss = reinforce_algo.reinforce_loss

    def nan_after_two(*args, **kwargs):
        calls["n"] += 1
        loss = real_loss(*args, **kwargs)
        return loss * float("nan") if calls["n"] > 2 else loss

    monkeypatch.setattr(reinforce_algo, "reinforce_loss", nan_after_two)
    with pytest.raises(TrainingError) as raised:
        RLTrainer(cfg).train()
    latest = ckpt.latest_checkpoint(cfg.run_dir / "checkpoints")
    assert latest.name == "step_6"  # warm-up 4 + 2 good RL steps
    assert str(raised.value) == (f"3 non-finite losses in a row at step 9; stopped. The last step checkpoint, saved "
                                 f"before these skipped updates, is {latest}: lower the learning rate and continue "
                                 f"from it with --resume")
    model = RLTrainer(tiny_config("run.resume=auto", dir=cfg.run_dir)).model
    state = ckpt.load_checkpoint(latest, model=model, restore_rng=False)
    assert state["step"] == 6 and all(torch.isfinite(p).all() for p in model.parameters())


# every optimizer step is skipped (non-finite losses), while the schedule still steps: torch says so
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")
def test_non_finite_losses_before_any_step_checkpoint_say_there_is_none(tiny_config, monkeypatch):
    # a checkpoints dir holding only best/ has nothing --resume could start from
    cfg = tiny_config("sft.steps=0", "train.max_nonfinite=2")
    real_loss = reinforce_algo.reinforce_loss
    monkeypatch.setattr(reinforce_algo, "reinforce_loss", lambda *a, **k: real_loss(*a, **k) * float("nan"))
    with pytest.raises(TrainingError) as raised:
        RLTrainer(cfg).train()
    ckpts = cfg.run_dir / "checkpoints"
    assert ckpt.latest_checkpoint(ckpts) is None and (ckpts / "best").is_dir()  # the start's evaluation, step 0
    assert str(raised.value) == (f"2 non-finite losses in a row at step 2; stopped. No step checkpoint was saved before "
                                 f"them ({ckpts} holds none, so --resume would start from step 0): lower the learning "
                                 f"rate and train again; {ckpts / 'best'} holds step 0's weights only (its best "
                                 f"evaluation), which model.init_from={ckpts / 'best'} starts a new run from")


def test_a_reward_function_that_raises_names_itself_and_the_sample(tiny_config):
    cfg = tiny_config()

    def broken(prompts, completions):
        raise KeyError("oops")

    with pytest.raises(RewardError, match=r"reward function .*broken raised KeyError: 'oops' \(first sample: prompt"):
        RLTrainer(cfg, reward_fn=broken).train()
    assert ckpt.latest_checkpoint(cfg.run_dir / "checkpoints").name == "step_4"  # the warm-up is kept


@pytest.mark.parametrize("value, message", [(float("nan"), "rewards must be finite numbers"),
                                            ("high", "returned a str .* a reward is a number")])
def test_a_reward_function_returning_a_non_number_is_refused(tiny_config, value, message):
    # None (not applicable) and the other kinds of value: tests/test_reward_functions.py
    with pytest.raises(RewardError, match=message):
        RLTrainer(tiny_config(), reward_fn=lambda p, c: [value] * len(p)).train()


def test_a_fresh_run_never_overwrites_an_explicit_run_dir(tiny_config):
    cfg = tiny_config("train.steps=1", "sft.steps=1")
    RLTrainer(cfg).train()
    with pytest.raises(ConfigError, match="already holds a run; continue it with --resume"):
        RLTrainer(tiny_config(dir=cfg.run_dir))


def test_an_unwritable_run_dir_fails_before_training(tiny_config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=f"run dir {blocker / 'run'} is not writable"):
        RLTrainer(tiny_config(dir=blocker / "run"))


def test_init_from_starts_from_a_checkpoints_weights_and_names_a_bad_path(tiny_config, tmp_path):
    first = RLTrainer(tiny_config("train.steps=0", dir=tmp_path / "warm"))
    first.train()
    step = tmp_path / "warm" / "checkpoints" / "step_4"
    second = RLTrainer(tiny_config("sft.steps=0", f"model.init_from={step}", dir=tmp_path / "rl"))
    for (name, a), b in zip(first.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(FileNotFoundError, match="model.init_from="):
        RLTrainer(tiny_config(f"model.init_from={tmp_path / 'nowhere'}", dir=tmp_path / "bad"))


def test_time_limit_stops_rl_early_then_evaluates_and_saves(tiny_config, tmp_path):
    cfg = tiny_config("train.steps=1000", "train.time_limit_min=0.0001")  # 6 ms: used up before RL starts
    summary = RLTrainer(cfg).train()
    assert summary["stopped_at_time_limit"] and 0 <= summary["steps_done"] < 1000
    assert summary["final_accuracy"] is not None
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == cfg.sft.steps + summary["steps_done"] and "eval/accuracy" in rows[-1]


def test_callbacks_see_every_completion_each_step_and_each_checkpoint(tiny_config):
    from lmrl.train.callbacks import Callback

    class Recorder(Callback):
        def __init__(self):
            self.episodes, self.steps, self.checkpoints = [], [], []

        def on_episode_end(self, trainer, episode):
            self.episodes.append(episode)

        def on_step_end(self, trainer, step, metrics):
            self.steps.append((step, "train/policy_loss" in metrics))

        def on_checkpoint(self, trainer, path):
            self.checkpoints.append(path.name)

    cfg = tiny_config()
    recorder = Recorder()
    RLTrainer(cfg, callbacks=[recorder]).train()
    rl_steps = list(range(cfg.sft.steps + 1, cfg.sft.steps + cfg.train.steps + 1))
    assert recorder.steps == [(s, s in rl_steps) for s in range(1, rl_steps[-1] + 1)]
    assert [e.step for e in recorder.episodes] == [s for s in rl_steps for _ in range(cfg.train.rollout_size)]
    first = recorder.episodes[0]
    assert first.prompt.endswith("=") and len(first.logprobs) == len(first.completion) and first.messages is None
    assert recorder.checkpoints[-1] == f"step_{rl_steps[-1]}"


def test_an_object_with_no_hook_is_refused_as_a_callback(tiny_config):
    with pytest.raises(TypeError, match="on_episode_end"):
        RLTrainer(tiny_config(), callbacks=[object()])


@pytest.mark.parametrize("disable", [True, False])
def test_rl_turns_dropout_off_after_a_warm_up_that_used_it_unless_told_not_to(tiny_config, disable):
    from lmrl.train.callbacks import Callback

    class DropoutProbe(Callback):
        def __init__(self):
            self.p = {}  # step -> the dropout probabilities the policy has then

        def on_step_end(self, trainer, step, metrics):
            self.p[step] = {m.p for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout)}

    cfg = tiny_config("model.dropout=0.3", f"train.disable_dropout={str(disable).lower()}")
    probe = DropoutProbe()
    RLTrainer(cfg, callbacks=[probe]).train()
    warmup, rl = cfg.sft.steps, cfg.sft.steps + cfg.train.steps
    assert probe.p[warmup] == {0.3}
    assert probe.p[warmup + 1] == probe.p[rl] == ({0.0} if disable else {0.3})


def test_the_warm_up_decays_to_its_own_floor_and_rl_to_schedules(tiny_config):
    from lmrl.common.schedules import lr_at

    cfg = tiny_config("sft.steps=8", "sft.min_lr_ratio=0.5", "schedule.name=cosine", "schedule.min_lr_ratio=0.0")
    RLTrainer(cfg).train()
    rows = read_metrics(cfg.run_dir)
    warmup = {r["step"]: r["sft/lr"] for r in rows if "sft/lr" in r}
    rl = {r["step"] - 8: r["train/lr"] for r in rows if "train/lr" in r}
    for step, lr in warmup.items():
        assert lr == pytest.approx(lr_at(step - 1, base_lr=cfg.sft.lr, total_steps=8, name="cosine",
                                         warmup_steps=cfg.sft.warmup_steps, min_lr_ratio=0.5))
    assert len(warmup) == 8 and len(rl) == cfg.train.steps
    for step, lr in rl.items():
        assert lr == pytest.approx(lr_at(step - 1, base_lr=cfg.optim.lr, total_steps=cfg.train.steps, name="cosine",
                                         min_lr_ratio=0.0))
