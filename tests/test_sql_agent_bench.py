"""benchmarks/sql_agent.py's DBBench table without a model: rows per type, each stage's tally, and the
last stage's paired difference from each earlier one (the benchmark itself trains for half an hour)."""

import pytest

from benchmarks.sql_agent import dbbench_table, format_dbbench_table, outcomes_by_row
from lmrl.train.file_eval import Tally, paired_difference_interval

TYPES = ["INSERT"] * 4 + ["UPDATE"] * 2 + ["aggregation-SUM", "aggregation-MAX", "counting"]


def records(*correct: int) -> list[dict]:
    """`evaluate_file` records of the nine TYPES, right where `correct` says 1."""
    return [{"index": i, "type": kind, "correct": bool(c), "completion": "..."}
            for i, (kind, c) in enumerate(zip(TYPES, correct))]


BASE = records(0, 0, 0, 0, 0, 1, 0, 1, 0)
SFT = records(1, 1, 0, 0, 1, 1, 0, 1, 0)
RL = records(1, 1, 1, 1, 1, 1, 1, 1, 0)


def test_rows_are_the_types_with_aggregations_together_then_questions_and_overall():
    rows = outcomes_by_row(BASE)
    assert list(rows) == ["INSERT", "UPDATE", "counting", "aggregation", "questions", "overall"]
    assert rows["aggregation"] == {6: False, 7: True} and rows["questions"] == {6: False, 7: True, 8: False}
    assert len(rows["overall"]) == 9


def test_a_type_outside_the_usual_rows_comes_after_them():
    rows = outcomes_by_row(BASE + [{"index": 9, "type": "DELETE", "correct": True}])
    assert list(rows) == ["INSERT", "UPDATE", "counting", "aggregation", "DELETE", "questions", "overall"]
    assert 9 not in rows["questions"]  # a modification, not a question


def test_table_tallies_each_stage_and_pairs_the_last_with_each_earlier_one():
    table = {row["type"]: row for row in dbbench_table([("base", BASE), ("SFT", SFT), ("SFT + RL", RL)])}
    insert = table["INSERT"]
    assert insert["n"] == 4 and insert["stages"] == {"base": Tally(0, 4).as_dict(), "SFT": Tally(2, 4).as_dict(),
                                                     "SFT + RL": Tally(4, 4).as_dict()}
    from_base, from_sft = insert["differences"]
    assert (from_base["from"], from_base["to"], from_sft["from"]) == ("base", "SFT + RL", "SFT")
    assert from_base["difference"] == 1.0 and from_sft["difference"] == 0.5
    assert from_base["ci95"] == list(paired_difference_interval([True] * 4, [False] * 4))
    assert from_base["significant"] and from_base["ci95"][0] > 0   # 0/4 -> 4/4: its interval excludes 0
    assert not from_sft["significant"] and from_sft["ci95"][0] < 0  # 2/4 -> 4/4: it does not
    overall = table["overall"]
    assert overall["stages"]["base"] == Tally(2, 9).as_dict() and overall["stages"]["SFT + RL"] == Tally(8, 9).as_dict()
    assert overall["differences"][0]["ci95"] == list(paired_difference_interval(
        [r["correct"] for r in RL], [r["correct"] for r in BASE]))
    assert table["counting"]["differences"][0]["difference"] == 0.0 and not table["counting"]["differences"][0][
        "significant"]


def test_stages_that_answered_different_records_are_refused():
    with pytest.raises(ValueError, match="row 'INSERT': the stages answered different records"):
        dbbench_table([("base", BASE), ("trained", RL[1:])])


def test_the_printed_table_marks_a_gain_only_where_its_interval_excludes_zero():
    lines = format_dbbench_table(dbbench_table([("base", BASE), ("trained", RL)]))
    assert lines[0] == "| type | n | base | trained | trained − base |"
    low, high = paired_difference_interval([True] * 4, [False] * 4)
    assert lines[2] == f"| INSERT | 4 | 0.00 [0.00, 0.49] | 1.00 [0.51, 1.00] | +1.00 [{low:+.2f}, {high:+.2f}] gain |"
    by_row = {line.split(" | ")[0][2:]: line for line in lines[2:]}
    assert set(by_row) == {"INSERT", "UPDATE", "counting", "aggregation-*", "**questions**", "**overall**"}
    assert by_row["UPDATE"].endswith("+0.50 [-0.27, +0.91] |")  # 1/2 -> 2/2, no verdict (test_file_eval's by-hand case)
    assert by_row["**overall**"].endswith(" gain |")
