"""A verl or OpenRLHF user's data files and reward functions, taken as they are: verl's parquet (or
JSONL) rows with a message-list `prompt` and `reward_model.ground_truth`, OpenRLHF's rows named by
task.prompt_key / task.label_key, verl's per-sample `compute_score` and OpenRLHF's batch `reward_func`
(also loaded from a .py file), and DAPO's overlong penalty. The last tests train a tiny local model."""

from __future__ import annotations

import json
import re
import sys

import pyarrow
import pyarrow.parquet
import pytest
import torch
import yaml

from lmrl.common.data import DataError, iter_file_rows, prompt_row, read_jsonl
from lmrl.config import ConfigError, load_config
from lmrl.generation.rollout import Rollout
from lmrl.tasks.math_task import read_rows
from lmrl.tasks.prepare_data import prepare
from lmrl.tasks.prompt_task import PromptTask, prompt_rows
from lmrl.tasks.rewards import (RewardError, RewardFunctions, build_reward, foreign_style, load_file_module,
                                load_reward_class, load_reward_function, overlong_penalty, score_rollout)
from lmrl.train.callbacks import Callback
from lmrl.train.inspect import load_run
from lmrl.train.rl_trainer import RLTrainer
from tests.test_hf import save_tiny_llama

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
QUESTIONS = [("What is 3 + 4?", "7"), ("What is 10 - 2?", "8"), ("What is 6 * 2?", "12"), ("What is 9 + 9?", "18")]


def verl_row(i: int, question: str, answer: str, split: str = "train") -> dict:
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i, "answer": f"... #### {answer}", "question": question}}


def write_parquet(path, rows):
    """`rows` as a parquet file with a column for every key of any row (null where a row has none), as
    pandas and datasets write them."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    pyarrow.parquet.write_table(pyarrow.Table.from_pydict({k: [row.get(k) for row in rows] for k in keys}), path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- data files: parquet, verl's layout, named keys -------------------------------------------------

def test_verl_parquet_rows_read_as_math_rows_with_every_column_kept(tmp_path):
    rows = [verl_row(i, q, a) for i, (q, a) in enumerate(QUESTIONS)]
    read = read_rows(str(write_parquet(tmp_path / "train.parquet", rows)))
    assert read[1] == {"data_source": "openai/gsm8k", "messages": rows[1]["prompt"], "ability": "math",
                       "reward_model": {"style": "rule", "ground_truth": "8"}, "extra_info": rows[1]["extra_info"],
                       "ground_truth": "8"}
    assert read == read_rows(str(write_jsonl(tmp_path / "train.jsonl", rows)))  # the same rows as JSONL


def test_a_parquet_file_is_told_by_its_suffix_or_its_magic_bytes(tmp_path):
    rows = [{"prompt": "a", "ground_truth": "1"}]
    unnamed = write_parquet(tmp_path / "train.data", rows)
    assert [where for where, _ in iter_file_rows(unnamed)] == [f"{unnamed}:row 0"]
    named = write_jsonl(tmp_path / "train.jsonl", rows)
    assert [where for where, _ in iter_file_rows(named)] == [f"{named}:1"]


def test_a_bad_parquet_row_is_one_line_naming_the_file_and_the_row(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "a"}], "ground_truth": "1"},
            {"prompt": [{"role": "user", "content": "b"}], "reward_model": {"ground_truth": 2}}]
    path = write_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataError) as e:
        read_rows(str(path))
    assert str(e.value) == (f"{path}:row 1: 'reward_model.ground_truth' (the row's ground truth) must be a string, "
                            f'got a number (write it as "2")')
    rows = [verl_row(0, "q", "7"), {**verl_row(1, "q", "2"), "prompt": []}]
    path = write_parquet(tmp_path / "empty_prompt.parquet", rows)
    with pytest.raises(DataError) as e:
        read_rows(str(path))
    assert str(e.value) == (f"{path}:row 1: 'prompt' must be a string or a non-empty list of {{role, content}} "
                            f"objects, got an empty list")
    rows = [{"prompt": "a", "ground_truth": "1"}, {"prompt": "b", "label": "2"}]
    path = write_parquet(tmp_path / "no_answer.parquet", rows)
    with pytest.raises(DataError) as e:
        read_rows(str(path))
    assert str(e.value) == (f"{path}:row 1: missing key 'ground_truth' (or verl's reward_model.ground_truth) (the row "
                            f"has keys: 'prompt', 'label'); set task.label_key to the key that holds the answer")


def test_a_null_parquet_cell_is_an_absent_key(tmp_path):
    """Parquet gives every row every column: a text-prompt row and a messages row share one file."""
    rows = [{"prompt": "a", "ground_truth": "1"}, {"messages": [{"role": "user", "content": "b"}], "ground_truth": "2"}]
    assert read_rows(str(write_parquet(tmp_path / "mixed.parquet", rows))) == rows


def test_a_damaged_or_empty_parquet_file_is_one_line_naming_it(tmp_path):
    damaged = tmp_path / "train.parquet"
    damaged.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=rf"^{re.escape(str(damaged))}: not a readable parquet file \(.*\)$"):
        read_rows(str(damaged))
    empty = tmp_path / "empty.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"prompt": pyarrow.array([], pyarrow.string())}), empty)
    with pytest.raises(DataError, match=rf"^{re.escape(str(empty))}: the file has no rows \(it is empty\)$"):
        read_rows(str(empty))
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        read_rows(str(tmp_path / "missing.parquet"))


def test_a_file_that_is_neither_gets_the_jsonl_errors(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "a", "ground_truth": "1"}\n\xff\xfe\n')
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: not UTF-8 text"):
        read_rows(str(path))


def test_openrlhf_rows_are_read_through_prompt_key_and_label_key(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"input": "What is 3 + 4?", "label": "7", "kind": "add"}])
    assert read_rows(str(path), prompt_key="input", label_key="label") == [
        {"label": "7", "kind": "add", "prompt": "What is 3 + 4?", "ground_truth": "7"}]
    with pytest.raises(DataError) as e:
        read_rows(str(path))
    assert str(e.value) == (f"{path}:1: needs one of 'prompt' | 'messages' (the row has keys: 'input', 'label', "
                            f"'kind'); set task.prompt_key to the key that holds the prompt")
    with pytest.raises(DataError) as e:
        read_rows(str(path), prompt_key="input", label_key="answer")
    assert str(e.value) == (f"{path}:1: missing key 'answer' (task.label_key) (the row has keys: 'input', 'label', "
                            f"'kind')")


def test_a_dotted_key_reads_a_nested_value_and_a_message_list_under_another_key_becomes_messages():
    row = {"context_messages": [{"role": "user", "content": "hi"}], "meta": {"answer": "5"}}
    assert prompt_row(row, "context_messages", "meta.answer") == {
        "meta": {"answer": "5"}, "messages": [{"role": "user", "content": "hi"}], "ground_truth": "5"}


def test_the_python_path_and_the_file_path_read_a_verl_row_alike(tmp_path):
    rows = [verl_row(0, "What is 3 + 4?", "7")]
    assert prompt_rows(rows) == read_jsonl(write_jsonl(tmp_path / "t.jsonl", rows), shape=prompt_row)


def test_prompt_key_and_label_key_are_config_keys():
    cfg = load_config("math-grpo-smollm2", ["task.prompt_key=input", "task.label_key=reward_model.ground_truth"])
    assert (cfg.task.prompt_key, cfg.task.label_key) == ("input", "reward_model.ground_truth")
    with pytest.raises(ConfigError, match="task.label_key must name the key that holds each row's ground truth"):
        load_config("math-grpo-smollm2", ["task.label_key= "])


def test_prepare_data_converts_verl_rows_told_by_their_columns(tmp_path):
    src = write_parquet(tmp_path / "train.parquet", [verl_row(i, q, a) for i, (q, a) in enumerate(QUESTIONS)])
    [out] = prepare([], tmp_path / "data", hf=["someone/verl-gsm8k"], from_path=src)
    assert (out.kind, out.rows_written, out.path.name) == ("math", 4, "verl-gsm8k.jsonl")
    first = json.loads(out.path.read_text().splitlines()[0])
    assert first["messages"][0]["content"].startswith("What is 3 + 4?") and first["ground_truth"] == "7"
    assert first["data_source"] == "openai/gsm8k" and first["extra_info"]["index"] == 0
    bad = write_parquet(tmp_path / "bad.parquet", [{**verl_row(0, "q", "7"), "reward_model": {"style": "model"}}])
    with pytest.raises(DataError, match=rf"^{re.escape(str(bad))}:row 0: no ground truth \(verl's "
                                        rf"reward_model.ground_truth\)"):
        prepare([], tmp_path / "data", hf=["someone/bad"], from_path=bad)


# -- reward functions as verl and OpenRLHF write them -----------------------------------------------

class VerlTask:
    """Three completions of verl rows: prompts, completions and the rows' columns."""

    prompts = ["<user>What is 3 + 4?<assistant>", "<user>What is 10 - 2?<assistant>", "<user>Hi<assistant>"]
    completions = ["so #### 7", "#### 9", "hello"]

    def score_rollout(self, ids, rollout):
        return torch.zeros(len(ids)), torch.zeros(len(ids)), {}

    def texts(self, ids, rollout):
        return [self.prompts[i] for i in ids.tolist()], [self.completions[i] for i in ids.tolist()]

    def reward_kwargs(self, ids):
        return {"data_source": ["openai/gsm8k", "openai/gsm8k", "chat"], "ground_truth": ["7", "8", None],
                "extra_info": [{"index": 0}, {"index": 1}, None], "ability": ["math", "math", "chat"]}


IDS = torch.arange(3)
ROLLOUT = Rollout(prompts=torch.zeros(3, 1, dtype=torch.long), completions=torch.tensor([[5, 6], [7, 2], [8, 2]]),
                  logprobs=torch.zeros(3, 2), mask=torch.ones(3, 2))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's gsm8k rule, as a custom_reward_function writes it."""
    if data_source != "openai/gsm8k":
        return 0.0
    return 1.0 if solution_str.rpartition("#### ")[2] == ground_truth else 0.0


def test_verl_compute_score_is_called_once_per_completion_as_verl_calls_it():
    calls = []

    def recorded(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return compute_score(data_source, solution_str, ground_truth, extra_info)

    rewards, _, extras = score_rollout(VerlTask(), IDS, ROLLOUT, [recorded])
    assert rewards.tolist() == [1.0, 0.0, 0.0] and extras["rewards/recorded/mean"].tolist() == [1.0, 0.0, 0.0]
    assert calls == [("openai/gsm8k", "so #### 7", "7", {"index": 0}), ("openai/gsm8k", "#### 9", "8", {"index": 1}),
                     ("chat", "hello", None, None)]


def test_verl_dict_returns_give_their_score_and_log_their_other_numbers():
    def scored(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        right = solution_str.endswith(f"#### {ground_truth}")
        return {"score": right, "acc": float(right), "pred": solution_str[-1]} if data_source != "chat" else -1

    rewards, _, extras = score_rollout(VerlTask(), IDS, ROLLOUT, RewardFunctions([scored]))
    assert rewards.tolist() == [1.0, 0.0, -1.0]  # a bool score counts as 0/1, as in verl
    acc = extras["rewards/scored/acc"].tolist()
    assert acc[:2] == [1.0, 0.0] and acc[2] != acc[2]  # NaN where the completion's return had no such key
    assert "rewards/scored/pred" not in extras  # not a number: not logged


def test_verl_errors_name_the_function_and_the_sample():
    def no_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"acc": 1.0}

    with pytest.raises(RewardError) as e:
        score_rollout(VerlTask(), IDS, ROLLOUT, [no_score])
    assert str(e.value) == ("reward function no_score returned a dict without 'score' at index 0 (keys: 'acc'); verl's "
                            "compute_score returns a number or a dict whose 'score' is the reward")

    def fails_on_chat(data_source, solution_str, ground_truth, extra_info=None):
        return float(ground_truth)

    with pytest.raises(RewardError) as e:
        score_rollout(VerlTask(), IDS, ROLLOUT, [fails_on_chat])
    assert str(e.value).startswith("reward function fails_on_chat raised TypeError: float() argument must be")
    assert str(e.value).endswith("(verl's compute_score is called once per completion with keywords data_source=, "
                                 "solution_str=, ground_truth= and extra_info= (when it takes them)) (sample 2: "
                                 "prompt '<user>Hi<assistant>', completion 'hello')")


def test_an_async_verl_compute_score_is_awaited_for_each_completion():
    async def judged(data_source, solution_str, ground_truth, extra_info=None):
        return compute_score(data_source, solution_str, ground_truth, extra_info)

    assert score_rollout(VerlTask(), IDS, ROLLOUT, [judged])[0].tolist() == [1.0, 0.0, 0.0]


def test_openrlhf_reward_func_gets_queries_prompts_and_labels_once_per_batch():
    calls = []

    def reward_func(queries, prompts, labels, **kwargs):
        calls.append((queries, prompts, labels, kwargs))
        return torch.tensor([float(len(q)) for q in queries])

    rewards, _, extras = score_rollout(VerlTask(), IDS, ROLLOUT, [reward_func])
    task = VerlTask()
    assert calls == [([p + c for p, c in zip(task.prompts, task.completions)], task.prompts, ["7", "8", None], {})]
    assert rewards.tolist() == [float(len(p + c)) for p, c in zip(task.prompts, task.completions)]


def test_openrlhf_dict_returns_give_rewards_and_log_scores_and_extra_logs():
    def reward_func(queries, prompts, labels):
        right = torch.tensor([float(q.endswith(f"#### {label}")) for q, label in zip(queries, labels)])
        return {"rewards": right * 2, "scores": right, "extra_logs": {"accuracy": right.mean(), "per_row": right}}

    rewards, _, extras = score_rollout(VerlTask(), IDS, ROLLOUT, [reward_func])
    assert rewards.tolist() == [2.0, 0.0, 0.0]
    assert extras["rewards/reward_func/scores"].tolist() == [1.0, 0.0, 0.0]
    assert extras["rewards/reward_func/accuracy"].tolist() == pytest.approx([1 / 3] * 3)  # one value for the batch
    assert extras["rewards/reward_func/per_row"].tolist() == [1.0, 0.0, 0.0]

    def no_rewards(queries, prompts, labels):
        return {"scores": [1, 2, 3]}

    with pytest.raises(RewardError, match=r"^reward function no_rewards returned a dict without 'rewards' \(keys: "
                                          r"'scores'\); OpenRLHF's reward_func returns the rewards or"):
        score_rollout(VerlTask(), IDS, ROLLOUT, [no_rewards])


@pytest.mark.parametrize("func, style", [
    (compute_score, "verl"),
    (lambda data_source, solution_str, ground_truth, **kw: 0.0, "verl"),
    (lambda queries, prompts, labels: [0.0], "openrlhf"),
    (lambda prompts, completions, **kw: [0.0], None),  # TRL's keywords or lmrl's positional style
    (lambda completions, **kw: [0.0], None),
])
def test_the_style_is_told_by_the_first_parameters(func, style):
    assert foreign_style(func) == style


def test_trl_and_verl_functions_mix_in_one_weighted_sum():
    def reward_len(completions, **kwargs):
        return [float(len(c)) for c in completions]

    rewards, _, _ = score_rollout(VerlTask(), IDS, ROLLOUT, RewardFunctions([reward_len, compute_score], [0.5, 2.0]))
    assert rewards.tolist() == [0.5 * 9 + 2.0, 0.5 * 6, 0.5 * 5]


def test_reward_funcs_load_a_function_from_a_python_file(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, "
                                           "extra_info=None):\n    return 1.0\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    monkeypatch.chdir(tmp_path)
    func = load_reward_function("my_reward.py:compute_score")  # relative to the current directory
    assert func("openai/gsm8k", "#### 7", "7") == 1.0 and foreign_style(func) == "verl"
    assert load_reward_function(f"{tmp_path}/my_reward.py:compute_score") is func  # one module per file
    assert sys.modules[func.__module__] is load_file_module("my_reward.py")
    with pytest.raises(RewardError, match=r"^reward.funcs='my_reward.py:missing': cannot load it \(AttributeError: "):
        load_reward_function("my_reward.py:missing")
    with pytest.raises(RewardError, match=r"^reward.funcs='nowhere.py:f': cannot load it \(FileNotFoundError: no file "
                                          r"nowhere.py \(from "):
        load_reward_function("nowhere.py:f")
    with pytest.raises(RewardError, match=r"^reward.funcs='broken.py:f': cannot load it \(SyntaxError: "):
        load_reward_function("broken.py:f")


# -- DAPO's overlong penalty -----------------------------------------------------------------------

def test_overlong_penalty_matches_dapos_formula_by_hand():
    # max 10 tokens, the last 4 a buffer: no penalty up to 6, then -0.5 · (L - 6) / 4, at most -0.5
    penalty = overlong_penalty(10, 4, penalty_factor=0.5)
    lengths = [1, 6, 7, 8, 10, 12]
    assert penalty(completion_ids=[[0] * n for n in lengths]) == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]
    assert penalty.__name__ == "overlong_penalty"
    assert overlong_penalty(8, 8)(completion_ids=[[1] * 2]) == [-0.25]  # the whole length a buffer, factor 1


def test_overlong_penalty_is_added_to_the_answers_score():
    penalty = overlong_penalty(2, 1, penalty_factor=1.0)  # every completion here is 2 tokens: -1
    rewards, _, extras = score_rollout(VerlTask(), IDS, ROLLOUT, [compute_score, penalty])
    assert rewards.tolist() == [0.0, -1.0, -1.0] and extras["rewards/overlong_penalty/mean"].tolist() == [-1.0] * 3


def test_overlong_penalty_is_named_in_yaml_through_a_module_that_binds_its_arguments(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("from lmrl.tasks.rewards import overlong_penalty\n"
                                            "overlong = overlong_penalty(10, 4, 0.5)\n")
    monkeypatch.chdir(tmp_path)
    reward = build_reward(load_config(None, ["reward.funcs=[my_rewards.py:overlong]"]).reward)
    assert reward.names == ["overlong_penalty"] and reward.styles == ["trl"]
    with pytest.raises(RewardError, match=r"^reward.funcs='lmrl.tasks.rewards:overlong_penalty' makes a reward "
                                          r"function from its arguments: bind them in a module of your own"):
        load_reward_function("lmrl.tasks.rewards:overlong_penalty")


@pytest.mark.parametrize("args, message", [
    ((0, 1), "max_completion_length must be a whole number of tokens >= 1, got 0"),
    ((10, 11), "buffer_len=11 is longer than max_completion_length=10"),
    ((10, 4, -1.0), "penalty_factor must be a finite number >= 0, got -1.0"),
])
def test_overlong_penalty_refuses_settings_it_cannot_use(args, message):
    with pytest.raises(ValueError, match=message):
        overlong_penalty(*args)


# -- training a tiny Hugging Face model on verl's and OpenRLHF's files ------------------------------

VERL_REWARD = '''"""A verl custom reward, as verl's custom_reward_function.path loads it."""
import re

CALLS = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    m = re.search(r"#### (\\-?[0-9\\.\\,]+)", solution_str)
    answer = m.group(1).replace(",", "") if m else None
    right = answer == ground_truth
    return {"score": 1.0 if right else float(len(solution_str) % 3) / 10, "acc": right}
'''

OPENRLHF_REWARD = '''"""An OpenRLHF --remote_rm_url reward_func.py."""
import torch

CALLS = []


def reward_func(queries, prompts, labels):
    CALLS.append((queries, prompts, labels))
    reward = torch.tensor([float(len(q) % 3) for q in queries])
    return {"rewards": reward, "scores": reward, "extra_logs": {"dummy_scores": reward}}
'''


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl-openrlhf")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


def _config(model, run_dir, train, test, *overrides):
    return load_config("math-grpo-smollm2", [
        f"model.path={model}", f"task.train_file={train}", f"task.test_file={test}", "task.generate=",
        f"run.dir={run_dir}", "lora.r=0", "task.max_new_tokens=8", "train.steps=2", "train.rollout_size=8",
        "algo.group_size=4", "train.eval_every=2", "eval.size=4", "eval.batch_size=4", "run.progress=false",
        "run.tensorboard=false", "run.threads=1", "train.log_every=1", *overrides])


class Episodes(Callback):
    def __init__(self):
        self.seen = []

    def on_episode_end(self, trainer, episode):
        self.seen.append((episode.completion, episode.reward))


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("write", [write_parquet, write_jsonl], ids=["parquet", "jsonl"])
def test_verl_files_and_compute_score_train_grpo_as_they_are(tiny_model, tmp_path, write):
    rows = [verl_row(i, q, a) for i, (q, a) in enumerate(QUESTIONS)]
    suffix = "parquet" if write is write_parquet else "jsonl"
    train, test = write(tmp_path / f"train.{suffix}", rows), write(tmp_path / f"test.{suffix}", rows[:2])
    (tmp_path / "verl_reward.py").write_text(VERL_REWARD)
    module = load_file_module(str(tmp_path / "verl_reward.py"))
    episodes = Episodes()
    cfg = _config(tiny_model, tmp_path / "run", train, test, f"reward.funcs=[{tmp_path}/verl_reward.py:compute_score]")
    RLTrainer(cfg, callbacks=[episodes]).train()

    calls = list(module.CALLS)
    assert len(calls) == 16  # 8 completions a step; evaluation keeps the math task's verifier
    for (data_source, solution, truth, extra), (completion, reward) in zip(calls, episodes.seen):
        row = rows[extra["index"]]
        assert (data_source, truth, extra) == ("openai/gsm8k", row["reward_model"]["ground_truth"], row["extra_info"])
        assert solution == completion  # the completion's text, special tokens dropped, as verl decodes it
        expected = module.compute_score(data_source, solution, truth, dict(extra))["score"]
        assert reward == pytest.approx(expected)
    steps = [r for r in _metrics(tmp_path / "run") if "train/loss" in r]
    assert len(steps) == 2 and all(r["rewards/compute_score/acc"] == 0.0 for r in steps)  # the dict's other key


def test_openrlhf_rows_and_reward_func_train_grpo_as_they_are(tiny_model, tmp_path):
    rows = [{"input": q, "label": a} for q, a in QUESTIONS]
    train, test = write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "test.jsonl", rows[:2])
    (tmp_path / "orlhf_reward.py").write_text(OPENRLHF_REWARD)
    module = load_file_module(str(tmp_path / "orlhf_reward.py"))
    cfg = _config(tiny_model, tmp_path / "run", train, test, "task.name=prompts", "task.prompt_key=input",
                  "task.label_key=label", "train.best_metric=eval/reward",
                  f"reward.funcs=[{tmp_path}/orlhf_reward.py:reward_func]")
    trainer = RLTrainer(cfg)
    assert isinstance(trainer.task, PromptTask)
    trainer.train()

    answers = dict(QUESTIONS)
    for queries, prompts, labels in module.CALLS:  # training and evaluation batches
        for query, prompt, label in zip(queries, prompts, labels):
            question = next(q for q in answers if q in prompt)  # the rendered chat prompt holds the input
            assert query.startswith(prompt) and label == answers[question]
    steps = [r for r in _metrics(tmp_path / "run") if "train/loss" in r]
    assert len(steps) == 2 and all("rewards/reward_func/dummy_scores" in r for r in steps)
    assert all(r["rewards/reward_func/scores"] == r["rewards/reward_func/mean"] for r in steps)
    # `lmrl eval RUN_DIR` scores the held-out prompts with the run's own reward.funcs, as training did
    module.CALLS.clear()
    metrics = load_run(tmp_path / "run").evaluate()
    assert metrics["heldout_problems"] == 2 and "eval/rewards/reward_func/dummy_scores" in metrics
    assert [labels for _, _, labels in module.CALLS] == [[answers[q] for q, _ in QUESTIONS[:2]]]
    saved = tmp_path / "run" / "config.yaml"  # as a run scored by reward_funcs= from Python saves it: no funcs
    config = yaml.safe_load(saved.read_text())
    config["reward"]["funcs"] = []
    saved.write_text(yaml.safe_dump(config))
    run = load_run(tmp_path / "run")  # generate and export need no reward
    with pytest.raises(ConfigError, match=r"scored by reward functions passed from Python, which its config.yaml does "
                                          r"not name; to evaluate it, set reward.funcs there"):
        run.evaluate()


# -- reward.cls: a class whose instance is a verl or OpenRLHF reward function -----------------------------------

REWARD_CLASSES = '''"""verl's and OpenRLHF's reward functions, and classes whose instances call them (reward.cls)."""
import torch

CALLS = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    return {"score": float(len(solution_str) % 3) / 10, "length": len(solution_str)}


def reward_func(queries, prompts, labels):
    CALLS.append((queries, prompts, labels))
    reward = torch.tensor([float(len(q) % 3) for q in queries])
    return {"rewards": reward, "scores": reward, "extra_logs": {"dummy_scores": reward}}


class VerlScore:
    def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
        return compute_score(data_source, solution_str, ground_truth, extra_info)


class OpenRLHFReward:
    def __call__(self, queries, prompts, labels):
        return reward_func(queries, prompts, labels)


class NoCall:
    pass
'''


@pytest.mark.parametrize("function, cls, extra", [("compute_score", "VerlScore", "length"),
                                                  ("reward_func", "OpenRLHFReward", "dummy_scores")])
def test_a_verl_or_openrlhf_reward_cls_scores_open_prompts_as_reward_funcs_does(tiny_model, tmp_path, function, cls,
                                                                                 extra):
    rows = [verl_row(i, q, a) for i, (q, a) in enumerate(QUESTIONS)]
    train, test = write_parquet(tmp_path / "train.parquet", rows), write_parquet(tmp_path / "test.parquet", rows[:2])
    (tmp_path / "reward_classes.py").write_text(REWARD_CLASSES)
    module = load_file_module(str(tmp_path / "reward_classes.py"))
    seen = {}
    for key, spec, name in (("funcs", f"[{tmp_path}/reward_classes.py:{function}]", function),
                            ("cls", f"{tmp_path}/reward_classes.py:{cls}", cls)):
        module.CALLS.clear()
        RLTrainer(_config(tiny_model, tmp_path / key, train, test, "task.name=prompts", "train.best_metric=eval/reward",
                          f"reward.{key}={spec}")).train()
        rewards = [{k.replace(f"/{name}/", "/NAME/"): v for k, v in row.items() if "reward" in k}
                   for row in _metrics(tmp_path / key)]
        seen[key] = (list(module.CALLS), rewards)
    assert seen["cls"] == seen["funcs"]  # the same calls, with the same arguments, and the same numbers logged

    calls, rewards = seen["cls"]
    scored = sum(len(call[0]) for call in calls) if function == "reward_func" else len(calls)
    assert scored == 2 * 8 + 2 * 2  # once per completion: 8 a step, 2 held-out prompts at the start and at step 2
    steps = [r for r in rewards if "rewards/NAME/mean" in r]
    assert len(steps) == 2 and all(f"rewards/NAME/{extra}" in r for r in steps)
    evaluations = [r for r in rewards if "eval/reward" in r]
    assert evaluations and all(f"eval/rewards/NAME/{extra}" in r for r in evaluations)


def test_reward_cls_refuses_a_reward_function_and_names_reward_funcs(tmp_path):
    (tmp_path / "reward_classes.py").write_text(REWARD_CLASSES)
    spec = f"{tmp_path}/reward_classes.py:compute_score"
    with pytest.raises(RewardError) as e:
        build_reward(load_config(None, [f"reward.cls={spec}"]).reward)
    assert str(e.value) == (f"reward.cls={spec!r} names a reward function, compute_score(data_source, "
                            f"solution_str, ground_truth, extra_info=None), not a class: name it in reward.funcs "
                            f"(reward.funcs=[{spec}])")
    with pytest.raises(RewardError, match=r"reward_len\(completions, \*\*kwargs\), not a class: name it in reward"):
        load_reward_class("tests.trl_rewards:reward_len")
    for cls, style in (("VerlScore", "verl"), ("OpenRLHFReward", "openrlhf")):  # a class's instance is told as they are
        reward = build_reward(load_config(None, [f"reward.cls={tmp_path}/reward_classes.py:{cls}"]).reward)
        assert reward.styles == [style]
    with pytest.raises(RewardError, match=r"reward_classes.py:NoCall': a NoCall instance is not callable; the class "
                                          r"needs a __call__"):
        load_reward_class(f"{tmp_path}/reward_classes.py:NoCall")
