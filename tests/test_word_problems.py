import re

import pytest

from lmrl.common.data import read_jsonl
from lmrl.tasks.word_problems import generate_word_problems, write_splits

ALL_KINDS = ("add", "sub", "mul", "div")


def numbers(prompt: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", prompt)]


def test_rows_are_prompt_and_string_ground_truth():
    rows = generate_word_problems(20, seed=0)
    assert len(rows) == 20
    for row in rows:
        assert set(row) == {"prompt", "ground_truth"}
        assert row["prompt"].endswith("?") and row["ground_truth"].isdigit()


def test_same_seed_same_rows_other_seed_other_rows():
    assert generate_word_problems(50, seed=3) == generate_word_problems(50, seed=3)
    assert generate_word_problems(50, seed=3) != generate_word_problems(50, seed=4)


@pytest.mark.parametrize("kind, answer_of", [
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a // b),
])
def test_answers_are_right_for_every_kind(kind, answer_of):
    # every template names its two numbers in the order the answer uses them
    for row in generate_word_problems(200, seed=1, kinds=(kind,)):
        a, b = numbers(row["prompt"])
        if kind == "div":
            assert a % b == 0, row
        assert row["ground_truth"] == str(answer_of(a, b)), row


def test_no_negative_answers_and_operands_within_max_value():
    for row in generate_word_problems(2000, seed=2, kinds=ALL_KINDS, max_value=30):
        assert int(row["ground_truth"]) >= 1, row  # subtraction never takes all, division is exact
        assert max(numbers(row["prompt"])) <= 30, row


def test_a_hand_checked_problem():
    assert generate_word_problems(1, seed=0, kinds=("sub",)) == [{
        "prompt": "A jar holds 35 apples. Lena takes out 33 apples. How many apples are still in the jar?",
        "ground_truth": "2"}]


def test_prompts_are_distinct():
    rows = generate_word_problems(3000, seed=5, kinds=ALL_KINDS)
    assert len({r["prompt"] for r in rows}) == 3000


def test_unknown_kind_and_too_small_a_space_are_errors():
    with pytest.raises(ValueError, match="unknown kinds \\['pow'\\]"):
        generate_word_problems(5, seed=0, kinds=("add", "pow"))
    with pytest.raises(ValueError, match="could only make .* distinct problems"):
        generate_word_problems(100_000, seed=0, kinds=("div",), max_value=8)


def test_write_splits_has_no_prompt_in_both(tmp_path):
    train_path, test_path = write_splits(tmp_path / "wp", n_train=400, n_test=100, seed=7)
    assert (train_path.name, test_path.name) == ("train.jsonl", "test.jsonl")
    train = read_jsonl(train_path, ["prompt", "ground_truth"])
    test = read_jsonl(test_path, ["prompt", "ground_truth"])
    assert (len(train), len(test)) == (400, 100)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    # deterministic: the same call writes the same files
    again = write_splits(tmp_path / "wp2", n_train=400, n_test=100, seed=7)
    assert again[0].read_text() == train_path.read_text() and again[1].read_text() == test_path.read_text()
