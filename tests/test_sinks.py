import io
import json
import logging
import sys
import types

import numpy as np
import pytest
import torch

from lmrl.log.sinks import (
    CONSOLE_FIELDS,
    EVAL_FIELDS,
    ConsoleSink,
    JsonlSink,
    MetricsLogger,
    TensorBoardSink,
    WandbSink,
    progress,
    setup_logging,
    truncate_jsonl,
)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- JSONL -----------------------------------------------------------------------------------------
def test_jsonl_writes_one_object_per_call_with_step_first(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(1, {"train/loss": 0.5})
    sink.log(2, {"train/loss": 0.25, "eval/accuracy": 0.75})
    sink.close()
    assert read_jsonl(path) == [{"step": 1, "train/loss": 0.5},
                                {"step": 2, "train/loss": 0.25, "eval/accuracy": 0.75}]
    assert path.read_text().splitlines()[0].startswith('{"step": 1')


def test_jsonl_line_is_on_disk_before_close(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(7, {"train/loss": 1.0})
    assert read_jsonl(path) == [{"step": 7, "train/loss": 1.0}]  # read by another handle, sink still open
    sink.close()


def test_jsonl_appends_to_an_existing_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n')
    with MetricsLogger([JsonlSink(path)]) as log:
        log.log(2, {"x": 2.0})
    assert [row["step"] for row in read_jsonl(path)] == [1, 2]


def test_jsonl_converts_tensors_and_numpy_scalars_to_plain_numbers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsLogger([JsonlSink(path)]) as log:
        log.log(3, {"a": torch.tensor(0.5), "b": np.float32(0.25), "c": np.int64(4), "d": 2, "e": float("nan")})
    row = read_jsonl(path)[0]
    assert row["a"] == 0.5 and row["b"] == 0.25 and row["c"] == 4 and row["d"] == 2
    assert type(row["a"]) is float and type(row["c"]) is int
    assert row["e"] != row["e"]  # NaN written as NaN and read back as NaN
    assert "NaN" in path.read_text()


def test_jsonl_rejects_a_non_numeric_metric_by_name(tmp_path):
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    with pytest.raises(TypeError, match="'train/note'"):
        sink.log(1, {"train/note": "hello"})
    sink.close()


def write_steps(path, steps):
    path.write_text("".join(json.dumps({"step": s, "x": s / 10}) + "\n" for s in steps))


def test_truncate_keeps_exactly_the_lines_up_to_the_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_steps(path, [1, 2, 3, 4, 5, 6])
    assert truncate_jsonl(path, 4) == 4
    assert read_jsonl(path) == [{"step": s, "x": s / 10} for s in [1, 2, 3, 4]]


def test_truncate_leaves_no_temp_file_and_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_steps(path, [1, 2, 3])
    with open(path, "a") as f:
        f.write('{"step": 4, "x"')  # the process was killed mid-write
    truncate_jsonl(path, 10)
    assert [row["step"] for row in read_jsonl(path)] == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_truncate_replaces_the_file_rather_than_rewriting_it_in_place(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_steps(path, [1, 2, 3])
    old = open(path)  # a reader holding the old file still sees all of it: the new one was swapped in
    truncate_jsonl(path, 1)
    assert len(old.read().splitlines()) == 3
    old.close()
    assert [row["step"] for row in read_jsonl(path)] == [1]


def test_truncate_of_a_missing_file_creates_nothing(tmp_path):
    assert truncate_jsonl(tmp_path / "metrics.jsonl", 5) == 0
    assert list(tmp_path.iterdir()) == []


def test_resumed_sink_matches_an_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with MetricsLogger([JsonlSink(straight)]) as log:
        for s in range(1, 7):
            log.log(s, {"x": float(s)})
    with MetricsLogger([JsonlSink(resumed)]) as log:  # killed after step 5, checkpoint at step 3
        for s in range(1, 6):
            log.log(s, {"x": float(s)})
    truncate_jsonl(resumed, 3)  # as RunLog does before it opens the sink again
    sink = JsonlSink(resumed)
    for s in range(4, 7):
        sink.log(s, {"x": float(s)})
    sink.close()
    assert resumed.read_text() == straight.read_text()


# -- TensorBoard -----------------------------------------------------------------------------------
def test_tensorboard_scalars_read_back_with_their_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger([TensorBoardSink(tmp_path / "tb")]) as log:
        log.log(1, {"train/loss": 0.5, "train/lr": 1e-4})
        log.log(2, {"train/loss": torch.tensor(0.25)})
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"train/loss", "train/lr"}
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert loss == [(1, pytest.approx(0.5)), (2, pytest.approx(0.25))]
    assert [(e.step, e.value) for e in acc.Scalars("train/lr")] == [(1, pytest.approx(1e-4))]


# -- Weights & Biases ------------------------------------------------------------------------------
def test_wandb_missing_names_the_extra_and_the_opt_out(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails even where wandb is installed
    with pytest.raises(ImportError) as err:
        WandbSink("proj", "run", {}, tmp_path)
    assert str(err.value) == ("Weights & Biases logging needs the 'wandb' extra: "
                              "pip install 'lmrl[wandb]' (or pass --no-wandb)")


def test_wandb_sink_inits_offline_logs_with_step_and_finishes(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with MetricsLogger([WandbSink("proj", "run-1", {"lr": 0.1}, tmp_path / "wandb")]) as log:
        log.log(5, {"train/loss": torch.tensor(0.5)}, stage="rl")
    assert calls == [("init", dict(project="proj", name="run-1", config={"lr": 0.1},
                                   dir=str(tmp_path / "wandb"), mode="offline")),
                     ("log", {"train/loss": 0.5}, 5),
                     ("finish",)]


# -- console ---------------------------------------------------------------------------------------
FULL = {"train/policy_loss": 0.2341, "train/accuracy": 0.75, "train/avg_reward": 0.75, "train/lr": 1e-4,
        "train/kl": 0.01, "perf/tokens_per_s": 1234.0}


def console(total_steps=200):
    return ConsoleSink(logging.getLogger("tests.console"), total_steps=total_steps)


def test_console_line_matches_the_documented_example():
    assert console().format(50, FULL) == "Step 50/200 | Loss: 0.234 | Acc: 0.750 | Reward: 0.750 | LR: 1.00e-04"


def test_console_stage_tag_and_stage_count():
    line = console().format(60, {"sft/loss": 1.5, "sft/accuracy": 0.5, "sft/lr": 3e-4},
                            stage="sft", stage_step=10, stage_total=40)
    assert line == "[sft] Step 10/40 | Loss: 1.500 | Acc: 0.500 | LR: 3.00e-04"


def test_console_prefers_policy_loss_and_shows_eval_last():
    line = console(None).format(8, {"train/loss": 9.0, "train/policy_loss": 0.5, "eval/accuracy": 0.875})
    assert line == "Step 8 | Loss: 0.500 | Eval: acc 0.875"


# The keys each trainer logs at a training step and at an evaluation, as a short real run of each
# wrote them to metrics.jsonl (tests/test_console_lines.py checks the lines of such runs end to end).
STEP_KEYS = {
    "rl": ["clip_ratio/high_max", "clip_ratio/high_mean", "clip_ratio/low_mean", "clip_ratio/low_min",
           "clip_ratio/region_mean", "completions/clipped_ratio", "completions/max_length",
           "completions/max_terminated_length", "completions/mean_length", "completions/mean_terminated_length",
           "completions/min_length", "completions/min_terminated_length", "entropy", "frac_reward_zero_std",
           "grad_norm", "learning_rate", "loss", "num_tokens", "perf/tokens_per_s", "reward", "reward_std",
           "rollout/length_mean", "rollout/reward_mean", "rollout/staleness",
           "time/rollout_s", "time/step_s", "time/update_s", "train/accuracy", "train/advantage_mean",
           "train/approx_kl", "train/avg_reward", "train/clip_frac", "train/entropy", "train/grad_norm",
           "train/loss", "train/lr", "train/nonfinite_skipped", "train/policy_loss", "train/ratio_mean"],
    "warm-up": ["perf/tokens_per_s", "sft/accuracy", "sft/grad_norm", "sft/loss", "sft/lr", "sft/nonfinite_skipped",
                "time/step_s"],
    "sft": ["grad_norm", "learning_rate", "loss", "sft/grad_norm", "sft/loss", "sft/lr", "sft/nonfinite_skipped",
            "sft/token_accuracy", "time/step_s"],
    "dpo": ["dpo/grad_norm", "dpo/loss", "dpo/lr", "dpo/nonfinite_skipped", "grad_norm", "learning_rate",
            "logps/chosen", "logps/rejected", "loss", "rewards/accuracies", "rewards/chosen", "rewards/margins",
            "rewards/rejected", "time/step_s"],
    "rm": ["grad_norm", "learning_rate", "loss", "rm/accuracy", "rm/chosen_mean", "rm/grad_norm", "rm/loss", "rm/lr",
           "rm/margin_mean", "rm/nonfinite_skipped", "rm/rejected_mean", "time/step_s"],
}
EVAL_KEYS = {
    "rl": ["eval/accuracy", "eval/length_mean", "eval/reward"],
    "warm-up": ["eval/accuracy", "eval/length_mean", "eval/reward", "eval/warmup_accuracy"],
    "sft": ["eval/accuracy", "eval/loss", "eval/token_accuracy"],
    "dpo": ["eval/accuracy", "eval/logps/chosen", "eval/logps/rejected", "eval/loss", "eval/rewards/accuracies",
            "eval/rewards/chosen", "eval/rewards/margins", "eval/rewards/rejected"],
    "rm": ["eval/accuracy", "eval/chosen_mean", "eval/loss", "eval/margin_mean", "eval/rejected_mean"],
}


def numbered(keys):
    """Each key valued by its place in the sorted list, /10: a line shows which key it read."""
    return {key: (i + 1) / 10 for i, key in enumerate(sorted(keys))}


def test_console_step_line_of_every_trainer_shows_loss_acc_reward_or_margin_and_lr():
    lines = {name: console(None).format(1, numbered(keys)) for name, keys in STEP_KEYS.items()}
    rl = numbered(STEP_KEYS["rl"])
    assert lines["rl"] == (f"Step 1 | Loss: {rl['train/policy_loss']:.3f} | Acc: {rl['train/accuracy']:.3f} | "
                           f"Reward: {rl['train/avg_reward']:.3f} | LR: {rl['train/lr']:.2e}")
    warm = numbered(STEP_KEYS["warm-up"])
    assert lines["warm-up"] == (f"Step 1 | Loss: {warm['sft/loss']:.3f} | Acc: {warm['sft/accuracy']:.3f} | "
                                f"LR: {warm['sft/lr']:.2e}")
    sft = numbered(STEP_KEYS["sft"])
    assert lines["sft"] == (f"Step 1 | Loss: {sft['sft/loss']:.3f} | Acc: {sft['sft/token_accuracy']:.3f} | "
                            f"LR: {sft['sft/lr']:.2e}")
    dpo = numbered(STEP_KEYS["dpo"])
    assert lines["dpo"] == (f"Step 1 | Loss: {dpo['dpo/loss']:.3f} | Acc: {dpo['rewards/accuracies']:.3f} | "
                            f"Margin: {dpo['rewards/margins']:.3f} | LR: {dpo['dpo/lr']:.2e}")
    rm = numbered(STEP_KEYS["rm"])
    assert lines["rm"] == (f"Step 1 | Loss: {rm['rm/loss']:.3f} | Acc: {rm['rm/accuracy']:.3f} | "
                           f"Margin: {rm['rm/margin_mean']:.3f} | LR: {rm['rm/lr']:.2e}")


def test_every_key_the_console_reads_is_one_a_trainer_logs():
    logged = {key for keys in [*STEP_KEYS.values(), *EVAL_KEYS.values()] for key in keys}
    read = [key for _, labels in CONSOLE_FIELDS + EVAL_FIELDS for key in labels]
    assert [key for key in read if key not in logged] == []


def test_console_reads_trls_rewards_accuracies_as_the_dpo_accuracy():
    metrics = {"dpo/loss": 0.69, "rewards/accuracies": 0.25, "rewards/margins": 0.0, "dpo/lr": 1e-6}
    line = console(None).format(1, metrics)
    assert line == "Step 1 | Loss: 0.690 | Acc: 0.250 | Margin: 0.000 | LR: 1.00e-06"


def test_console_eval_field_of_every_trainer_shows_its_held_out_loss_acc_and_reward_or_margin():
    fields = {name: console(None).format(4, numbered(keys)).split(" | ") for name, keys in EVAL_KEYS.items()}
    assert all(f[0] == "Step 4" and len(f) == 2 for f in fields.values())  # an evaluation alone: one Eval field
    rl, sft, dpo, rm = (numbered(EVAL_KEYS[n]) for n in ("rl", "sft", "dpo", "rm"))
    assert fields["rl"][1] == f"Eval: acc {rl['eval/accuracy']:.3f}, reward {rl['eval/reward']:.3f}"
    assert fields["warm-up"][1] == fields["rl"][1]  # eval/warmup_accuracy stays off the console
    assert fields["sft"][1] == f"Eval: loss {sft['eval/loss']:.3f}, acc {sft['eval/accuracy']:.3f}"
    assert fields["dpo"][1] == (f"Eval: loss {dpo['eval/loss']:.3f}, acc {dpo['eval/accuracy']:.3f}, "
                                f"margin {dpo['eval/rewards/margins']:.3f}")
    assert fields["rm"][1] == (f"Eval: loss {rm['eval/loss']:.3f}, acc {rm['eval/accuracy']:.3f}, "
                               f"margin {rm['eval/margin_mean']:.3f}")


def test_console_line_has_at_most_five_fields_whatever_is_logged():
    everything = numbered({k for keys in [*STEP_KEYS.values(), *EVAL_KEYS.values()] for k in keys})
    fields = console().format(9, everything).split(" | ")
    assert [f.split(":")[0] for f in fields] == ["Step 9/200", "Loss", "Acc", "Reward", "LR", "Eval"]


def test_console_prints_nothing_for_metrics_it_does_not_show(caplog):
    logger = logging.getLogger("tests.console")
    with caplog.at_level(logging.INFO, logger=logger.name):
        sink = ConsoleSink(logger, total_steps=10)
        sink.log(3, {"eval/warmup_accuracy": 0.5})
        sink.log(4, {"train/loss": 0.5})
    assert [r.getMessage() for r in caplog.records] == ["Step 4/10 | Loss: 0.500"]


# -- setup_logging ---------------------------------------------------------------------------------
def test_setup_logging_writes_train_log_and_stderr_once_even_if_called_twice(tmp_path, capsys):
    name = "lmrl.test.setup"
    setup_logging(tmp_path, name=name)
    logger = setup_logging(tmp_path, name=name)
    logger.info("hello")
    for h in logger.handlers:
        h.flush()
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" hello")
    assert lines[0][:4].isdigit()  # begins with the timestamp
    assert capsys.readouterr().err.count("hello") == 1
    assert len(logger.handlers) == 2
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()


def test_setup_logging_appends_to_an_existing_train_log(tmp_path):
    (tmp_path / "train.log").write_text("earlier run\n")
    logger = setup_logging(tmp_path, name="lmrl.test.append")
    logger.info("resumed")
    for h in list(logger.handlers):
        h.flush()
        logger.removeHandler(h)
        h.close()
    text = (tmp_path / "train.log").read_text()
    assert text.startswith("earlier run\n") and text.rstrip().endswith("resumed")


# -- MetricsLogger and progress --------------------------------------------------------------------
class Recorder:
    def __init__(self, fail_close=False):
        self.rows, self.closed, self.fail_close = [], False, fail_close

    def log(self, step, metrics, **context):
        self.rows.append((step, metrics, context))

    def close(self):
        self.closed = True
        if self.fail_close:
            raise OSError("disk full")


def test_metrics_logger_fans_out_and_passes_context():
    a, b = Recorder(), Recorder()
    with MetricsLogger([a, b]) as log:
        log.log(4, {"x": torch.tensor(2.0)}, stage="rl")
    assert a.rows == b.rows == [(4, {"x": 2.0}, {"stage": "rl"})]
    assert a.closed and b.closed


def test_metrics_logger_closes_every_sink_even_when_one_fails():
    a, b = Recorder(fail_close=True), Recorder()
    with pytest.raises(OSError, match="disk full"):
        MetricsLogger([a, b]).close()
    assert b.closed


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_starts_at_initial_and_can_be_disabled(monkeypatch):
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    bar = progress(100, initial=40, desc="rl", enabled=True)
    assert (bar.n, bar.total) == (40, 100) and not bar.disable
    bar.close()
    off = progress(100, enabled=False)
    assert off.disable
    off.close()


def test_progress_is_off_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = progress(100, enabled=True)
    assert bar.disable
    bar.close()
