"""The completions log (`train.log_completions`, TRL's `log_completions`): each logged step's sampled
completions in RUN_DIR/completions.jsonl with their rewards, each reward function's, the advantage
and the reward functions' `log_extra` columns; printed and sent to wandb as TRL does; nothing decoded
when it is off; a resumed run continues the file without repeating a step."""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest
import torch

from lmrl.algos.advantages import group_advantages
from lmrl.config import ConfigError, load_config
from lmrl.log.completions import CompletionsLog, format_completions, table_row
from lmrl.log.sinks import WandbSink
from lmrl.train.callbacks import Callback
from lmrl.train.rl_trainer import RLTrainer
from tests.test_envs import Countdown
from tests.test_hf import save_tiny_llama

GRPO = ["algo.name=grpo", "algo.group_size=4", "sft.steps=0", "train.log_every=2", "train.eval_every=100"]


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def logged_rl_steps(run_dir):
    """The steps whose RL metrics metrics.jsonl holds."""
    return [r["step"] for r in read(run_dir / "metrics.jsonl") if "train/loss" in r]


def digit_sum(text: str) -> float:
    return float(sum(int(c) for c in text if c.isdigit()))


class Judged:
    """A TRL reward function that scores a completion by its digits, logs each completion back as the
    extra column `echo` and its length as a metric, and records what it returned at each step."""

    __name__ = "judged"

    def __init__(self):
        self.returned = {}  # global step -> rewards

    def __call__(self, completions, trainer_state, log_metric, log_extra, **kwargs):
        log_extra("echo", list(completions))
        log_metric("judged/length", sum(map(len, completions)) / len(completions))
        rewards = [digit_sum(c) for c in completions]
        self.returned[trainer_state.global_step + 1] = rewards
        return rewards


def odd_only(completions, **kwargs):
    """Scores the odd rows only (None: not applicable)."""
    return [1.0 if i % 2 else None for i in range(len(completions))]


def test_each_logged_steps_completions_hold_rewards_extra_columns_and_advantages(tiny_config):
    cfg = tiny_config(*GRPO, "train.log_completions=true", "train.completions_to_print=2")
    judged = Judged()
    RLTrainer(cfg, reward_funcs=[judged, odd_only], reward_weights=[1.0, 0.5]).train()

    rows = read(cfg.run_dir / "completions.jsonl")
    steps = sorted({r["step"] for r in rows})
    assert steps == logged_rl_steps(cfg.run_dir) == [1, 2, 4, 6]  # log_every=2, the first and last
    for step in steps:
        batch = [r for r in rows if r["step"] == step]
        assert len(batch) == 16  # train.rollout_size
        assert all(set(r) == {"step", "prompt", "completion", "reward", "rewards", "extra", "advantage"} for r in batch)
        # each function's reward is what it returned for that completion, None where it returned None
        assert [r["rewards"]["judged"] for r in batch] == judged.returned[step]
        assert [r["rewards"]["odd_only"] for r in batch] == [1.0 if i % 2 else None for i in range(16)]
        assert all(r["rewards"]["judged"] == digit_sum(r["completion"]) for r in batch)
        # the reward is their weighted sum; the extra column sits on the row of its completion
        assert [r["reward"] for r in batch] == pytest.approx([r["rewards"]["judged"] + 0.5 * (r["rewards"]["odd_only"]
                                                                                               or 0) for r in batch])
        assert all(r["extra"] == {"echo": r["completion"]} for r in batch)
        # GRPO's advantage of each completion in its group of 4
        expected = group_advantages(torch.tensor([r["reward"] for r in batch]), 4)
        assert [r["advantage"] for r in batch] == pytest.approx(expected.tolist(), abs=1e-5)
    assert all("judged/length" in r for r in read(cfg.run_dir / "metrics.jsonl") if "train/loss" in r)
    log = (cfg.run_dir / "train.log").read_text()
    assert log.count(": 2 of 16 completions") == 4 and "[rl] Step 4/6: 2 of 16 completions" in log


class CountedTexts:
    """Records the step in progress at each decoding of a rollout's texts (`task.texts`)."""

    def __init__(self, trainer):
        self.trainer, self.texts, self.steps = trainer, trainer.task.texts, []
        trainer.task.texts = self

    def __call__(self, ids, rollout):
        self.steps.append(self.trainer.state["step"] + 1)
        return self.texts(ids, rollout)


def test_off_nothing_is_decoded_and_no_file_is_written(tiny_config):
    cfg = tiny_config(*GRPO)
    trainer = RLTrainer(cfg)  # the task's own verifier: nothing else decodes texts
    counted = CountedTexts(trainer)
    trainer.train()
    assert counted.steps == [] and not (cfg.run_dir / "completions.jsonl").exists()


def test_on_texts_are_decoded_and_written_on_logged_steps_only(tiny_config):
    cfg = tiny_config(*GRPO, "train.log_completions=true", "train.log_every=4")
    trainer = RLTrainer(cfg)
    counted = CountedTexts(trainer)
    trainer.train()
    rows = read(cfg.run_dir / "completions.jsonl")
    assert counted.steps == sorted({r["step"] for r in rows}) == logged_rl_steps(cfg.run_dir) == [1, 4, 6]
    assert all(set(r) == {"step", "prompt", "completion", "reward", "advantage"} for r in rows)  # no reward functions
    # per-digit rewards (B, 3): a completion's reward is their sum, its advantage the mean of its tokens' GRPO ones
    task = trainer.task
    for step in (1, 4, 6):
        batch = [r for r in rows if r["step"] == step]
        targets = [task.target(*task.operands(r["prompt"])) for r in batch]
        digits = torch.tensor([[float(c == t) for c, t in zip(r["completion"], target)]
                               for r, target in zip(batch, targets)])
        assert [r["reward"] for r in batch] == digits.sum(1).tolist()
        assert [r["advantage"] for r in batch] == pytest.approx(group_advantages(digits, 4).mean(1).tolist(), abs=1e-5)


def test_a_log_extra_column_of_the_wrong_length_is_left_out_and_named(tiny_config):
    def short_column(completions, log_extra, **kwargs):
        log_extra("first", completions[:1])
        log_extra("length", [len(c) for c in completions])
        return [0.0] * len(completions)

    cfg = tiny_config(*GRPO, "train.log_completions=true", "train.steps=1")
    RLTrainer(cfg, reward_funcs=[short_column]).train()
    rows = read(cfg.run_dir / "completions.jsonl")
    assert all(r["extra"] == {"length": len(r["completion"])} for r in rows)
    assert ("log_extra column 'first' has 1 values for 16 completions: left out of the completions log at step 1"
            in (cfg.run_dir / "train.log").read_text())


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, step, metrics):
        if step == self.step:
            raise RuntimeError("stopped")


def test_a_resumed_run_continues_the_file_without_repeating_a_step(tiny_config, tmp_path):
    options = [*GRPO, "train.log_completions=true", "train.log_every=1", "train.ckpt_every=2"]
    reference = tiny_config(*options, dir=tmp_path / "reference")
    RLTrainer(reference, reward_funcs=[Judged()]).train()

    cfg = tiny_config(*options, dir=tmp_path / "stopped")
    with pytest.raises(RuntimeError, match="stopped"):  # after step 5 is logged; the last checkpoint is step 4's
        RLTrainer(cfg, reward_funcs=[Judged()], callbacks=[StopAt(5)]).train()
    assert sorted({r["step"] for r in read(cfg.run_dir / "completions.jsonl")}) == [1, 2, 3, 4, 5]
    RLTrainer(tiny_config(*options, "run.resume=auto", dir=cfg.run_dir), reward_funcs=[Judged()]).train()

    rows = read(cfg.run_dir / "completions.jsonl")
    assert [r["step"] for r in rows] == [s for s in range(1, 7) for _ in range(16)]
    assert rows == read(reference.run_dir / "completions.jsonl")


def test_a_multi_turn_episodes_row_holds_its_conversation(tmp_path):
    save_tiny_llama(tmp_path / "model", max_positions=1024)
    cfg = load_config("adder", [
        "model.type=hf", f"model.path={tmp_path / 'model'}", f"run.dir={tmp_path / 'run'}", "run.progress=false",
        "run.tensorboard=false", "run.threads=1", "run.mixed_precision=", "sft.steps=0", "algo.name=grpo",
        "algo.group_size=2", "train.steps=1", "train.rollout_size=4", "eval.size=2", "eval.batch_size=2",
        "task.name=env", "task.max_new_tokens=4", "env.max_turns=3", "env.heldout_episodes=2",
        "train.stopping_threshold=null", "train.log_completions=true"])
    RLTrainer(cfg, env_factory=lambda: Countdown(bonus=1.0)).train()
    rows = read(tmp_path / "run" / "completions.jsonl")
    assert len(rows) == 4
    for r in rows:  # the episode's opening is the prompt, the turns after it the completion, role-tagged
        opening, *turns = r["messages"]
        assert opening == {"role": "user", "content": r["prompt"]} and turns[0]["role"] == "assistant"
        assert r["completion"] == "\n".join(f"[{m['role']}] {m['content']}" for m in turns)


def test_a_multi_turn_episodes_row_says_its_turns_truncation_and_environment_error(tmp_path):
    class HalfBroken(Countdown):
        made = 0  # every other environment made breaks on its first step

        def step(self, action):
            if self.broken:
                raise RuntimeError("the board\nwent away")
            return super().step(action)

        def reset(self, seed=None):
            HalfBroken.made += 1
            self.broken = HalfBroken.made % 2 == 0
            return super().reset(seed)

    save_tiny_llama(tmp_path / "model", max_positions=1024)
    cfg = load_config("adder", [
        "model.type=hf", f"model.path={tmp_path / 'model'}", f"run.dir={tmp_path / 'run'}", "run.progress=false",
        "run.tensorboard=false", "run.threads=1", "run.mixed_precision=", "sft.steps=0", "algo.name=grpo",
        "algo.group_size=2", "train.steps=1", "train.rollout_size=4", "eval.size=2", "eval.batch_size=2",
        "task.name=env", "task.max_new_tokens=4", "env.max_turns=2", "env.heldout_episodes=2", "env.workers=1",
        "train.stopping_threshold=null", "train.log_completions=true"])
    RLTrainer(cfg, env_factory=HalfBroken).train()
    text = (tmp_path / "run" / "completions.jsonl").read_text()
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the completions log")) for line in
            text.splitlines()]
    assert [r["env_error"] for r in rows] == [None, "environment HalfBroken: step() raised RuntimeError: the board "
                                                    "went away"] * 2
    assert [r["turns"] for r in rows] == [2, 1, 2, 1]
    for ran, failed in (rows[:2], rows[2:]):  # a game of 3 turns is cut at env.max_turns=2 with 0.5 a turn
        assert (ran["truncated"], ran["reward"]) in ((True, 1.0), (False, 1.5))
        assert failed["truncated"] is False and failed["reward"] is None  # a failed episode has no reward


def test_nan_and_infinite_numbers_are_written_as_null(tmp_path):
    log = CompletionsLog(tmp_path / "completions.jsonl", logging.getLogger("tests.completions"))
    log.log(1, [{"step": 1, "reward": float("nan"), "advantage": float("inf"),
                 "extra": {"t": torch.tensor([1.0, float("nan")]), "n": [float("-inf")]}}])
    log.close()
    line = (tmp_path / "completions.jsonl").read_text()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON")) == {
        "step": 1, "reward": None, "advantage": None, "extra": {"t": [1.0, None], "n": [None]}}


# -- the log's own parts -------------------------------------------------------------------------------

ROWS = [{"step": 3, "prompt": f"p{i}\nline", "completion": f"c{i}", "reward": float(i),
         "rewards": {"f": float(i), "g": None}, "advantage": 0.5, "extra": {"tag": f"t{i}"}} for i in range(8)]


def test_the_printed_completions_are_spread_over_the_step_and_fit_one_line_each():
    text = format_completions("[rl] Step 3/6", ROWS, 2)
    assert text.splitlines() == ["[rl] Step 3/6: 2 of 8 completions",
                                 "  reward 0.000 | f 0.000, g - | advantage 0.500 | tag: t0",
                                 "    prompt:     p0⏎line", "    completion: c0",
                                 "  reward 4.000 | f 4.000, g - | advantage 0.500 | tag: t4",
                                 "    prompt:     p4⏎line", "    completion: c4"]
    long = format_completions("x", [{**ROWS[0], "completion": "a" * 200 + "b" * 200}], 5)
    assert long.splitlines()[-1] == "    completion: " + "a" * 158 + " … " + "b" * 158


def test_a_table_row_has_a_column_per_reward_function_and_extra_and_json_for_messages():
    row = {**ROWS[0], "messages": [{"role": "user", "content": "hi"}]}
    assert table_row(row) == {"step": 3, "prompt": "p0\nline", "completion": "c0", "reward": 0.0, "rewards/f": 0.0,
                              "rewards/g": None, "advantage": 0.5, "extra/tag": "t0",
                              "messages": '[{"role": "user", "content": "hi"}]'}


def test_with_wandb_the_rows_are_the_table_completions_at_their_step(tmp_path, monkeypatch):
    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    class Run:
        def log(self, data, step):
            logged.append((data, step))

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **_: Run(), Table=Table))
    log = CompletionsLog(tmp_path / "completions.jsonl", logging.getLogger("tests.completions"),
                         wandb=WandbSink("proj", "run", {}, tmp_path))
    log.log(3, ROWS[:2] + [{"step": 3, "prompt": "q", "completion": "d", "reward": None}])
    log.close()
    ((data, step),) = logged
    table = data["completions"]
    assert step == 3 and table.columns == ["step", "prompt", "completion", "reward", "rewards/f", "rewards/g",
                                           "advantage", "extra/tag"]
    assert table.data[0] == [3, "p0\nline", "c0", 0.0, 0.0, None, 0.5, "t0"]
    assert table.data[2] == [3, "q", "d", None, None, None, None, None]
    assert read(tmp_path / "completions.jsonl")[1] == ROWS[1]


def test_each_row_is_on_disk_before_the_log_closes(tmp_path):
    log = CompletionsLog(tmp_path / "completions.jsonl", logging.getLogger("tests.completions"))
    log.log(3, ROWS[:1])
    assert read(tmp_path / "completions.jsonl") == ROWS[:1]  # a killed run loses nothing already logged
    log.close()


def test_values_json_has_no_type_for_are_written_as_lists_numbers_or_text(tmp_path):
    log = CompletionsLog(tmp_path / "completions.jsonl", logging.getLogger("tests.completions"))
    log.log(1, [{"step": 1, "extra": {"t": torch.tensor([1, 2]), "x": torch.tensor(0.5), "o": object}}])
    log.close()
    assert read(tmp_path / "completions.jsonl") == [{"step": 1, "extra": {"t": [1, 2], "x": 0.5,
                                                                           "o": "<class 'object'>"}}]


# -- the config ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["train.log_completion=true"], "unknown key 'train.log_completion' .*did you mean 'train.log_completions'"),
    (["train.log_completions=true", "train.completions_to_print=-1"], "train.completions_to_print must be >= 0"),
    (["train.completions_to_print=4"], "train.completions_to_print=4 prints logged completions: set "
                                       "train.log_completions=true too"),
    (["run.trainer=sft", "train.steps=200", "train.log_completions=true"],
     "train.log_completions logs the completions RL samples; run.trainer=sft samples none"),
])
def test_bad_completions_log_settings_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config("adder", overrides)
    assert "\n" not in str(err.value)
