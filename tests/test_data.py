import json
import os

import pytest

from lmrl.common.data import DataError, read_jsonl, write_jsonl

PROMPT_OR_MESSAGES = [["prompt"], ["messages"]]


def write(tmp_path, text: str, name="data.jsonl"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path, *args, **kwargs) -> str:
    with pytest.raises(DataError) as e:
        read_jsonl(path, *args, **kwargs)
    return str(e.value)


def test_reads_rows_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, '{"prompt": "1+1?", "ground_truth": "2"}\n\n  \n'
                           '{"messages": [{"role": "user", "content": "hi"}]}\n')
    rows = read_jsonl(path, alternatives=PROMPT_OR_MESSAGES)
    assert rows == [{"prompt": "1+1?", "ground_truth": "2"}, {"messages": [{"role": "user", "content": "hi"}]}]


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)


def test_invalid_json_names_file_line_and_parser_message(tmp_path):
    path = write(tmp_path, '{"prompt": "a"}\n\n{"prompt": "b",}\n')
    msg = error_of(path)
    assert msg.startswith(f"{path}:3: invalid JSON")
    assert "Expecting property name" in msg and "column 16" in msg


def test_a_row_that_is_not_an_object_names_its_line(tmp_path):
    path = write(tmp_path, '{"prompt": "a"}\n["prompt", "b"]\n')
    assert error_of(path) == f"{path}:2: expected a JSON object {{...}}, got a list"


def test_missing_required_key_lists_the_keys_the_row_has(tmp_path):
    path = write(tmp_path, '{"prompt": "a", "ground_truth": "1"}\n{"question": "b", "answer": "2"}\n')
    msg = error_of(path, ["prompt", "ground_truth"])
    assert msg == f"{path}:2: missing keys 'prompt', 'ground_truth' (the row has keys: 'question', 'answer')"


def test_alternatives_need_one_complete_set(tmp_path):
    ok = write(tmp_path, '{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n', "ok.jsonl")
    assert len(read_jsonl(ok, alternatives=PROMPT_OR_MESSAGES)) == 2
    bad = write(tmp_path, '{"prompt": "a"}\n{"text": "b"}\n', "bad.jsonl")
    msg = error_of(bad, alternatives=PROMPT_OR_MESSAGES)
    assert msg == f"{bad}:2: needs one of 'prompt' | 'messages' (the row has keys: 'text')"


def test_alternative_sets_of_several_keys(tmp_path):
    path = write(tmp_path, '{"prompt": "a", "chosen": "b"}\n')
    msg = error_of(path, alternatives=[["prompt", "chosen", "rejected"], ["messages"]])
    assert "needs one of 'prompt' + 'chosen' + 'rejected' | 'messages'" in msg and msg.startswith(f"{path}:1:")


def test_prompt_must_be_a_string(tmp_path):
    path = write(tmp_path, '{"prompt": ["a"]}\n')
    assert error_of(path) == f"{path}:1: 'prompt' must be a string, got a list"


def test_numeric_ground_truth_is_an_error_with_a_hint(tmp_path):
    path = write(tmp_path, '{"prompt": "a", "ground_truth": "1"}\n{"prompt": "b", "ground_truth": 19}\n')
    assert error_of(path) == f'{path}:2: \'ground_truth\' must be a string, got a number (write it as "19")'


def test_a_math_row_with_an_empty_ground_truth_names_its_line(tmp_path):
    from lmrl.tasks.math_task import read_rows

    path = write(tmp_path, '{"prompt": "a", "ground_truth": "1"}\n{"prompt": "b", "ground_truth": " "}\n')
    with pytest.raises(DataError) as e:
        read_rows(str(path))
    assert str(e.value) == f"{path}:2: 'ground_truth' is empty (' '): every completion would be scored wrong"
    rg = write(tmp_path, '{"prompt": "a", "ground_truth": "", "rg_config": {}}\n', "rg.jsonl")
    assert read_rows(str(rg))[0]["ground_truth"] == ""  # reasoning-gym scores its rows itself


@pytest.mark.parametrize("messages, expected", [
    ('"hi"', "'messages' must be a non-empty list of {role, content} objects, got a string"),
    ("[]", "'messages' must be a non-empty list of {role, content} objects, got an empty list"),
    ('[{"role": "user", "content": "a"}, {"role": "assistant"}]',
     """'messages'[1] must be an object with string 'role' and 'content', got {"role": "assistant"}"""),
    ('[{"role": "user", "content": 3}]',
     """'messages'[0] must be an object with string 'role' and 'content', got {"role": "user", "content": 3}"""),
])
def test_messages_must_be_a_list_of_role_content_dicts(tmp_path, messages, expected):
    path = write(tmp_path, f'{{"messages": {messages}}}\n')
    assert error_of(path) == f"{path}:1: {expected}"


def test_empty_file_is_an_error_naming_the_file(tmp_path):
    for text in ("", "\n  \n"):
        path = write(tmp_path, text)
        assert error_of(path) == f"{path}: the file has no rows (it is empty)"


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    assert error_of(path).startswith(f"{path}:2: not UTF-8 text")


def test_write_then_read_round_trips_unicode(tmp_path):
    rows = [{"prompt": "Zoë has 3 €", "ground_truth": "3"}, {"prompt": "x", "ground_truth": "½"}]
    path = write_jsonl(tmp_path / "out.jsonl", rows)
    assert read_jsonl(path, ["prompt", "ground_truth"]) == rows
    assert path.read_text(encoding="utf-8").splitlines()[0] == json.dumps(rows[0], ensure_ascii=False)


def test_write_is_atomic_and_leaves_no_temp_file_on_error(tmp_path):
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [{"prompt": "old"}])
    with pytest.raises(TypeError, match="row 1 is a list"):
        write_jsonl(path, [{"prompt": "new"}, ["not", "a", "dict"]])
    assert read_jsonl(path) == [{"prompt": "old"}]  # the old file is untouched
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_a_directory_given_as_the_data_file_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "train.jsonl"
    folder.mkdir()
    assert error_of(folder) == f"{folder}: cannot read the data file: Is a directory"


def test_a_row_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    assert error_of(path) == f"{path}:2: not UTF-8 text (invalid continuation byte at byte 15 of the line)"


def test_a_row_nested_too_deeply_is_one_line_naming_it(tmp_path):
    path = write(tmp_path, '{"prompt": "a"}\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert error_of(path) == f"{path}:2: invalid JSON: nested too deeply to read"


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n')
    assert read_jsonl(path) == [{"prompt": "a"}]
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a",}\n')  # the column counts from the row's first character
    assert error_of(path) == f"{path}:1: invalid JSON: Expecting property name enclosed in double quotes (column 16)"
