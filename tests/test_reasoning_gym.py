"""reasoning-gym data sets as rows (by name, size, seed and config) and their own scorers as lmrl's checker
and as a TRL reward function."""

from __future__ import annotations

import json
import sys
from decimal import Decimal

import pytest
import reasoning_gym

from lmrl.common.data import DataError
from lmrl.common.errors import MissingPackage
from lmrl.tasks import reasoning_gym as rg


def columns(rows: list[dict]) -> dict:
    """The rows' columns but the prompt, as TRL hands them to a reward function."""
    return {key: [row.get(key) for row in rows] for key in ("task", "metadata", "ground_truth", "rg_config")}


def test_rows_are_reasoning_gyms_entries_with_their_task_and_config():
    rows = rg.generate(["leg_counting", "basic_arithmetic"], size=3, seed=7, config={"leg_counting.max_animals": 4})
    assert [r["task"] for r in rows] == ["leg_counting"] * 3 + ["basic_arithmetic"] * 3
    legs = reasoning_gym.create_dataset("leg_counting", size=3, seed=7, max_animals=4)
    for row, entry in zip(rows, legs):
        assert (row["prompt"], row["ground_truth"], row["metadata"]) == (entry["question"], entry["answer"],
                                                                      json.loads(json.dumps(entry["metadata"])))
        assert row["rg_config"] == {"seed": 7, "size": 3, "max_animals": 4}
    assert rows[3]["rg_config"] == {"seed": 7, "size": 3}  # the scoped key set leg_counting's config only
    assert json.loads(json.dumps(rows)) == rows  # every column is plain JSON
    assert rows == rg.generate(["leg_counting", "basic_arithmetic"], size=3, seed=7,
                               config={"leg_counting.max_animals": 4})


def test_a_bare_config_key_sets_every_named_data_set_that_has_it():
    rows = rg.generate(["basic_arithmetic", "chain_sum"], size=2, seed=0, config={"max_terms": 2})
    assert all(r["rg_config"]["max_terms"] == 2 and r["metadata"]["num_terms"] <= 2 for r in rows)


def test_the_reward_scores_a_right_answer_1_and_a_wrong_one_0():
    rows = rg.generate(["basic_arithmetic", "word_sorting"], size=2, seed=3)
    right = [f"<think>easy</think> <answer>{r['ground_truth']}</answer>" for r in rows]
    wrong = ["<answer>-123456789</answer>", "<answer>-123456789</answer>", "<answer>zebra</answer>",
             "<answer>zebra</answer>"]
    assert rg.reward(right, **columns(rows)) == [1.0] * 4
    assert rg.reward(wrong, **columns(rows)) == [0.0] * 4


def test_the_answer_is_the_last_answer_block_else_the_last_line():
    assert rg.extract_answer("<answer>1</answer> then <answer> 2 </answer>\nsomething") == "2"
    assert rg.extract_answer("Let me count.\n\n  The total is:\n292  \n\n") == "292"
    assert rg.extract_answer([{"role": "assistant", "content": "x\n7"}]) == "7"  # TRL's conversational form
    assert rg.extract_answer("  \n") is None
    [row] = rg.generate(["leg_counting"], size=1, seed=0)
    assert rg.reward([f"Counting legs...\n{row['ground_truth']}"], **columns([row])) == [1.0]


def test_the_reward_is_none_for_rows_that_are_not_reasoning_gyms():
    [row] = rg.generate(["basic_arithmetic"], size=1, seed=0)
    math_row = {"ground_truth": "4"}
    assert rg.reward(["<answer>4</answer>", f"<answer>{row['ground_truth']}</answer>"],
                     **columns([math_row, row])) == [None, 1.0]


def test_scores_use_the_config_the_row_was_made_with():
    # decimal_arithmetic's scorer allows an error of one unit in the config's last decimal place
    [row] = rg.generate(["decimal_arithmetic"], size=1, seed=0,
                        config={"min_num_decimal_places": 1, "max_num_decimal_places": 1})
    close = f"<answer>{Decimal(row['ground_truth']) + Decimal('0.05')}</answer>"
    assert rg.reward([close], **columns([row])) == [1.0]
    assert rg.reward([close], **columns([{**row, "rg_config": {}}])) == [0.0]  # the default: 3 places


def test_check_applies_the_math_rewards_format_rule_and_weights():
    [row] = rg.generate(["basic_arithmetic"], size=1, seed=0)
    tagged, bare = f"<think>t</think> <answer>{row['ground_truth']}</answer>", f"so {row['ground_truth']}\n{row['ground_truth']}"
    assert rg.check(tagged, row, format_weight=0.2) == rg.RewardInfo(1.2, True, True)
    assert rg.check(bare, row, require_format=True) == rg.RewardInfo(0.0, False, False)
    assert rg.check(bare, row, require_format=False) == rg.RewardInfo(1.0, False, True)


def test_open_ended_data_sets_keep_an_empty_ground_truth_and_score_by_the_puzzle():
    [row] = rg.generate(["graph_color"], size=1, seed=0)
    assert row["ground_truth"] == ""
    assert rg.reward(["<answer>no idea</answer>"], **columns([row])) == [0.0]


def test_an_unknown_data_set_name_lists_close_matches():
    with pytest.raises(DataError, match=r"^unknown reasoning-gym data set 'leg_count'; did you mean leg_counting or "):
        rg.generate(["leg_count"], size=2)


@pytest.mark.parametrize("names, config, message", [
    (["leg_counting"], {"max_animal": 3}, "reasoning-gym leg_counting has no config key 'max_animal'; did you mean "
                                          "max_animals or min_animals?"),
    (["leg_counting", "basic_arithmetic"], {"max_terms": 3}, "reasoning-gym leg_counting has no config key "
                                                             "'max_terms'; did you mean max_animals? (name one data "
                                                             "set as NAME.key to set it there only)"),
    (["leg_counting"], {"chain_sum.max_terms": 3}, "'chain_sum' is not one of the data sets named"),
    (["leg_counting"], {"seed": 3}, "the seed is set on its own"),
    (["basic_arithmetic"], {"min_terms": 5, "max_terms": 2}, "reasoning-gym basic_arithmetic: its config seed=0 "
                                                             "size=2 min_terms=5 max_terms=2 was refused"),
    (["leg_counting", "leg_counting"], {}, "leg_counting named twice"),
])
def test_bad_names_and_config_keys_are_one_line_errors(names, config, message):
    with pytest.raises(DataError) as e:
        rg.generate(names, size=2, seed=0, config=config)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_data_sets_whose_metadata_does_not_survive_json_are_refused():
    with pytest.raises(DataError, match="reasoning-gym arc_agi item 0: the entry's own answer scores 0.05, not 1"):
        rg.generate(["arc_agi"], size=1, seed=0)


def test_a_missing_reasoning_gym_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` fail
    with pytest.raises(MissingPackage, match=r"pip install 'lmrl\[reasoning-gym\]'"):
        rg.extract_answer("<answer>1</answer>")
