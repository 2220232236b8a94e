import random
import re

import pytest

from lmrl.common.data import read_jsonl
from lmrl.tasks.preference_data import read_preference, read_sft
from lmrl.tasks.synthetic_preferences import (CONCISE, generate_preferences, write_preference_splits,
                                              write_sft_splits, wrong_result)

EQUATION = re.compile(r"^(\d+) ([+\-×]) (\d+) = (\d+)\.$")
RESULT = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b}
N_CONCISE = sum(len(items) for _, _, items in CONCISE.values())  # 442 distinct concise items


def test_same_seed_same_rows_other_seed_other_rows():
    assert generate_preferences(200, seed=3) == generate_preferences(200, seed=3)
    assert generate_preferences(200, seed=3) != generate_preferences(200, seed=4)


def test_rows_mix_both_kinds_and_every_pair_differs():
    rows = generate_preferences(400, seed=0)
    arithmetic = [r for r in rows if EQUATION.match(r["chosen"])]
    assert 100 < len(arithmetic) < 300  # about half of each kind
    assert all(r["chosen"] != r["rejected"] for r in rows)
    assert len({r["prompt"] for r in rows}) == 400


def test_arithmetic_chosen_is_right_and_rejected_is_the_same_sentence_wrong():
    for row in generate_preferences(300, seed=1, kinds=("arithmetic",)):
        a, op, b, chosen = EQUATION.match(row["chosen"]).groups()
        a2, op2, b2, rejected = EQUATION.match(row["rejected"]).groups()
        assert (a, op, b) == (a2, op2, b2) and f"{a} {op} {b}" in row["prompt"]
        assert int(chosen) == RESULT[op](int(a), int(b))
        assert int(rejected) != int(chosen) and int(rejected) >= 0


def test_a_wrong_result_is_off_by_a_little_or_two_digits_swapped():
    rng = random.Random(0)
    for result in [0, 1, 10, 85, 100, 120, 999, 1234]:
        for _ in range(50):
            wrong = wrong_result(rng, result)
            swapped = sorted(str(wrong)) == sorted(str(result)) and len(str(wrong)) == len(str(result))
            assert wrong != result and wrong >= 0 and (0 < abs(wrong - result) <= 10 or swapped), (result, wrong)


def test_concise_chosen_is_shorter_and_rejected_holds_the_same_answer():
    for row in generate_preferences(300, seed=2, kinds=("concise",)):
        assert len(row["chosen"]) < len(row["rejected"]) and row["rejected"].count(row["chosen"]) == 2


def test_concise_answers_are_filled_from_their_items():
    rows = generate_preferences(N_CONCISE, seed=0, kinds=("concise",))  # every item once, in some phrasing
    [japan] = [r for r in rows if "capital of Japan" in r["prompt"]]
    assert japan["chosen"] == "The capital of Japan is Tokyo."
    [planet] = [r for r in rows if "letters" in r["prompt"] and "'planet'" in r["prompt"]]
    assert planet["chosen"] == "The word 'planet' has 6 letters."
    assert CONCISE["reverse"][1].format("apple", "elppa") == "'apple' backwards is 'elppa'."


def test_asking_for_more_concise_items_than_exist_is_an_error():
    with pytest.raises(ValueError, match=f"could only make {N_CONCISE} distinct items"):
        generate_preferences(N_CONCISE + 1, seed=0, kinds=("concise",))
    with pytest.raises(ValueError, match="unknown kinds"):
        generate_preferences(5, seed=0, kinds=("poetry",))


def item(row) -> tuple:
    """What a row asks, whatever its phrasing: 37 + 48 and "Compute 48 + 37." are one item."""
    m = EQUATION.match(row.chosen)
    if not m:
        return ("concise", row.chosen)
    a, op, b, _ = m.groups()
    return (op, *sorted((a, b))) if op != "-" else (op, a, b)


def test_splits_are_loadable_and_share_no_question(tmp_path):
    train, test = write_preference_splits(tmp_path, 600, 100, seed=0)
    assert (train, test) == (tmp_path / "train.jsonl", tmp_path / "test.jsonl")
    train_rows, test_rows = read_preference(train), read_preference(test)  # every row loads
    assert (len(train_rows), len(test_rows)) == (600, 100)
    assert not {r.prompt for r in train_rows} & {r.prompt for r in test_rows}
    assert not {item(r) for r in train_rows} & {item(r) for r in test_rows}
    assert len({item(r) for r in train_rows + test_rows}) == 700


def test_sft_splits_are_the_chosen_side_of_the_same_seed(tmp_path):
    pref_train, pref_test = write_preference_splits(tmp_path / "pref", 150, 50, seed=5)
    sft_train, sft_test = write_sft_splits(tmp_path / "sft", 150, 50, seed=5)
    assert len(read_sft(sft_train)) == 150 and len(read_sft(sft_test)) == 50
    for pref, sft in [(pref_train, sft_train), (pref_test, sft_test)]:
        assert read_jsonl(sft) == [{"prompt": r["prompt"], "response": r["chosen"]} for r in read_jsonl(pref)]
