"""Held-out metrics per data source, as verl logs val-core/<data_source>/reward/mean@1: a task whose rows
name their `data_source` (math, prompts) also reports eval/<source>/accuracy and eval/<source>/reward,
each the mean over that source's rows, the same on every rank; a task without sources reports nothing new."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmrl.common.errors import ConfigError
from lmrl.config import load_config
from lmrl.generation.rollout import Rollout
from lmrl.tasks.math_task import MathTask
from lmrl.tasks.protocol import Sourced
from lmrl.train.evaluate import (MAX_SOURCES, evaluate, reported_sources, row_source_keys, source_key, source_means,
                                 source_sums)
from lmrl.train.rl_trainer import RLTrainer
from tests.test_hf import save_tiny_llama
from tests.test_verl_openrlhf import verl_row, write_jsonl, write_parquet


class ScriptedTask:
    """Held-out rows 0..n-1 with fixed sources, rewards and exact-match flags: `evaluate` without a model."""

    max_new_tokens = 2

    def __init__(self, sources, rewards, exact):
        self.sources, self.rewards, self.exact = list(sources), torch.tensor(rewards), torch.tensor(exact)
        self.heldout_ids = torch.arange(len(self.sources))

    def row_sources(self, ids):
        sources = [self.sources[i] for i in ids.tolist()]
        return sources if any(s is not None for s in sources) else None

    def sample_train_ids(self, n, generator):
        raise AssertionError("evaluation draws no training rows")

    def rollout(self, policy, ids, **_):
        b = len(ids)
        return Rollout(prompts=torch.zeros(b, 1, dtype=torch.long), completions=torch.zeros(b, 2, dtype=torch.long),
                       logprobs=torch.zeros(b, 2), mask=torch.ones(b, 2))

    def score_rollout(self, ids, rollout):
        return self.rewards[ids], self.exact[ids], {}

    def texts(self, ids, rollout):
        return [""] * len(ids), [""] * len(ids)

    def reward_kwargs(self, ids):
        return {}


class Unsourced(ScriptedTask):
    """The same rows through a task that does not name sources at all (no `row_sources`)."""

    row_sources = None


def mean(values):
    return sum(values) / len(values)


# -- names ------------------------------------------------------------------------------------------------

def test_a_source_key_keeps_letters_digits_underscore_dash_and_dot_and_makes_the_rest_underscores():
    assert source_key("openai/gsm8k") == "openai_gsm8k"
    assert source_key("lighteval/MATH-hard_v1.2") == "lighteval_MATH-hard_v1.2"
    assert source_key("my data:set é") == "my_data_set__"


def test_rows_without_a_source_or_with_an_empty_one_have_no_key():
    task = ScriptedTask(["a/b", None, "", "c"], [0.0] * 4, [0.0] * 4)
    assert row_source_keys(task, task.heldout_ids) == ["a_b", None, None, "c"]
    assert row_source_keys(Unsourced(["a"], [0.0], [0.0]), torch.arange(1)) == []


# -- the means ---------------------------------------------------------------------------------------------

SOURCES = ["openai/gsm8k", "lighteval/MATH", "openai/gsm8k", None, "lighteval/MATH", "openai/gsm8k", "solo"]
REWARDS = [1.0, 0.25, 0.5, 0.75, 0.0, 0.0, 0.4]
EXACT = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def by_hand(name):
    """{accuracy, reward}: the means over the rows of source `name` (SOURCES, REWARDS, EXACT)."""
    rows = [i for i, s in enumerate(SOURCES) if s == name]
    return {"accuracy": mean([EXACT[i] for i in rows]), "reward": mean([REWARDS[i] for i in rows])}


def test_each_sources_metrics_are_the_means_over_its_rows_and_rows_without_one_count_only_overall():
    out = evaluate(None, ScriptedTask(SOURCES, REWARDS, EXACT), torch.arange(len(SOURCES)), batch_size=2)
    for source, key in [("openai/gsm8k", "openai_gsm8k"), ("lighteval/MATH", "lighteval_MATH"), ("solo", "solo")]:
        want = by_hand(source)
        assert out[f"eval/{key}/accuracy"] == pytest.approx(want["accuracy"])
        assert out[f"eval/{key}/reward"] == pytest.approx(want["reward"])
    assert out["eval/accuracy"] == pytest.approx(mean(EXACT)) and out["eval/reward"] == pytest.approx(mean(REWARDS))
    assert {k for k in out if k.count("/") == 2} == {f"eval/{s}/{m}" for s in ("openai_gsm8k", "lighteval_MATH", "solo")
                                                    for m in ("accuracy", "reward")}


def test_a_nan_accuracy_is_left_out_of_its_sources_mean():
    rows = {"accuracy": torch.tensor([1.0, float("nan"), 0.0, 1.0]), "reward": torch.tensor([1.0, 0.5, 0.0, 2.0])}
    sums = source_sums(["a", "a", "b", None], ["a", "b"], rows)
    assert source_means(["a", "b"], sums) == {"eval/a/accuracy": 1.0, "eval/a/reward": 0.75,
                                              "eval/b/accuracy": 0.0, "eval/b/reward": 0.0}


def test_a_task_without_sources_reports_no_new_metric_and_the_same_numbers():
    ids = torch.arange(len(SOURCES))
    plain = evaluate(None, Unsourced(SOURCES, REWARDS, EXACT), ids, batch_size=2)
    unnamed = evaluate(None, ScriptedTask([None] * len(SOURCES), REWARDS, EXACT), ids, batch_size=2)
    named = evaluate(None, ScriptedTask(SOURCES, REWARDS, EXACT), ids, batch_size=2)
    assert plain == unnamed == {k: v for k, v in named.items() if k.count("/") == 1}
    assert set(plain) == {"eval/accuracy", "eval/reward", "eval/length_mean"}


def test_more_sources_than_the_cap_report_none_and_say_so_in_one_line():
    n = MAX_SOURCES + 1
    keys = [f"s{i}" for i in range(n)]
    assert reported_sources(keys) == ([], f"the held-out rows name {n} data sources (data_source), more than "
                                          f"{MAX_SOURCES}: evaluation reports no per-source metrics (eval/<source>/...)")
    assert reported_sources(keys[:MAX_SOURCES]) == (sorted(keys[:MAX_SOURCES]), "")
    out = evaluate(None, ScriptedTask(keys, [1.0] * n, [1.0] * n), torch.arange(n), batch_size=8)
    assert set(out) == {"eval/accuracy", "eval/reward", "eval/length_mean"}


# -- two ranks ----------------------------------------------------------------------------------------------

def _evaluate_on_rank(rank, port, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = evaluate(None, ScriptedTask(SOURCES, REWARDS, EXACT), torch.arange(len(SOURCES)), batch_size=2,
                   rank=rank, world_size=2)
    (path / f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def test_two_gloo_ranks_report_what_one_process_does_even_for_a_source_one_rank_never_sees(tmp_path):
    assert "solo" in SOURCES[0::2] and "solo" not in SOURCES[1::2]  # in rank 0's share alone
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_evaluate_on_rank, args=(port, tmp_path), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    alone = evaluate(None, ScriptedTask(SOURCES, REWARDS, EXACT), torch.arange(len(SOURCES)), batch_size=2)
    assert ranks[0] == ranks[1]
    assert ranks[0] == pytest.approx(alone)
    assert ranks[0]["eval/solo/reward"] == pytest.approx(0.4)


# -- the file tasks -------------------------------------------------------------------------------------------

def test_math_rows_take_their_source_from_data_source_in_jsonl_and_verl_parquet(tmp_path):
    rows = [{"prompt": "1+1?", "ground_truth": "2", "data_source": "openai/gsm8k"},
            {"prompt": "2+2?", "ground_truth": "4"},
            {"prompt": "3+3?", "ground_truth": "6", "data_source": "lighteval/MATH"}]
    task = MathTask(None, str(write_jsonl(tmp_path / "test.jsonl", rows)), None, chat=False)
    assert isinstance(task, Sourced)
    assert task.row_sources(task.heldout_ids) == ["openai/gsm8k", None, "lighteval/MATH"]
    verl_text = {**verl_row(0, "3 + 4?", "7", "test"), "prompt": "3 + 4?"}  # a text prompt: no chat template here
    verl = MathTask(None, str(write_parquet(tmp_path / "test.parquet", [verl_text])), None, chat=False)
    assert verl.row_sources(verl.heldout_ids) == ["openai/gsm8k"]
    plain = MathTask(None, str(write_jsonl(tmp_path / "plain.jsonl", [rows[1]])), None, chat=False)
    assert plain.row_sources(plain.heldout_ids) is None


def test_math_rows_without_data_source_evaluate_with_no_new_metric(tmp_path, monkeypatch):
    rows = [{"prompt": f"{i}+1?", "ground_truth": str(i + 1)} for i in range(3)]
    task = MathTask(None, str(write_jsonl(tmp_path / "test.jsonl", rows)), None, chat=False)
    monkeypatch.setattr(task, "rollout", lambda policy, ids, **_: ScriptedTask([], [], []).rollout(policy, ids))
    monkeypatch.setattr(task, "score_rollout", lambda ids, ro: (torch.ones(len(ids)), torch.ones(len(ids)),
                                                                {"format_rate": torch.ones(len(ids))}))
    assert set(evaluate(None, task, task.heldout_ids)) == {"eval/accuracy", "eval/reward", "eval/length_mean",
                                                          "eval/format_rate"}


# -- a run ----------------------------------------------------------------------------------------------------

HELD_OUT = {8: ("openai/gsm8k", 1.0, 1.0), 9: ("lighteval/MATH", 0.25, 1.0), 10: ("openai/gsm8k", 0.5, 0.0),
            11: (None, 0.75, 1.0), 12: ("lighteval/MATH", 0.0, 0.0), 13: ("openai/gsm8k", 0.0, 1.0)}  # id: (source, reward, exact)


def scripted_score(self, ids, rollout):
    """MathTask.score_rollout with each held-out row's reward and verdict fixed by HELD_OUT (training rows: 0)."""
    rewards = torch.tensor([HELD_OUT.get(i, (None, 0.0, 0.0))[1] for i in ids.tolist()])
    exact = torch.tensor([HELD_OUT.get(i, (None, 0.0, 0.0))[2] for i in ids.tolist()])
    return rewards, exact, {"format_rate": torch.zeros(len(ids))}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-sources")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


def _config(model, tmp_path, held_out: list[dict], *overrides):
    train = [{"prompt": f"What is {i} + 1?", "ground_truth": str(i + 1)} for i in range(8)]
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "test.jsonl", held_out)
    return load_config("math-grpo-smollm2", [
        f"model.path={model}", f"task.train_file={tmp_path / 'train.jsonl'}", f"task.test_file={tmp_path / 'test.jsonl'}",
        f"run.dir={tmp_path / 'run'}", "lora.r=4", "lora.target_modules=[all-linear]", "task.max_new_tokens=4",
        "train.steps=1", "train.rollout_size=4", "algo.group_size=4", "train.eval_every=1", "train.ckpt_every=1",
        f"eval.size={len(held_out)}", "eval.batch_size=4", "run.progress=false", "run.tensorboard=false",
        "run.threads=1", *overrides])


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_math_run_logs_each_sources_accuracy_and_reward_and_keeps_the_best_by_one(tiny_model, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr(MathTask, "score_rollout", scripted_score)
    held_out = [{"prompt": f"What is {i} + 2?", "ground_truth": str(i + 2),
                 **({"data_source": source} if source else {})} for i, (source, _, _) in sorted(HELD_OUT.items())]
    cfg = _config(tiny_model, tmp_path, held_out, "train.best_metric=eval/lighteval_MATH/reward")
    summary = RLTrainer(cfg).train()

    evals = [row for row in _rows(cfg.run_dir) if "eval/accuracy" in row]
    assert len(evals) == 1  # step 1's; the start's is summary.json's start_eval
    for row in evals + [summary["start_eval"]]:
        for source, key in [("openai/gsm8k", "openai_gsm8k"), ("lighteval/MATH", "lighteval_MATH")]:
            mine = [v for v in HELD_OUT.values() if v[0] == source]
            assert row[f"eval/{key}/accuracy"] == pytest.approx(mean([exact for _, _, exact in mine]))
            assert row[f"eval/{key}/reward"] == pytest.approx(mean([reward for _, reward, _ in mine]))
        assert row["eval/accuracy"] == pytest.approx(mean([exact for _, _, exact in HELD_OUT.values()]))
        assert {k for k in row if k.startswith("eval/") and k.count("/") == 2} == {
            "eval/openai_gsm8k/accuracy", "eval/openai_gsm8k/reward", "eval/lighteval_MATH/accuracy",
            "eval/lighteval_MATH/reward"}
    assert summary["best"]["value"] == pytest.approx(0.125)


def test_a_misspelled_source_metric_stops_at_the_first_evaluation_naming_the_right_one(tiny_model, tmp_path):
    held_out = [{"prompt": "What is 1 + 2?", "ground_truth": "3", "data_source": "openai/gsm8k"}]
    cfg = _config(tiny_model, tmp_path, held_out, "train.best_metric=eval/openai_gsm8/accuracy")
    with pytest.raises(ConfigError, match="did you mean 'eval/openai_gsm8k/accuracy'"):
        RLTrainer(cfg).train()


def test_a_run_whose_rows_name_too_many_sources_says_so_once_and_logs_none(tiny_model, tmp_path):
    n = MAX_SOURCES + 1
    held_out = [{"prompt": f"What is {i} + 2?", "ground_truth": str(i + 2), "data_source": f"set{i}"} for i in range(n)]
    cfg = _config(tiny_model, tmp_path, held_out, "eval.batch_size=64")
    RLTrainer(cfg).train()
    log = (cfg.run_dir / "train.log").read_text()
    assert log.count(f"the held-out rows name {n} data sources") == 1
    assert not [k for row in _rows(cfg.run_dir) for k in row if k.startswith("eval/set")]


def test_trls_grpo_takes_a_sources_metric_for_best_model_and_reports_it(tiny_model, tmp_path):
    from datasets import Dataset

    from lmrl.trl import GRPOTrainer
    from tests.test_trl_compat import grpo_args, reward_len

    prompts = Dataset.from_list([{"prompt": f"Say something about {w}.", "data_source": source} for w, source in
                                 [("cats", "pets"), ("dogs", "pets"), ("rain", "weather/uk"), ("tea", None)]])
    trainer = GRPOTrainer(model=str(tiny_model), reward_funcs=reward_len, train_dataset=prompts,
                          args=grpo_args(tmp_path, metric_for_best_model="eval_weather_uk/reward"))
    metrics = trainer.evaluate()
    assert {"eval_pets/accuracy", "eval_pets/reward", "eval_weather_uk/accuracy", "eval_weather_uk/reward"} <= set(metrics)
    with pytest.raises(ConfigError, match="eval_weather_uk/reward"):
        GRPOTrainer(model=str(tiny_model), reward_funcs=reward_len, train_dataset=prompts,
                    args=grpo_args(tmp_path / "g", metric_for_best_model="eval_weather/reward"))
