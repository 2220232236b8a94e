"""Reward functions as TRL writes them: one or a list with weights, called with keywords (prompts,
completions, completion_ids, trainer_state and every column), None for "not applicable" left out of
the weighted sum, message lists for a chat task, `reward.funcs` from the config; lmrl's older
positional functions and `reward.cls` still work. The last tests train on a tiny local model."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time

import numpy as np
import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.generation.rollout import Rollout
from lmrl.tasks.rewards import (RewardError, RewardFunctions, RewardLog, RewardModelScorer, build_reward,
                                called_positionally, fill_unscored, score_rollout)
from lmrl.train.callbacks import Callback
from lmrl.train.rl_trainer import RLTrainer
from tests.test_hf import save_tiny_llama
from tests.test_rlhf import rm  # noqa: F401  (the fixture: a tiny reward model)
from tests.trl_rewards import Constant, math_format_reward, reward_len


class PlainTask:
    """Three problems with text prompts and fixed completions; the task's own reward is 0 for all."""

    completions = ["12", "twelve", "<answer>7</answer>"]

    def score_rollout(self, ids, rollout):
        return torch.zeros(len(ids)), torch.ones(len(ids)), {"format_rate": torch.tensor([1.0, 0.0, 1.0])}

    def texts(self, ids, rollout):
        return [f"Q{i}" for i in ids.tolist()], [self.completions[i] for i in ids.tolist()]

    def reward_kwargs(self, ids):
        return {"ground_truth": ["12", "12", "7"], "kind": ["math", "chat", "math"]}


class ChatTask(PlainTask):
    """PlainTask whose prompts are conversations (what MathTask gives with a chat template)."""

    heldout_ids, max_new_tokens = torch.arange(0), 4

    def sample_train_ids(self, n, generator):
        return torch.zeros(n, dtype=torch.long)

    def rollout(self, policy, ids, **_):
        return ROLLOUT

    def conversations(self, ids, rollout):
        prompts, completions = self.texts(ids, rollout)
        return ([[{"role": "user", "content": p}] for p in prompts],
                [[{"role": "assistant", "content": c}] for c in completions])


IDS = torch.arange(3)
# completion token ids; the mask ends each completion where it ends (row 1 after 1 token, row 2 after 2)
ROLLOUT = Rollout(prompts=torch.zeros(3, 2, dtype=torch.long),
                  completions=torch.tensor([[5, 6, 7], [8, 0, 0], [9, 4, 0]]), logprobs=torch.zeros(3, 3),
                  mask=torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]]))


def returning(name, values):
    """A TRL-style reward function called `name` that returns `values`."""
    def f(completions, **kwargs):
        return list(values)

    f.__name__ = name
    return f


def test_the_weighted_sum_leaves_out_none_and_each_function_is_reported():
    f, g = returning("f", [1.0, None, 3.0]), returning("g", [None, 2.0, 0.5])
    rewards, exact, extras = score_rollout(PlainTask(), IDS, ROLLOUT, RewardFunctions([f, g], [2.0, 10.0]))
    assert rewards.tolist() == [2.0, 20.0, 11.0]  # 2·1 | 10·2 | 2·3 + 10·0.5
    assert exact.tolist() == [1.0, 1.0, 1.0]  # accuracy stays the task's verifier's
    assert extras["format_rate"].tolist() == [1.0, 0.0, 1.0]  # the task's extras are kept
    per_f, per_g = extras["rewards/f/mean"], extras["rewards/g/mean"]
    assert per_f[0] == 1.0 and math.isnan(per_f[1]) and per_f[2] == 3.0
    assert per_f.nanmean().item() == 2.0 and per_g.nanmean().item() == 1.25


def test_weights_default_to_one_and_a_list_is_called_as_trl_calls_it():
    rewards, _, _ = score_rollout(PlainTask(), IDS, ROLLOUT, [returning("f", [1, 2, 3]), returning("g", [None, 1, 1])])
    assert rewards.tolist() == [1.0, 3.0, 4.0]


def test_a_completion_no_function_scores_is_an_error_naming_the_functions_and_the_sample():
    f, g = returning("f", [1.0, None, 3.0]), returning("g", [None, None, 0.0])
    with pytest.raises(RewardError) as e:
        score_rollout(PlainTask(), IDS, ROLLOUT, [f, g])
    assert str(e.value).startswith("every reward function (f, g) returned None for prompt 'Q1', completion 'twelve'")
    assert "\n" not in str(e.value)


def test_functions_get_prompts_completions_ids_state_and_every_column_as_keywords():
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return [0.0] * 3

    score_rollout(ChatTask(), IDS, ROLLOUT, [spy], step=5, max_steps=9)
    assert seen["prompts"][0] == [{"role": "user", "content": "Q0"}]
    assert seen["completions"][1] == [{"role": "assistant", "content": "twelve"}]
    assert seen["completion_ids"] == [[5, 6, 7], [8], [9, 4]]
    assert (seen["trainer_state"].global_step, seen["trainer_state"].max_steps) == (5, 9)
    assert seen["ground_truth"] == ["12", "12", "7"] and seen["kind"] == ["math", "chat", "math"]

    score_rollout(PlainTask(), IDS, ROLLOUT, [spy])  # a task without conversations: texts
    assert seen["prompts"] == ["Q0", "Q1", "Q2"] and seen["completions"] == PlainTask.completions


def test_trl_quick_start_functions_score_a_chat_task():
    rewards, _, extras = score_rollout(ChatTask(), IDS, ROLLOUT, RewardFunctions([reward_len, math_format_reward],
                                                                                 [1.0, 4.0]))
    # lengths 2, 6, 18 → -18, -14, -2; format: a bare number on math rows, None on the chat row
    assert rewards.tolist() == [-18.0 + 4.0, -14.0, -2.0]
    assert extras["rewards/math_format_reward/mean"].nanmean().item() == 0.5


@pytest.mark.parametrize("func, positional", [
    (reward_len, False),  # f(completions, **kwargs): TRL's
    (math_format_reward, False),  # f(completions, kind, **kwargs)
    (lambda prompts, completions, completion_ids, **kw: [], False),  # names a keyword only TRL passes
    (lambda **kw: [], False),
    (lambda p, c: [], True),  # lmrl's older f(prompts, completions, **columns)
    (lambda prompts, completions, ground_truth, **kw: [], True),
    (lambda *args, **kw: [], True),
    (Constant(), False),
])
def test_the_calling_style_of_a_single_function_is_read_from_its_signature(func, positional):
    assert called_positionally(func) is positional


def test_a_single_function_of_either_style_works_through_reward_fn():
    old = build_reward(None, reward_fn=lambda prompts, completions, ground_truth, **kw: [float(c == g) for c, g in
                                                                                       zip(completions, ground_truth)])
    assert score_rollout(ChatTask(), IDS, ROLLOUT, old)[0].tolist() == [1.0, 0.0, 0.0]  # texts, positionally
    trl = build_reward(None, reward_fn=reward_len)
    assert score_rollout(ChatTask(), IDS, ROLLOUT, trl)[0].tolist() == [-18.0, -14.0, -2.0]


def test_a_function_that_does_not_take_the_keywords_is_told_to_take_kwargs():
    def needs_solution(completions, solution):
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"^reward function needs_solution raised TypeError: .*take \*\*kwargs\) "
                                          r"\(first sample: prompt 'Q0', completion '12'\)$"):
        score_rollout(PlainTask(), IDS, ROLLOUT, [needs_solution])


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_refused_with_the_function_and_sample(value):
    with pytest.raises(RewardError, match=r"reward function f returned .* for prompt 'Q1', completion 'twelve'; "
                                          r"rewards must be finite numbers \(or None"):
        score_rollout(PlainTask(), IDS, ROLLOUT, [returning("f", [1.0, value, 1.0])])


def test_reward_weights_must_match_the_functions():
    with pytest.raises(ValueError, match=r"2 weights for 1 reward functions \(reward_len\)"):
        build_reward(None, reward_funcs=reward_len, reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="finite numbers"):
        RewardFunctions([reward_len], [math.nan])
    with pytest.raises(ValueError, match="not both"):
        build_reward(None, reward_fn=reward_len, reward_funcs=[reward_len])


def test_reward_weights_is_understood_as_trls_name_for_reward_weights():
    funcs = "reward.funcs=[tests.trl_rewards:reward_len, tests.trl_rewards:Constant]"
    for written in ("reward_weights", "algo.reward_weights"):
        cfg = load_config(None, [funcs, f"{written}=[1, 2]"])
        assert cfg.reward.weights == [1, 2] and build_reward(cfg.reward).weights == [1.0, 2.0]
        assert any(note.startswith(f"{written} is TRL's name for reward.weights") for note in cfg.aliases)


# -- the rest of TRL's calling convention: async functions, trainer_state, log_metric / log_extra ------

def test_async_reward_functions_are_awaited_together():
    async def slow_one(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    class SlowTwo:  # an object whose __call__ is a coroutine function
        async def __call__(self, completions, **kwargs):
            await asyncio.sleep(0.3)
            return [2.0, None, 2.0]

    start = time.perf_counter()
    rewards, _, extras = score_rollout(PlainTask(), IDS, ROLLOUT, [slow_one, SlowTwo(), returning("f", [0, 0, 1])])
    assert time.perf_counter() - start < 0.55  # side by side, as TRL gathers them
    assert rewards.tolist() == [3.0, 1.0, 4.0]
    assert extras["rewards/SlowTwo/mean"][0] == 2.0 and math.isnan(extras["rewards/SlowTwo/mean"][1])


def test_trainer_state_has_the_names_of_transformers_trainer_state():
    from transformers import TrainerState as HFTrainerState

    seen = {}

    def spy(completions, trainer_state, **kwargs):
        seen["state"] = trainer_state
        return [0.0] * len(completions)

    score_rollout(PlainTask(), IDS, ROLLOUT, [spy], step=5, max_steps=9, epoch=0.25)
    for name, value in (("global_step", 5), ("max_steps", 9), ("epoch", 0.25)):
        assert hasattr(HFTrainerState(), name) and getattr(seen["state"], name) == value


def test_log_metric_and_log_extra_are_passed_as_trl_passes_them_and_collected():
    def judged(completions, log_metric, log_extra, **kwargs):
        log_metric("judge/calls", 3)
        log_metric("judge/calls", 1)
        log_extra("verdict", ["ok", "bad", "ok"])
        return [1.0, 0.0, 1.0]

    log = RewardLog()
    score_rollout(PlainTask(), IDS, ROLLOUT, [judged], log=log)
    assert log.metrics == {"judge/calls": [3.0, 1.0]} and log.columns == {"verdict": ["ok", "bad", "ok"]}
    score_rollout(PlainTask(), IDS, ROLLOUT, [judged])  # without a log to fill: still callable

    def bad_metric(completions, log_metric, **kwargs):
        log_metric("judge/calls", "many")
        return [1.0] * 3

    with pytest.raises(RewardError, match=r"^reward function bad_metric raised TypeError: log_metric\('judge/calls', "
                                          r"'many'\): the value must be a number"):
        score_rollout(PlainTask(), IDS, ROLLOUT, [bad_metric])


# -- what a reward function may do wrong ---------------------------------------------------------------

@pytest.mark.parametrize("value", [1e308, -1e39])
def test_a_reward_beyond_float32_is_refused_naming_the_function_and_the_value(value):
    with pytest.raises(RewardError, match=rf"^reward function f returned {re.escape(repr(value))} at index 1 "
                                          rf"\(prompt 'Q1', completion 'twelve'\): beyond float32's range"):
        score_rollout(PlainTask(), IDS, ROLLOUT, [returning("f", [1.0, value, 1.0])])


def test_a_weighted_reward_beyond_float32_is_refused():
    with pytest.raises(RewardError, match=r"^the weighted reward of completion 0 \(prompt 'Q0', completion '12'\) is "
                                          r"1e\+40: beyond float32's range"):
        score_rollout(PlainTask(), IDS, ROLLOUT, RewardFunctions([returning("f", [1e10] * 3)], [1e30]))


@pytest.mark.parametrize("value, kind", [(True, "bool"), (np.bool_(False), "numpy.bool_?"), ("1.5", "str"),
                                         ({"score": 1.0}, "dict"), ([1.0], "list"),
                                         (torch.tensor([1.0, 2.0]), "torch.Tensor"),
                                         (torch.tensor(True), "torch.Tensor")])
def test_a_reward_that_is_not_a_number_is_refused_naming_the_function_the_index_and_the_type(value, kind):
    with pytest.raises(RewardError, match=rf"^reward function f returned a {kind} \(.*\) at index 1 \(prompt 'Q1', "
                                          rf"completion 'twelve'\); a reward is a number"):
        score_rollout(PlainTask(), IDS, ROLLOUT, [returning("f", [1.0, value, 1.0])])


def test_numpy_and_torch_scalars_are_numbers():
    scalars = [np.float32(0.5), np.int64(2), torch.tensor(1.5, dtype=torch.float64)]
    rewards, _, _ = score_rollout(PlainTask(), IDS, ROLLOUT, [returning("f", scalars)])
    assert rewards.tolist() == [0.5, 2.0, 1.5]


class Lines(logging.Handler):
    """The lines logged to lmrl's logger while in a `with` block."""

    def __enter__(self):
        self.lines, logger = [], logging.getLogger("lmrl")
        self.level = logger.level
        logger.setLevel(logging.INFO)  # what a run's logging sets up
        logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("lmrl").removeHandler(self)
        logging.getLogger("lmrl").setLevel(self.level)

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_function_over_the_time_limit_is_left_out_of_that_batch_and_the_run_goes_on():
    release, calls = threading.Event(), []

    def stuck(completions, **kwargs):
        calls.append(1)
        release.wait(10)
        return [5.0] * len(completions)

    reward = RewardFunctions([stuck, returning("g", [1.0, 2.0, 3.0])], timeout_s=0.2)
    log = RewardLog()
    with Lines() as logged:
        start = time.perf_counter()
        rewards, _, extras = score_rollout(PlainTask(), IDS, ROLLOUT, reward, log=log)
        assert time.perf_counter() - start < 2
    assert rewards.tolist() == [1.0, 2.0, 3.0]  # g's alone: stuck's count as None (not applicable)
    assert extras["rewards/stuck/mean"].isnan().all() and log.timed_out == ["stuck"]
    assert logged.lines == ["reward function stuck took longer than reward.funcs_timeout_s=0.2s on a batch of 3: its "
                            "rewards are left out of this batch (the call runs on in the background)"]

    # alone, it leaves every completion unscored: NaN, for the trainer to leave out (`fill_unscored`)
    alone = RewardFunctions([stuck], timeout_s=0.2)
    log = RewardLog()
    with Lines() as logged:
        rewards, _, _ = score_rollout(PlainTask(), IDS, ROLLOUT, alone, log=log)
    assert rewards.isnan().all() and log.timed_out == ["stuck"]
    assert len(calls) == 2 and "still running its call" not in logged.lines[0]
    with Lines() as logged:  # its last call has not returned: not called again meanwhile
        assert score_rollout(PlainTask(), IDS, ROLLOUT, alone)[0].isnan().all()
    assert len(calls) == 2 and "is still running its call on an earlier batch" in logged.lines[0]
    release.set()
    for _ in range(100):
        if not any(t.is_alive() for t in alone._running.values()):
            break
        time.sleep(0.05)
    assert score_rollout(PlainTask(), IDS, ROLLOUT, alone)[0].tolist() == [5.0, 5.0, 5.0]


def test_a_function_with_math_verifys_default_timeouts_runs_in_the_main_thread():
    from math_verify import parse

    def parsed(completions, **kwargs):  # parse's default timeout sets a SIGALRM handler: main thread only
        return [float(len(parse(c)) > 0) for c in completions]

    reward = RewardFunctions([parsed])
    with Lines() as logged:
        assert score_rollout(PlainTask(), IDS, ROLLOUT, reward)[0].tolist() == parsed(PlainTask.completions)
    assert reward._in_caller == {0} and "works in the main thread only" in logged.lines[0]


def test_an_unscored_completion_takes_its_prompts_mean_reward():
    rewards, unscored = fill_unscored(torch.tensor([1.0, math.nan, 3.0, 5.0, math.nan, math.nan]),
                                      torch.tensor([0, 0, 1, 1, 2, 2]))
    assert rewards.tolist() == [1.0, 1.0, 3.0, 5.0, 0.0, 0.0]  # no scored completion: 0
    assert unscored.tolist() == [False, True, False, False, True, True]


def test_a_stuck_reward_function_does_not_stop_training(tiny_config):
    release = threading.Event()

    def stuck(completions, **kwargs):
        release.wait(10)
        return [1.0] * len(completions)

    cfg = tiny_config("train.steps=2", "sft.steps=0", "reward.funcs_timeout_s=0.1")
    try:
        RLTrainer(cfg, reward_funcs=[stuck]).train()
    finally:
        release.set()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2 and all(r["rewards/timed_out"] == 1 and "reward" not in r for r in steps)
    assert "reward function stuck took longer than" in (cfg.run_dir / "train.log").read_text()


def test_reward_funcs_named_in_the_config_are_loaded_with_their_weights(tmp_path):
    cfg = load_config(None, ["reward.funcs=[tests.trl_rewards:reward_len, tests.trl_rewards:Constant]",
                             "reward.weights=[1, 2]"])
    reward = build_reward(cfg.reward)
    assert reward.names == ["reward_len", "Constant"] and reward.weights == [1.0, 2.0]
    assert score_rollout(PlainTask(), IDS, ROLLOUT, reward)[0].tolist() == [-17.0, -13.0, -1.0]

    (tmp_path / "run.yaml").write_text("base: adder\nreward:\n  funcs:\n    - tests.trl_rewards:math_format_reward\n")
    reward = build_reward(load_config(tmp_path / "run.yaml").reward)
    assert reward.names == ["math_format_reward"] and reward.weights == [1.0]


def test_a_reward_func_that_cannot_be_loaded_is_one_line_naming_it():
    cfg = load_config(None, ["reward.funcs=[tests.trl_rewards:missing]"])
    with pytest.raises(RewardError,
                       match=r"^reward.funcs='tests.trl_rewards:missing': cannot load it \(AttributeError"):
        build_reward(cfg.reward)


@pytest.mark.parametrize("overrides, message", [
    (["reward.funcs=[tests.trl_rewards:reward_len]", "reward.weights=[1, 2]"], "2 weights for 1 reward.funcs"),
    (["reward.funcs=[tests.trl_rewards:reward_len]", "reward.cls=tests.trl_rewards:Constant"],
     "set one of reward.model, reward.cls and reward.funcs"),
    (["reward.funcs=[reward_len]"], "must look like package.module:function"),
    (["reward.funcs=[tests.trl_rewards:reward_len]", "reward.weights=[high]"], "must be finite numbers"),
])
def test_bad_reward_funcs_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_trl_quick_start_reward_trains_the_adder_through_reward_fn(tiny_config):
    cfg = tiny_config("train.steps=2", "sft.steps=1")
    RLTrainer(cfg, reward_fn=reward_len).train()  # f(completions, **kwargs) raised TypeError before
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "train/avg_reward" in r and r["step"] > 1]
    assert len(rl) == 2 and all(r["train/avg_reward"] == -17.0 for r in rl)  # 3-character answers: -|20 - 3|


# -- training a tiny Hugging Face model on a chat math task ------------------------------------------

@pytest.fixture(scope="module")
def tiny_math(tmp_path_factory):
    """A 2-layer Llama with a chat template, and math rows of two kinds (the `kind` column)."""
    root = tmp_path_factory.mktemp("trl-rewards")
    save_tiny_llama(root / "model", max_positions=256)
    (root / "data").mkdir()
    for name, n in (("train", 16), ("test", 4)):
        rows = [{"prompt": f"What is {i} + {i + 1}?", "ground_truth": str(2 * i + 1), "kind": ("math", "chat")[i % 2]}
                for i in range(n)]
        (root / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _math_config(root, run_dir, *overrides):
    return load_config("math-grpo-smollm2", [
        f"model.path={root / 'model'}", f"task.train_file={root / 'data' / 'train.jsonl'}",
        f"task.test_file={root / 'data' / 'test.jsonl'}", f"run.dir={run_dir}", "lora.r=4",
        "lora.target_modules=[all-linear]", "task.max_new_tokens=6", "train.steps=2", "train.rollout_size=8",
        "algo.group_size=4", "train.eval_every=2", "eval.size=4", "eval.batch_size=4", "run.progress=false",
        "run.tensorboard=false", "run.threads=1", "optim.lr=1e-2", "train.log_every=1", *overrides])


class Recorder:
    """Wraps a reward function: records what it was called with and what it returned."""

    def __init__(self, func):
        self.func, self.__name__, self.calls = func, func.__name__, []

    def __call__(self, **kwargs):
        out = self.func(**kwargs)
        self.calls.append((kwargs, out))
        return out


def test_trl_reward_functions_train_a_chat_math_task_for_two_steps(tiny_math, tmp_path):
    length, fmt = Recorder(reward_len), Recorder(math_format_reward)
    trainer = RLTrainer(_math_config(tiny_math, tmp_path / "run"), reward_funcs=[length, fmt],
                        reward_weights=[0.1, 1.0])
    trainer.train()

    assert len(length.calls) == len(fmt.calls) == 2  # once per RL step; evaluation keeps the task's reward
    for step, ((kwargs, lengths), (_, formats)) in enumerate(zip(length.calls, fmt.calls)):
        assert kwargs["trainer_state"].global_step == step and kwargs["trainer_state"].max_steps == 2
        assert kwargs["trainer_state"].epoch == step * 2 / 16  # 2 prompts a step of 16 training rows
        assert all(p[-1]["role"] == "user" and p[-1]["content"].startswith("What is") for p in kwargs["prompts"])
        texts = trainer.task.tokenizer.batch_decode(kwargs["completion_ids"], skip_special_tokens=True)
        assert [c for c in kwargs["completions"]] == [[{"role": "assistant", "content": t}] for t in texts]
        assert len(kwargs["ground_truth"]) == len(kwargs["kind"]) == 8
        assert [f is None for f in formats] == [k != "math" for k in kwargs["kind"]]
    assert any(k == "chat" for kw, _ in fmt.calls for k in kw["kind"])  # None did occur

    # the logged mean reward is the weighted sum with None left out: 0.1·len + 1.0·format
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["train/avg_reward"] for r in rows if "train/avg_reward" in r]
    expected = [sum(0.1 * a + (b or 0.0) for a, b in zip(lengths, formats)) / 8
                for (_, lengths), (_, formats) in zip(length.calls, fmt.calls)]
    assert logged == pytest.approx(expected, abs=1e-5)
    # each function's mean over the rows it scored (None rows left out), as TRL logs it
    steps = [r for r in rows if "train/avg_reward" in r]
    for row, (_, lengths), (_, formats) in zip(steps, length.calls, fmt.calls):
        assert row["rewards/reward_len/mean"] == pytest.approx(sum(lengths) / len(lengths), abs=1e-5)
        scored = [f for f in formats if f is not None]
        if scored:
            assert row["rewards/math_format_reward/mean"] == pytest.approx(sum(scored) / len(scored), abs=1e-5)
        else:
            assert "rewards/math_format_reward/mean" not in row
    moved = [n for n, p in trainer.model.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert moved, "the adapter did not train"


class Episodes(Callback):
    def __init__(self):
        self.seen = []

    def on_episode_end(self, trainer, episode):
        self.seen.append((episode.completion, episode.reward))


def test_reward_funcs_from_the_config_train_a_chat_math_task(tiny_math, tmp_path):
    cfg = _math_config(tiny_math, tmp_path / "run", "train.steps=1", "reward.weights=[1, 2]",
                       "reward.funcs=[tests.trl_rewards:reward_len, tests.trl_rewards:Constant]")
    episodes = Episodes()
    trainer = RLTrainer(cfg, callbacks=[episodes])
    assert trainer.reward_fn.names == ["reward_len", "Constant"]
    trainer.train()
    assert len(episodes.seen) == 8
    for completion, reward in episodes.seen:  # 1·reward_len + 2·0.5
        assert reward == -abs(20 - len(completion)) + 1.0


def test_a_reward_model_scores_a_chat_tasks_messages_as_it_scores_their_text(rm):
    scorer = RewardModelScorer(rm[1])  # trained to prefer 'yes' (tests/test_rlhf.py)
    as_text = scorer(["What is 1+2?", "What is 3+3?"], ["yes", "no"])
    as_messages = scorer([[{"role": "user", "content": "What is 1+2?"}], [{"role": "user", "content": "What is 3+3?"}]],
                         [[{"role": "assistant", "content": "yes"}], [{"role": "assistant", "content": "no"}]])
    assert as_messages == pytest.approx(as_text, abs=1e-5)
