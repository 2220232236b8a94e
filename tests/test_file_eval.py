"""`lmrl eval MODEL|RUN_DIR FILE`: a model's greedy answers to a JSONL test file, checked by the rows' task,
with accuracy, its Wilson interval, a per-type breakdown and every completion written out.

The model is a "parrot": the tiny Llama of tests/test_hf.py with every layer's output projection zeroed
and unit-norm tied embeddings, so each position's logits peak at its own input token and greedy decoding
repeats the prompt's last token. A prompt ending in " 7" is answered " 7": which rows come out right is
known in advance, with a real Hugging Face model going through lmrl's real sampling and checkers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmrl.cli import main
from lmrl.common.data import DataError, iter_jsonl
from lmrl.common.errors import ConfigError
from lmrl.tasks.reasoning_gym import generate
from lmrl.train.file_eval import (Tally, difference_interval, evaluate_file, paired_difference_interval,
                                  wilson_interval)
from tests.test_hf import save_tiny_llama

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (the real data sets live in ../shared/data beside the repo)")
    return path


@pytest.fixture(scope="module")
def parrot(tmp_path_factory) -> Path:
    """A tiny Llama dir whose greedy completion repeats the prompt's last token."""
    directory = tmp_path_factory.mktemp("parrot") / "model"
    model, _ = save_tiny_llama(directory, max_positions=256)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream keeps the input token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding = model.model.embed_tokens.weight  # tied to the head: its own token scores highest
        embedding.copy_(embedding / embedding.norm(dim=1, keepdim=True).clamp(min=1e-6))
    model.save_pretrained(directory)
    return directory


def rg_row_answered_by_its_last_token() -> dict:
    """A real reasoning-gym row with a one-digit answer, the answer put at the end of its prompt."""
    rows = generate(["basic_arithmetic"], size=40, seed=0, config={"max_terms": 2, "max_digits": 1})
    row = next(r for r in rows if len(r["ground_truth"]) == 1 and r["ground_truth"].isdigit())
    return {**row, "prompt": f"{row['prompt']} {row['ground_truth']}"}


@pytest.fixture(scope="module")
def test_file(tmp_path_factory) -> Path:
    rows = [{"prompt": "3 + 4 = 7", "ground_truth": "7", "type": "sums"},   # answered " 7": right
            {"prompt": "2 + 2 = 5", "ground_truth": "4", "type": "sums"},   # answered " 5": wrong
            rg_row_answered_by_its_last_token()]                          # right, by reasoning-gym's scorer
    path = tmp_path_factory.mktemp("eval") / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_of_a_model_on_a_jsonl_file_reports_accuracy_interval_types_and_completions(parrot, test_file, tmp_path,
                                                                                          capsys):
    out = tmp_path / "completions.jsonl"
    assert main(["eval", str(parrot), str(test_file), "--no-chat", "--max-new-tokens", "1", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rows"], report["correct"]) == (3, 2) and report["accuracy"] == pytest.approx(2 / 3)
    assert report["ci95"] == pytest.approx(list(wilson_interval(2, 3)))
    assert report["by_type"] == {"basic_arithmetic": Tally(1, 1).as_dict(), "sums": Tally(1, 2).as_dict()}
    assert report["checkpoint"] is None and report["completions"] == str(out)

    records = [row for _, row in iter_jsonl(out)]
    assert [(r["prompt"], r["completion"], r["ground_truth"], r["correct"]) for r in records[:2]] == [
        ("3 + 4 = 7", " 7", "7", True), ("2 + 2 = 5", " 5", "4", False)]
    rg = records[2]
    assert rg["correct"] and rg["type"] == "basic_arithmetic" and rg["completion"].strip() == rg["ground_truth"]
    assert [r["index"] for r in records] == [0, 1, 2]


def test_rows_without_a_type_are_grouped_by_their_data_source_as_verls(parrot, tmp_path):
    rows = [{"prompt": "3 + 4 = 7", "ground_truth": "7", "data_source": "openai/gsm8k"},
            {"prompt": "2 + 2 = 5", "ground_truth": "4", "data_source": "openai/gsm8k"},
            {"prompt": "1 + 1 = 2", "ground_truth": "2", "data_source": "lighteval/MATH"},
            {"prompt": "1 + 2 = 3", "ground_truth": "3", "data_source": "x", "type": "sums"}]  # a type wins
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = evaluate_file(parrot, path, chat=False, max_new_tokens=1)
    assert result.by_type == {"lighteval/MATH": Tally(1, 1), "openai/gsm8k": Tally(1, 2), "sums": Tally(1, 1)}


def test_the_python_api_takes_the_first_limit_rows_and_returns_the_records(parrot, test_file):
    result = evaluate_file(parrot, test_file, limit=2, chat=False, max_new_tokens=1)
    assert str(result.overall) == "1/2 right = 50.0% (95% CI 9.5-90.5%)"
    assert result.by_type == {"sums": Tally(1, 2)} and result.completions_file is None
    assert [r["correct"] for r in result.records] == [True, False]
    assert result.metrics["length_mean"] == 1.0 and result.metrics["format_rate"] == 0.0


def test_requiring_the_answer_format_makes_untagged_answers_wrong(parrot, test_file):
    result = evaluate_file(parrot, test_file, chat=False, max_new_tokens=1, require_format=True)
    assert result.overall == Tally(0, 3)


def test_a_chat_prompt_is_rendered_by_the_chat_template(parrot, test_file):
    # the template ends with "<|im_start|>assistant\n": the parrot repeats the newline, so nothing is right
    result = evaluate_file(parrot, test_file, max_new_tokens=2)
    assert result.overall == Tally(0, 3) and all(r["completion"] == "\n\n" for r in result.records)


def test_dbbench_records_are_played_as_sql_episodes(parrot, tmp_path):
    dev = shared("dbbench", "dev.jsonl")
    result = evaluate_file(parrot, dev, limit=2, max_new_tokens=2, out=tmp_path / "sql.jsonl")
    records = [row for _, row in iter_jsonl(tmp_path / "sql.jsonl")]
    first = json.loads(dev.read_text().splitlines()[0])
    assert result.overall.rows == 2 and records[0]["prompt"] == first["description"]
    assert records[0]["ground_truth"] == first["label"] and records[0]["type"] == first["type"][0]
    assert "[assistant]" in records[0]["completion"] and "turns" in result.metrics


def test_dbbench_episodes_are_played_in_the_environment_passed(parrot):
    # the parrot never writes an action: an episode lasts as many rounds as it may (or its context holds)
    from lmrl.tasks.sql import SQLEnvConfig

    dev = shared("dbbench", "dev.jsonl")
    assert evaluate_file(parrot, dev, limit=1, max_new_tokens=2).metrics["turns"] > 2  # a bare model: 15 rounds
    result = evaluate_file(parrot, dev, limit=1, max_new_tokens=2, sections={"sql": SQLEnvConfig(max_rounds=2)})
    assert result.metrics["turns"] == 2 and result.metrics["timeout_rate"] == 1.0


def test_a_registered_test_file_format_plays_files_whose_first_row_has_its_keys(parrot, tmp_path):
    # a user's format: rows {question, answer}, played as math rows; dropped from the registry afterwards
    from lmrl.tasks import TEST_FILE_FORMATS, register_test_file_format, test_file_format
    from lmrl.tasks.math_reward import MathReward
    from lmrl.tasks.math_task import MathTask

    def build(config, *, tokenizer, test_file, max_new_tokens):
        rows = [{"prompt": r["question"], "ground_truth": r["answer"]} for _, r in iter_jsonl(test_file)]
        converted = tmp_path / "converted.jsonl"
        converted.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return MathTask(None, str(converted), tokenizer, max_new_tokens=max_new_tokens, chat=False,
                        reward=MathReward(require_format=config.reward.require_format))  # a bare model's: off

    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "1 + 2 = 3", "answer": "3"}) + "\n"
                    + json.dumps({"question": "1 + 1 = 3", "answer": "2"}) + "\n")
    assert test_file_format({"question": "q", "answer": "a"}).name == "math"  # no keys: takes any file
    assert test_file_format({"description": "", "label": [], "table": {}}).name == "dbbench"
    register_test_file_format("qa", keys=("question", "answer"), check=lambda path, config: None,
                              row=lambda task, i: (task.rows[i]["prompt"], task.ground_truths[i], "qa"))(build)
    try:
        result = evaluate_file(parrot, path, max_new_tokens=1)
    finally:
        del TEST_FILE_FORMATS["qa"]
    assert result.overall == Tally(1, 2) and result.by_type == {"qa": Tally(1, 2)}
    assert [r["prompt"] for r in result.records] == ["1 + 2 = 3", "1 + 1 = 3"]


@pytest.mark.parametrize("correct, n", [(0, 1), (2, 3), (7, 10), (50, 50), (123, 1319)])
def test_wilson_interval_matches_scipy(correct, n):
    stats = pytest.importorskip("scipy.stats")
    expected = stats.binomtest(correct, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(correct, n) == pytest.approx((expected.low, expected.high), abs=1e-9)


def test_wilson_interval_of_no_rows_is_everything():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_difference_interval_by_hand():
    # Wilson (z = 1.96): 1/2 -> 0.5 ± 0.40547 = (0.09453, 0.90547); 0/2 -> 0.32881 ± 0.32881 = (0, 0.65762).
    # low = 0.5 − √((0.5 − 0.09453)² + (0.65762 − 0)²) = 0.5 − 0.77257; high = 0.5 + √((0.90547 − 0.5)² + 0²)
    assert difference_interval(1, 2, 0, 2) == pytest.approx((-0.27257, 0.90547), abs=1e-5)


@pytest.mark.parametrize("a, n_a, b, n_b, published", [  # Newcombe (1998), Stat Med 17:873, table II, method 10
    (56, 70, 48, 80, (0.0524, 0.3339)), (9, 10, 3, 10, (0.1705, 0.8090)), (5, 56, 0, 29, (-0.0381, 0.1926)),
    (0, 10, 0, 20, (-0.1611, 0.2775)), (10, 10, 0, 20, (0.6791, 1.0)),
])
def test_difference_interval_of_independent_proportions_matches_newcombe(a, n_a, b, n_b, published):
    assert difference_interval(a, n_a, b, n_b) == pytest.approx(published, abs=5e-5)


def test_paired_difference_interval_matches_the_published_worked_example():
    # Cavo et al. (2012) in Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", ch. 8:
    # 59 items right both times, 6 only in the first, 16 only in the second, 80 in neither:
    # −0.0621 (95% CI −0.1186 to −0.0046)
    first = [True] * 59 + [True] * 6 + [False] * 16 + [False] * 80
    second = [True] * 59 + [False] * 6 + [True] * 16 + [False] * 80
    assert paired_difference_interval(first, second) == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    # the correlation narrows it: the same counts as independent samples give a wider interval
    low, high = difference_interval(65, 161, 75, 161)
    assert low < -0.1186 and high > -0.0046


def test_paired_difference_interval_without_correlation_is_the_independent_one():
    # both right r = 1, only first s = 1, only second t = 1, neither u = 2: ru − st = 1 <= N/2, so φ = 0
    first, second = [True, True, False, False, False], [True, False, True, False, False]
    assert paired_difference_interval(first, second) == difference_interval(2, 5, 2, 5)
    # a margin empty (the second all wrong): φ = 0
    assert paired_difference_interval([True] * 4, [False] * 4) == difference_interval(4, 4, 0, 4)
    with pytest.raises(ValueError, match="one of each per item: got 2 and 1"):
        paired_difference_interval([True, False], [True])


@pytest.mark.parametrize("args, message", [
    (["eval", "runs/x", "--limit", "3"], "--limit needs a TEST_FILE"),
    (["eval", "smollm2-135m-instruct"], "smollm2-135m-instruct is not a run dir (no config.yaml); to evaluate a "
                                        "model, name a JSONL test file"),
])
def test_eval_options_that_need_a_file_or_a_run_are_one_line_errors(args, message, capsys):
    assert main(args) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith(f"lmrl eval: error: {message}") and len(err.splitlines()) == 1


def test_a_test_file_that_is_missing_or_damaged_fails_before_the_model_loads(tmp_path, capsys):
    assert main(["eval", "no-such-model", str(tmp_path / "missing.jsonl")]) == 1
    assert "missing.jsonl" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1", "ground_truth": "2"}\n{"prompt": \n')
    with pytest.raises(DataError, match=f"^{bad}:2: invalid JSON"):
        evaluate_file("no-such-model", bad)


def test_eval_of_a_run_dir_loads_its_checkpoint_and_its_task_settings(parrot, test_file, tmp_path, capsys):
    from lmrl.config import load_config
    from lmrl.tasks.word_problems import write_addition_chat
    from lmrl.train.rl_trainer import RLTrainer

    write_addition_chat(tmp_path / "data", n_train=8, n_test=4, seed=0)
    run = tmp_path / "run"
    RLTrainer(load_config("math-grpo-smollm2", [
        f"model.path={parrot}", f"task.train_file={tmp_path / 'data' / 'train.jsonl'}",
        f"task.test_file={tmp_path / 'data' / 'test.jsonl'}", f"run.dir={run}", "lora.r=2", "task.chat=false",
        "task.max_new_tokens=1", "train.steps=1", "train.rollout_size=4", "algo.group_size=2", "eval.size=2",
        "eval.batch_size=2", "run.progress=false", "run.tensorboard=false", "run.threads=1", "optim.lr=0"])).train()
    assert main(["eval", str(run), str(test_file)]) == 0
    report = json.loads(capsys.readouterr().out)
    # the preset's prompt template ends every prompt with "</answer>", whose last token the parrot repeats
    assert report["checkpoint"].endswith("step_1") and report["correct"] == 0
    assert report["completions"] == str(run / "eval" / "mixed.completions.jsonl")
    completions = [row for _, row in iter_jsonl(run / "eval" / "mixed.completions.jsonl")]
    assert len(completions) == 3 and len({c["completion"] for c in completions}) == 1
    assert main(["eval", str(run), str(test_file), "--prompt-template", "{prompt}"]) == 0
    assert json.loads(capsys.readouterr().out)["correct"] == 2  # lr 0: the checkpoint is still the parrot


def _adapter_on_the_parrot(parrot, directory):
    """A LoRA adapter on the parrot's attention output (all zero without it) that changes its answers,
    saved as PEFT writes it, and the same model merged into a plain transformers dir."""
    from lmrl.models.hf import load_hf_policy
    from lmrl.models.lora import add_lora, export_merged, save_adapter

    policy = load_hf_policy(str(parrot))[0]
    add_lora(policy, r=4, alpha=8, target_modules=["o_proj"])
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 2.0)
    return save_adapter(policy, directory / "adapter"), export_merged(policy, policy.tokenizer, directory / "merged")


def test_an_adapter_on_a_bare_model_answers_as_the_merged_model(parrot, test_file, tmp_path, capsys):
    adapter, merged = _adapter_on_the_parrot(parrot, tmp_path)
    options = ["--no-chat", "--max-new-tokens", "3"]
    for name, args in (("base", [str(parrot)]), ("adapter", [str(parrot), "--adapter", str(adapter)]),
                       ("merged", [str(merged)])):
        assert main(["eval", *args[:1], str(test_file), *options, *args[1:], "--out", str(tmp_path / f"{name}.jsonl")]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["checkpoint"] == (str(adapter) if name == "adapter" else None)
    texts = {name: [row["completion"] for _, row in iter_jsonl(tmp_path / f"{name}.jsonl")]
             for name in ("base", "adapter", "merged")}
    assert texts["adapter"] == texts["merged"] != texts["base"]


def test_an_adapter_needs_a_peft_dir_and_a_bare_model(parrot, test_file, tmp_path, capsys):
    assert main(["eval", str(parrot), str(test_file), "--adapter", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "holds no adapter_config.json" in err and len(err.splitlines()) == 1
    adapter, _ = _adapter_on_the_parrot(parrot, tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    assert main(["eval", str(tmp_path / "run"), str(test_file), "--adapter", str(adapter)]) == 2
    assert "an adapter goes on a bare model" in capsys.readouterr().err


# -- rows under other keys (task.prompt_key / task.label_key), parquet, verl's layout -----------------------------

KEYED = [{"question": "3 + 4 = 7", "answer": {"value": "7"}, "type": "sums"},   # answered " 7": right
         {"question": "2 + 2 = 5", "answer": {"value": "4"}, "type": "sums"}]   # answered " 5": wrong


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` as JSONL, or as parquet (a column per key, as pandas writes them) when the name ends in .parquet."""
    if path.suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet

        keys = list(dict.fromkeys(k for row in rows for k in row))
        pyarrow.parquet.write_table(pyarrow.Table.from_pydict({k: [row.get(k) for row in rows] for k in keys}), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", ["keyed.jsonl", "keyed.parquet"])
def test_eval_reads_rows_under_other_keys_with_prompt_key_and_label_key(parrot, tmp_path, capsys, name):
    path = write_rows(tmp_path / name, KEYED)
    where = f"{path}:1" if name.endswith(".jsonl") else f"{path}:row 0"
    assert main(["eval", str(parrot), str(path), "--no-chat", "--max-new-tokens", "1"]) == 1  # the default keys
    assert capsys.readouterr().err.startswith(f"lmrl eval: error: {where}: needs one of 'prompt' | 'messages' "
                                              f"(the row has keys: 'question', 'answer', 'type')")
    out = tmp_path / "completions.jsonl"
    assert main(["eval", str(parrot), str(path), "--no-chat", "--max-new-tokens", "1", "--prompt-key", "question",
                 "--label-key", "answer.value", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rows"], report["correct"]) == (2, 1) and report["by_type"] == {"sums": Tally(1, 2).as_dict()}
    records = [row for _, row in iter_jsonl(out)]
    assert [(r["prompt"], r["completion"], r["ground_truth"], r["correct"]) for r in records] == [
        ("3 + 4 = 7", " 7", "7", True), ("2 + 2 = 5", " 5", "4", False)]


def test_eval_reads_verl_parquet_rows_as_training_reads_them(parrot, tmp_path):
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    path = write_rows(tmp_path / "test.parquet", [{"data_source": "openai/gsm8k", "prompt": messages,
                                                   "reward_model": {"style": "rule", "ground_truth": "7"}}])
    result = evaluate_file(parrot, path, max_new_tokens=1)
    assert [(r["prompt"], r["ground_truth"]) for r in result.records] == [(messages, "7")]


def test_a_key_given_to_eval_must_name_one(parrot, test_file):
    for name in ("prompt_key", "label_key"):
        with pytest.raises(ConfigError, match=f"^{name} must name a key of the test file's rows, got ' '$"):
            evaluate_file(parrot, test_file, **{name: " "})


def test_eval_of_a_run_reads_the_file_with_the_runs_keys_unless_told_others(parrot, test_file, tmp_path, capsys):
    from lmrl.config import load_config
    from lmrl.train.rl_trainer import RLTrainer

    train = write_rows(tmp_path / "train.parquet", KEYED * 4)
    test = write_rows(tmp_path / "keyed.parquet", KEYED)
    run = tmp_path / "run"
    RLTrainer(load_config("math-grpo-smollm2", [
        f"model.path={parrot}", f"task.train_file={train}", f"task.test_file={test}", "task.generate=",
        "task.prompt_key=question", "task.label_key=answer.value", f"run.dir={run}", "lora.r=2", "task.chat=false",
        "task.max_new_tokens=1", "train.steps=1", "train.rollout_size=4", "algo.group_size=2", "eval.size=2",
        "eval.batch_size=2", "run.progress=false", "run.tensorboard=false", "run.threads=1", "optim.lr=0"])).train()

    assert main(["eval", str(run), str(test), "--prompt-template", "{prompt}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rows"], report["correct"]) == (2, 1)  # lr 0: the checkpoint is still the parrot
    assert report["completions"] == str(run / "eval" / "keyed.completions.jsonl")
    records = [row for _, row in iter_jsonl(run / "eval" / "keyed.completions.jsonl")]
    assert [(r["prompt"], r["ground_truth"]) for r in records] == [("3 + 4 = 7", "7"), ("2 + 2 = 5", "4")]

    # a file under the default keys is read with the run's, and so needs --prompt-key / --label-key
    assert main(["eval", str(run), str(test_file), "--prompt-template", "{prompt}"]) == 1
    err = capsys.readouterr().err
    assert f"{test_file}:1: missing key 'question' (task.prompt_key)" in err and len(err.splitlines()) == 1
    assert main(["eval", str(run), str(test_file), "--prompt-template", "{prompt}", "--prompt-key", "prompt",
                 "--label-key", "ground_truth", "--out", str(tmp_path / "mixed.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["correct"] == 2
