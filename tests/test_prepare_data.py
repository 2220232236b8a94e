import argparse
import gzip
import json
from pathlib import Path

import pytest

from lmrl.common.data import DataError, iter_jsonl
from lmrl.tasks.prepare_data import PreparedFile, add_parser, detect_format, prepare, run, write_gsm8k_splits


def write_jsonl_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def rows_of(path) -> list[dict]:
    """A written file's rows as JSON says them (no format checks)."""
    return [row for _, row in iter_jsonl(path)]


def hh(*turns: str) -> str:
    """hh-rlhf text from alternating Human/Assistant turns."""
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {t}" for i, t in enumerate(turns))


HH_ROWS = [
    {"chosen": hh("What is 2+2?", "4."), "rejected": hh("What is 2+2?", "5.")},
    {"chosen": hh("Hi", "Hello! How can I help?", "Name a fruit.", "An apple."),
     "rejected": hh("Hi", "Hello! How can I help?", "Name a fruit.", "A carrot.")},
    {"chosen": hh("Same?", "Yes."), "rejected": hh("Same?", "Yes.")},       # teaches nothing
    {"chosen": hh("Empty?", ""), "rejected": hh("Empty?", "No.")},          # empty reply
    {"chosen": hh("A", "x"), "rejected": hh("B", "y")},                     # different conversations
]
INSTRUCTION_ROWS = [
    {"instruction": "把这句话翻译成英文。", "input": "你好", "output": "Hello"},
    {"instruction": "写一个关于春天的句子。", "input": "", "output": "春天来了，花开了。"},
    {"instruction": "空的回答", "input": "", "output": "  "},
]


def test_hh_rlhf_becomes_trl_conversational_rows(tmp_path):
    src = write_jsonl_rows(tmp_path / "raw" / "train.jsonl", HH_ROWS[:2])
    [out] = prepare(["hh-rlhf"], tmp_path / "data", from_path=src)
    assert out.path == tmp_path / "data" / "hh-rlhf.jsonl" and out.kind == "preference"
    assert rows_of(out.path) == [
        {"prompt": [{"role": "user", "content": "What is 2+2?"}],
         "chosen": [{"role": "assistant", "content": "4."}], "rejected": [{"role": "assistant", "content": "5."}]},
        {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Name a fruit."}],
         "chosen": [{"role": "assistant", "content": "An apple."}],
         "rejected": [{"role": "assistant", "content": "A carrot."}]},
    ]


def test_a_bad_row_stops_the_conversion_naming_its_file_and_line(tmp_path):
    src = write_jsonl_rows(tmp_path / "hh.jsonl", HH_ROWS)
    with pytest.raises(DataError) as e:
        prepare(["hh-rlhf"], tmp_path / "data", from_path=src)
    message = str(e.value)
    assert message.startswith(f"{src}:3: 'chosen' and 'rejected' are the same text") and "\n" not in message
    assert message.endswith("(pass --skip-bad-rows to skip such rows and count them)")
    assert not (tmp_path / "data" / "hh-rlhf.jsonl").exists()


def test_an_hh_pair_whose_dialogues_share_no_turn_is_an_error_naming_it(tmp_path):
    src = write_jsonl_rows(tmp_path / "hh.jsonl", [HH_ROWS[0], HH_ROWS[4]])
    with pytest.raises(DataError, match=f"^{src}:2: 'chosen' and 'rejected' share no turns up to an "
                                        f"'\\\\n\\\\nAssistant:' reply, so there is no prompt"):
        prepare(["hh-rlhf"], tmp_path / "data", from_path=src)


def test_with_skip_bad_rows_unconvertible_rows_are_skipped_and_counted_by_reason(tmp_path):
    src = write_jsonl_rows(tmp_path / "hh.jsonl", HH_ROWS)
    [out] = prepare(["hh-rlhf"], tmp_path, from_path=src, skip_bad_rows=True)
    assert (out.rows_written, out.rows_skipped) == (2, 3)
    assert out.skipped_because == {
        "'chosen' and 'rejected' are the same text ([{\"role\": \"assistant\", \"content\": \"Yes.\"}]); a pair must "
        "differ to say which is preferred": 1,
        "the chosen reply is empty": 1,
        "'chosen' and 'rejected' share no turns up to an '\\n\\nAssistant:' reply, so there is no prompt": 1}
    assert str(out).startswith(f"wrote {out.path}: 2 preference rows, 3 skipped (")


def test_belle_json_list_joins_instruction_and_input(tmp_path):
    src = tmp_path / "Belle_open_source_0.5M.json"
    src.write_text(json.dumps(INSTRUCTION_ROWS, ensure_ascii=False), encoding="utf-8")
    [out] = prepare(["belle"], tmp_path / "data", from_path=src, skip_bad_rows=True)
    assert out == PreparedFile(tmp_path / "data" / "belle.jsonl", "sft", 2, 1, {"empty reply": 1})
    assert rows_of(out.path) == [{"prompt": "把这句话翻译成英文。\n你好", "response": "Hello"},
                                    {"prompt": "写一个关于春天的句子。", "response": "春天来了，花开了。"}]


def test_several_data_sets_from_one_directory_and_max_samples(tmp_path):
    write_jsonl_rows(tmp_path / "raw" / "hh-rlhf" / "helpful-base" / "train.jsonl", HH_ROWS)
    write_jsonl_rows(tmp_path / "raw" / "hh-rlhf" / "helpful-base" / "test.jsonl", HH_ROWS[:1])  # other split
    write_jsonl_rows(tmp_path / "raw" / "alpaca-chinese.jsonl", INSTRUCTION_ROWS)
    hh_out, alpaca_out = prepare(["hh-rlhf", "alpaca-chinese"], tmp_path / "data", from_path=tmp_path / "raw",
                                 max_samples=1)
    assert (hh_out.rows_written, hh_out.rows_skipped) == (1, 0)
    assert rows_of(alpaca_out.path) == [{"prompt": "把这句话翻译成英文。\n你好", "response": "Hello"}]
    [test_out] = prepare(["hh-rlhf"], tmp_path / "test", from_path=tmp_path / "raw", split="test")
    assert test_out.rows_written == 1


def test_a_named_data_set_with_other_columns_is_an_error_naming_them(tmp_path):
    src = write_jsonl_rows(tmp_path / "x.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError) as e:
        prepare(["belle"], tmp_path, from_path=src)
    assert "belle rows need the columns instruction, output; found question, answer" in str(e.value)


@pytest.mark.parametrize("columns, fmt", [
    (["prompt", "chosen", "rejected", "score"], "pairs"),
    (["chosen", "rejected"], "transcripts"),
    (["messages", "chosen", "rejected"], "pairs"),
    (["conversations", "id"], "conversation"),
    (["messages"], "conversation"),
    (["instruction", "output"], "instruction"),
    (["prompt", "completion"], "completion"),
    (["prompt", "response"], "completion"),
    (["question", "answer"], None),
])
def test_format_is_detected_from_the_columns(columns, fmt):
    assert detect_format(columns) == fmt


def test_generic_formats_convert_to_training_rows(tmp_path):
    user, bot = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}
    sources = {
        "pairs.jsonl": [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
                        {"prompt": [user], "chosen": [bot], "rejected": [{"role": "assistant", "content": "Go away"}]},
                        {"prompt": "Hi", "chosen": [user, bot],
                         "rejected": [user, {"role": "assistant", "content": "No"}]}],
        "sharegpt.jsonl": [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
                           {"conversations": [{"from": "human", "value": "Hi"}]}],  # no assistant turn: skipped
        "completions.jsonl": [{"prompt": "1+1=", "completion": "2"}, {"prompt": [user], "completion": [bot]}],
    }
    expected = {
        "pairs.jsonl": [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
                        {"prompt": [user], "chosen": [bot], "rejected": [{"role": "assistant", "content": "Go away"}]},
                        {"prompt": [user], "chosen": [bot],  # the repeated prompt is dropped
                         "rejected": [{"role": "assistant", "content": "No"}]}],
        "sharegpt.jsonl": [{"messages": [user, bot]}],
        "completions.jsonl": [{"prompt": "1+1=", "response": "2"}, {"messages": [user, bot]}],
    }
    for name, rows in sources.items():
        src = write_jsonl_rows(tmp_path / "raw" / name, rows)
        [out] = prepare([], tmp_path / "data", hf=[f"someone/{src.stem}"], from_path=src, skip_bad_rows=True)
        assert out.path.name == f"{src.stem}.jsonl"
        assert rows_of(out.path) == expected[name], name
    assert out.kind == "sft"


def test_parquet_files_are_read(tmp_path):
    import pyarrow
    import pyarrow.parquet

    src = tmp_path / "train-00000-of-00001.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(INSTRUCTION_ROWS[:2]), src)
    [out] = prepare(["alpaca-chinese"], tmp_path / "data", from_path=tmp_path)
    assert out.rows_written == 2 and out.path.name == "alpaca-chinese.jsonl"


def test_unknown_columns_are_an_error_naming_the_data_set_and_columns(tmp_path):
    src = write_jsonl_rows(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError) as e:
        prepare([], tmp_path, hf=["someone/qa"], from_path=src)
    assert "cannot tell the format of someone/qa from its columns (question, answer)" in str(e.value)


def test_a_data_set_with_no_convertible_row_is_an_error(tmp_path):
    src = write_jsonl_rows(tmp_path / "hh.jsonl", HH_ROWS[2:4])
    with pytest.raises(DataError, match="no row of hh-rlhf could be converted .2 skipped"):
        prepare(["hh-rlhf"], tmp_path, from_path=src, skip_bad_rows=True)
    assert not (tmp_path / "hh-rlhf.jsonl").exists()


def test_missing_local_files_are_an_error(tmp_path):
    with pytest.raises(DataError, match="no such file or directory"):
        prepare(["belle"], tmp_path, from_path=tmp_path / "nowhere")
    write_jsonl_rows(tmp_path / "raw" / "hh-rlhf.jsonl", HH_ROWS)
    with pytest.raises(DataError, match="no files for belle; with several data sets"):
        prepare(["hh-rlhf", "belle"], tmp_path / "data", from_path=tmp_path / "raw")
    assert not (tmp_path / "data" / "hh-rlhf.jsonl").exists()  # sources are all found before any is written


@pytest.mark.parametrize("named, hf", [(["hh-rlhf"], []), ([], ["lmrl-tests/no-such-data"])])
def test_offline_without_local_files_says_to_pass_from(tmp_path, monkeypatch, named, hf):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # nothing cached
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(DataError) as e:
        prepare(named, tmp_path / "data", hf=hf)
    message = str(e.value)
    assert "could not reach the Hugging Face hub" in message and "--from PATH" in message
    assert "\n" not in message


def test_cli_parser_and_run_print_a_line_per_file(tmp_path, capsys):
    write_jsonl_rows(tmp_path / "raw" / "hh-rlhf.jsonl", HH_ROWS[:2])
    write_jsonl_rows(tmp_path / "raw" / "belle.jsonl", INSTRUCTION_ROWS[:2])
    parser = argparse.ArgumentParser(prog="lmrl")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare-data", "--datasets", "hh-rlhf", "belle", "--from", str(tmp_path / "raw"),
                              "--output-dir", str(tmp_path / "data"), "--max-samples", "5"])
    assert run(args) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {tmp_path / 'data' / 'hh-rlhf.jsonl'}: 2 preference rows, none skipped",
        f"wrote {tmp_path / 'data' / 'belle.jsonl'}: 2 sft rows, none skipped"]
    with pytest.raises(SystemExit):
        parser.parse_args(["prepare-data", "--datasets", "imagenet"])


# -- real data (../shared/data beside the repo) and the readers added for it --------------------------------

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (the real data sets live in ../shared/data beside the repo)")
    return path


def test_real_hh_rlhf_gzip_becomes_conversational_rows_split_where_the_dialogues_part(tmp_path):
    src = shared("hh-rlhf", "harmless-base-test.jsonl.gz")
    [out] = prepare(["hh-rlhf"], tmp_path, from_path=src, max_samples=3)
    rows, raw = rows_of(out.path), [row for _, row in iter_jsonl(src)][:3]
    assert out.rows_written == 3
    for row, pair in zip(rows, raw):
        # the prompt is the shared dialogue as turns, each reply the rest of its side
        turns = "".join(f"\n\n{'Human' if m['role'] == 'user' else 'Assistant'}: {m['content']}" for m in row["prompt"])
        assert [m["role"] for m in row["prompt"]][::2] == ["user"] * ((len(row["prompt"]) + 1) // 2)
        for side in ("chosen", "rejected"):
            [reply] = row[side]
            assert reply["role"] == "assistant" and pair[side].endswith(reply["content"])
            assert " ".join((turns + "\n\nAssistant: " + reply["content"]).split()) == " ".join(pair[side].split())


def test_real_hh_rlhf_rows_with_an_empty_reply_stop_the_conversion_unless_skipped(tmp_path):
    src = shared("hh-rlhf", "harmless-base-test.jsonl.gz")
    with pytest.raises(DataError, match=rf"^{src}:\d+: the (chosen|rejected) reply is empty \(pass --skip-bad-rows"):
        prepare(["hh-rlhf"], tmp_path, from_path=src)
    [out] = prepare(["hh-rlhf"], tmp_path, from_path=src, skip_bad_rows=True)
    assert out.rows_written + out.rows_skipped == 2312 and out.rows_skipped == 4
    assert set(out.skipped_because) <= {"the chosen reply is empty", "the rejected reply is empty"}


def test_a_truncated_gzip_file_is_an_error_naming_it(tmp_path):
    src = tmp_path / "train.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in HH_ROWS).encode())[:-12])
    with pytest.raises(DataError, match=f"^{src}: the gzip file is truncated"):
        prepare(["hh-rlhf"], tmp_path / "data", from_path=src)


GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 1,200 more. How many now?",
     "answer": "He has 3 + 1,200 = <<3+1200=1203>>1,203 apples.\n#### 1,203"},
    {"question": "A debt of 5 grows by 2. What is the balance?", "answer": "0 - 5 - 2 = <<0-5-2=-7>>-7\n#### -7"},
]


def test_gsm8k_rows_become_prompt_ground_truth_and_the_solution_without_calculator_notes(tmp_path):
    src = write_jsonl_rows(tmp_path / "gsm8k" / "train.jsonl", GSM8K_ROWS)
    [out] = prepare(["gsm8k"], tmp_path / "data", from_path=src)
    assert (out.kind, out.rows_written) == ("math", 2)
    assert str(out) == f"wrote {out.path}: 2 math rows, none skipped"
    assert rows_of(out.path) == [
        {"prompt": GSM8K_ROWS[0]["question"], "ground_truth": "1203", "solution": "He has 3 + 1,200 = 1,203 apples."},
        {"prompt": GSM8K_ROWS[1]["question"], "ground_truth": "-7", "solution": "0 - 5 - 2 = -7"}]


@pytest.mark.parametrize("answer, message", [
    ("He has 4 apples.", "'answer' has no '#### ' final answer"),
    ("He has 4 apples.\n#### four", "the final answer after '####' is not a number: 'four'"),
])
def test_a_gsm8k_row_without_a_numeric_final_answer_is_an_error_naming_its_line(tmp_path, answer, message):
    src = write_jsonl_rows(tmp_path / "test.jsonl", [GSM8K_ROWS[0], {"question": "How many?", "answer": answer}])
    with pytest.raises(DataError) as e:
        prepare(["gsm8k"], tmp_path / "data", from_path=src, split="test")
    assert str(e.value).startswith(f"{src}:2: {message}")
    [out] = prepare(["gsm8k"], tmp_path / "data", from_path=src, split="test", skip_bad_rows=True)
    assert (out.rows_written, out.rows_skipped) == (1, 1)


def test_gsm8k_splits_become_a_tasks_train_and_test_files(tmp_path):
    raw = tmp_path / "raw"
    write_jsonl_rows(raw / "train.jsonl", GSM8K_ROWS)
    write_jsonl_rows(raw / "test.jsonl", GSM8K_ROWS[1:])
    train, test = write_gsm8k_splits(tmp_path / "data", raw)
    assert (train, test) == (tmp_path / "data" / "train.jsonl", tmp_path / "data" / "test.jsonl")
    assert [r["ground_truth"] for r in rows_of(train)] == ["1203", "-7"] and len(rows_of(test)) == 1
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["test.jsonl", "train.jsonl"]


def test_a_gsm8k_split_that_fails_leaves_neither_file(tmp_path):
    raw = tmp_path / "raw"
    write_jsonl_rows(raw / "train.jsonl", GSM8K_ROWS)
    write_jsonl_rows(raw / "test.jsonl", [{"question": "How many?", "answer": "four"}])
    with pytest.raises(DataError, match="test.jsonl:1: 'answer' has no"):
        write_gsm8k_splits(tmp_path / "data", raw)
    assert list((tmp_path / "data").iterdir()) == []


def test_the_gpu_recipe_trains_on_gsm8k_and_writes_its_splits_on_first_use(tmp_path):
    from lmrl.config import load_config
    from lmrl.tasks import ensure_data

    preset = load_config("math-grpo-qwen-gpu")
    assert (preset.task.train_file, preset.task.test_file) == ("data/gsm8k/train.jsonl", "data/gsm8k/test.jsonl")
    assert (preset.task.generate, preset.task.generate_from, preset.eval.size) == ("gsm8k", "", 500)
    raw = write_jsonl_rows(tmp_path / "raw" / "train.jsonl", GSM8K_ROWS).parent
    write_jsonl_rows(raw / "test.jsonl", GSM8K_ROWS[:1])
    cfg = load_config("math-grpo-qwen-gpu", [f"task.train_file={tmp_path / 'gsm8k' / 'train.jsonl'}",
                                             f"task.test_file={tmp_path / 'gsm8k' / 'test.jsonl'}",
                                             f"task.generate_from={raw}"])
    ensure_data(cfg, "task")
    assert len(rows_of(tmp_path / "gsm8k" / "train.jsonl")) == 2 and len(rows_of(tmp_path / "gsm8k" / "test.jsonl")) == 1


def test_generate_from_is_only_for_a_generator_that_converts_a_data_set():
    from lmrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="task.generate_from is the source of a generator that converts"):
        load_config("math-grpo-smollm2", ["task.generate_from=raw/gsm8k"])


def test_gsm8k_generation_offline_without_a_source_names_generate_from(tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    from lmrl.config import load_config
    from lmrl.tasks import ensure_data

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load_config("math-grpo-qwen-gpu", [f"task.train_file={tmp_path / 'd' / 'train.jsonl'}",
                                             f"task.test_file={tmp_path / 'd' / 'test.jsonl'}"])
    with pytest.raises(DataError) as e:
        ensure_data(cfg, "task")
    assert "could not reach the Hugging Face hub" in str(e.value) and "task.generate_from=DIR" in str(e.value)
    assert "\n" not in str(e.value)


def test_real_gsm8k_test_split_converts_every_row(tmp_path):
    src = shared("gsm8k")
    [out] = prepare(["gsm8k"], tmp_path, from_path=src, split="test")  # only test.jsonl: train.jsonl is another split
    rows, raw = rows_of(out.path), [row for _, row in iter_jsonl(src / "test.jsonl")]
    assert out.rows_written == len(raw) == 1319 and out.rows_skipped == 0
    assert rows[0] == {"prompt": raw[0]["question"], "ground_truth": "18",
                       "solution": "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\n"
                                   "She makes 9 * 2 = $18 every day at the farmer’s market."}
    assert all(float(r["ground_truth"]) == float(q["answer"].split("#### ")[-1].replace(",", ""))
               for r, q in zip(rows, raw))
    assert not any("<<" in r["solution"] or "####" in r["solution"] for r in rows)


def test_reasoning_gym_sets_are_generated_by_name_size_seed_and_config(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="lmrl")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare-data", "--rg-tasks", "leg_counting", "basic_arithmetic", "--size", "3",
                              "--seed", "4", "--rg-config", "leg_counting.max_animals=4", "basic_arithmetic.max_terms=3",
                              "--output-dir", str(tmp_path)])
    assert run(args) == 0
    path = tmp_path / "reasoning-gym.jsonl"
    assert capsys.readouterr().out == f"wrote {path}: 6 math rows, none skipped\n"
    rows = rows_of(path)
    assert [r["task"] for r in rows] == ["leg_counting"] * 3 + ["basic_arithmetic"] * 3
    assert rows[0]["rg_config"] == {"seed": 4, "size": 3, "max_animals": 4}
    assert rows[3]["rg_config"] == {"seed": 4, "size": 3, "max_terms": 3}
    assert all(r["metadata"]["num_animals"] <= 4 for r in rows[:3])


def test_reasoning_gym_entries_from_a_file_become_the_same_rows(tmp_path):
    import reasoning_gym

    entries = list(reasoning_gym.create_dataset("leg_counting", size=2, seed=1))
    src = write_jsonl_rows(tmp_path / "entries.jsonl", entries)
    [from_file] = prepare(["reasoning-gym"], tmp_path / "a", from_path=src)
    [generated] = prepare([], tmp_path / "b", rg_tasks=["leg_counting"], size=2, seed=1)
    made = rows_of(generated.path)
    assert rows_of(from_file.path) == [{**row, "rg_config": {}} for row in made]  # no config: the defaults'


def test_an_unknown_reasoning_gym_name_fails_before_anything_is_written(tmp_path):
    with pytest.raises(DataError, match="unknown reasoning-gym data set 'gsm_symbolc'; did you mean gsm_symbolic"):
        prepare(["gsm8k"], tmp_path / "data", from_path=tmp_path / "nowhere", rg_tasks=["gsm_symbolc"])
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"datasets": ["reasoning-gym"]}, "reasoning-gym: name its data sets with --rg-tasks"),
    ({"datasets": [], "rg_tasks": ["leg_counting"], "from_path": "x.jsonl"}, "give --rg-tasks .generated by name. "
                                                                            "or --from"),
])
def test_reasoning_gym_needs_names_or_a_file_not_both(tmp_path, kwargs, message):
    with pytest.raises(DataError, match=message):
        prepare(output_dir=tmp_path, **kwargs)
