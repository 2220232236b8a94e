import json

import pytest

from lmrl.common.data import DataError
from lmrl.tasks.preference_data import (PreferenceRow, SFTRow, TruncationCounter, read_preference, read_sft,
                                        truncate_pair)

GOOD_PAIR = {"prompt": "2+2?", "chosen": "4", "rejected": "5"}


def write(tmp_path, *rows, name="data.jsonl"):
    """One row a line; a str row is written as-is (a blank line, broken JSON)."""
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def error_of(reader, path) -> str:
    with pytest.raises(DataError) as e:
        reader(path)
    return str(e.value)


def test_reads_string_and_conversation_prompts(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    path = write(tmp_path, GOOD_PAIR, "", {"messages": messages, "chosen": "Paris", "rejected": "Lyon"})
    assert read_preference(path) == [PreferenceRow("2+2?", "4", "5"), PreferenceRow(messages, "Paris", "Lyon")]


@pytest.mark.parametrize("bad, field", [
    ({"prompt": "p", "rejected": "r"}, "missing key 'chosen'"),
    ({"prompt": "p", "chosen": "c"}, "missing key 'rejected'"),
    ({"prompt": "p", "chosen": 4, "rejected": "r"}, "'chosen' must be a string or a list of {role, content} "
                                                     "messages, got a number (4)"),
    ({"prompt": "p", "chosen": "c", "rejected": ["r"]}, "'rejected'[0] must be an object with string 'role'"),
    ({"prompt": {"text": "p"}, "chosen": "c", "rejected": "r"}, "'prompt' must be a string or a list of {role, "
                                                                "content} messages, got an object"),
    ({"prompt": "p", "chosen": "c", "rejected": [{"role": "assistant", "content": "r"}]},
     "'chosen' is a string but 'rejected' is a list of messages; give both the same way"),
    ({"prompt": "p", "chosen": "", "rejected": "r"}, "'chosen' is empty"),
    ({"prompt": "p", "chosen": "c", "rejected": "  \n"}, "'rejected' is empty"),
    ({"prompt": " ", "chosen": "c", "rejected": "r"}, "'prompt' is empty"),
    ({"chosen": "cats", "rejected": "dogs"}, "'chosen' and 'rejected' share no beginning, so there is no prompt"),
    ({"messages": "p", "chosen": "c", "rejected": "r"}, "'messages' must be a list of {role, content} messages, "
                                                        "got a string"),
    ({"prompt": "p", "messages": [{"role": "user", "content": "p"}], "chosen": "c", "rejected": "r"},
     "both 'prompt' and 'messages'"),
])
def test_a_bad_preference_row_names_file_line_and_field(tmp_path, bad, field):
    path = write(tmp_path, GOOD_PAIR, "", bad)  # the blank line still counts: the bad row is on line 3
    msg = error_of(read_preference, path)
    assert msg.startswith(f"{path}:3: ") and field in msg


def test_identical_chosen_and_rejected_is_refused(tmp_path):
    path = write(tmp_path, GOOD_PAIR, {"prompt": "p", "chosen": "same answer", "rejected": "same answer "})
    msg = error_of(read_preference, path)
    assert msg.startswith(f"{path}:2: 'chosen' and 'rejected' are the same text") and '"same answer"' in msg


def test_sft_prompt_response_and_prompt_completion(tmp_path):
    path = write(tmp_path, {"prompt": "1+1=", "response": "2"}, {"prompt": "2+2=", "completion": "4"})
    assert read_sft(path) == [
        SFTRow([{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}], chat=False),
        SFTRow([{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}], chat=False)]


def test_sft_messages_and_sharegpt_conversations(tmp_path):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    sharegpt = [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "hi"},
                {"from": "gpt", "value": "hello"}]
    path = write(tmp_path, {"messages": messages}, {"conversations": sharegpt}, {"conversations": messages})
    rows = read_sft(path)
    assert rows[0] == SFTRow(messages, chat=True)
    assert rows[1] == SFTRow([{"role": "system", "content": "Be kind."}, *messages], chat=True)
    assert rows[2] == SFTRow(messages, chat=True)


@pytest.mark.parametrize("bad, field", [
    ({"prompt": "p", "response": 7}, "'response' must be a string or a list of {role, content} messages, "
                                     "got a number (7)"),
    ({"prompt": "p", "response": ""}, "'response' is empty"),
    ({"prompt": "", "completion": "c"}, "'prompt' is empty"),
    ({"prompt": "p", "response": "r", "completion": "c"}, "both 'response' and 'completion'"),
    ({"prompt": "p"}, "needs one of 'prompt' + 'response' | 'prompt' + 'completion' | 'messages' | 'conversations' "
                      "| 'text' (the row has keys: 'prompt')"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "'messages' has no assistant turn"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "'messages'[0] 'role' is 'robot'"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]},
     "'conversations'[1] 'from' is 'bot'; ShareGPT speakers are 'human', 'gpt'"),
    ({"conversations": [{"from": "human", "text": "hi"}]}, "'conversations'[0] must be an object with string 'role'"),
    ({"conversations": []}, "'conversations' must be a non-empty list of turns, got []"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": " "}]},
     "'conversations'[1] is an empty assistant turn"),
    ({"prompt": "p", "completion": "c", "messages": [{"role": "assistant", "content": "a"}]},
     "the row has 'prompt' and 'messages'"),
])
def test_a_bad_sft_row_names_file_line_and_field(tmp_path, bad, field):
    path = write(tmp_path, {"prompt": "p", "response": "r"}, bad)
    msg = error_of(read_sft, path)
    assert msg.startswith(f"{path}:2: ") and field in msg


def test_truncate_pair_leaves_a_short_pair_alone():
    assert truncate_pair([1, 2], [3, 4], max_len=4) == ([1, 2], [3, 4], False)


def test_truncate_pair_cuts_the_prompt_from_the_left_first():
    assert truncate_pair([1, 2, 3, 4], [5, 6], max_len=4) == ([3, 4], [5, 6], True)


def test_truncate_pair_then_cuts_the_response_end_keeping_its_start():
    assert truncate_pair([1, 2], [3, 4, 5, 6, 7], max_len=3) == ([], [3, 4, 5], True)
    assert truncate_pair([], [3, 4, 5], max_len=2) == ([], [3, 4], True)
    with pytest.raises(ValueError, match="max_len must be at least 1, got 0"):
        truncate_pair([1], [2], max_len=0)


def test_truncation_counter_counts_every_cut_and_drops_no_row():
    counter = TruncationCounter()
    pairs = [([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1], [2, 3, 4, 5]), ([], [1, 2])]
    out = [counter.truncate(p, r, max_len=3) for p, r in pairs]
    assert out == [([1, 2], [3]), ([3, 4], [5]), ([], [2, 3, 4]), ([], [1, 2])]
    assert (counter.rows, counter.truncated, counter.fraction) == (4, 2, 0.5)
    assert str(counter) == "2 of 4 rows truncated (50.0%)"
