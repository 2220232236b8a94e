import argparse
import json

import pytest

from lmrl.data import DataError, read_jsonl
from lmrl.tasks.prepare_data import PreparedFile, add_parser, detect_format, prepare, run


def write_jsonl_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


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


def test_hh_rlhf_becomes_conversation_prompts_and_final_replies(tmp_path):
    src = write_jsonl_rows(tmp_path / "raw" / "train.jsonl", HH_ROWS)
    [out] = prepare(["hh-rlhf"], tmp_path / "data", from_path=src)
    assert out.path == tmp_path / "data" / "hh-rlhf.jsonl" and out.kind == "preference"
    assert read_jsonl(out.path) == [
        {"messages": [{"role": "user", "content": "What is 2+2?"}], "chosen": "4.", "rejected": "5."},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                      {"role": "user", "content": "Name a fruit."}],
         "chosen": "An apple.", "rejected": "A carrot."},
    ]


def test_unconvertible_rows_are_skipped_and_counted_by_reason(tmp_path):
    src = write_jsonl_rows(tmp_path / "hh.jsonl", HH_ROWS)
    [out] = prepare(["hh-rlhf"], tmp_path, from_path=src)
    assert (out.rows_written, out.rows_skipped) == (2, 3)
    assert out.skipped_because == {"chosen same as rejected": 1, "empty reply": 1,
                                   "chosen and rejected follow different conversations": 1}
    assert str(out).startswith(f"wrote {out.path}: 2 preference rows, 3 skipped (")


def test_belle_json_list_joins_instruction_and_input(tmp_path):
    src = tmp_path / "Belle_open_source_0.5M.json"
    src.write_text(json.dumps(INSTRUCTION_ROWS, ensure_ascii=False), encoding="utf-8")
    [out] = prepare(["belle"], tmp_path / "data", from_path=src)
    assert out == PreparedFile(tmp_path / "data" / "belle.jsonl", "sft", 2, 1, {"empty reply": 1})
    assert read_jsonl(out.path) == [{"prompt": "把这句话翻译成英文。\n你好", "response": "Hello"},
                                    {"prompt": "写一个关于春天的句子。", "response": "春天来了，花开了。"}]


def test_several_data_sets_from_one_directory_and_max_samples(tmp_path):
    write_jsonl_rows(tmp_path / "raw" / "hh-rlhf" / "helpful-base" / "train.jsonl", HH_ROWS)
    write_jsonl_rows(tmp_path / "raw" / "hh-rlhf" / "helpful-base" / "test.jsonl", HH_ROWS[:1])  # other split
    write_jsonl_rows(tmp_path / "raw" / "alpaca-chinese.jsonl", INSTRUCTION_ROWS)
    hh_out, alpaca_out = prepare(["hh-rlhf", "alpaca-chinese"], tmp_path / "data", from_path=tmp_path / "raw",
                                 max_samples=1)
    assert (hh_out.rows_written, hh_out.rows_skipped) == (1, 0)
    assert read_jsonl(alpaca_out.path) == [{"prompt": "把这句话翻译成英文。\n你好", "response": "Hello"}]
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
                        {"messages": [user], "chosen": "Hello", "rejected": "Go away"},
                        {"prompt": "Hi", "chosen": "Hello", "rejected": "No"}],  # the repeated prompt is dropped
        "sharegpt.jsonl": [{"messages": [user, bot]}],
        "completions.jsonl": [{"prompt": "1+1=", "response": "2"}, {"messages": [user, bot]}],
    }
    for name, rows in sources.items():
        src = write_jsonl_rows(tmp_path / "raw" / name, rows)
        [out] = prepare([], tmp_path / "data", hf=[f"someone/{src.stem}"], from_path=src)
        assert out.path.name == f"{src.stem}.jsonl"
        assert read_jsonl(out.path) == expected[name], name
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
        prepare(["hh-rlhf"], tmp_path, from_path=src)
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
