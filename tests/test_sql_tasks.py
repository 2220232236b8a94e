"""DBBench loading, answer checks and the table hash, and the procedural task generator."""

from __future__ import annotations

import ast
import hashlib
import json
import random
from pathlib import Path

import pytest

from lmrl.config import load_config
from lmrl.common.data import DataError
from lmrl.tasks.sql import (SKILLS, InProcessSandbox, ProceduralSQLTasks, Sandbox, SQLEnv, SQLEnvConfig, answers_match,
                            build_task, group_by_skill, is_heldout, load_dbbench, parse_answer_md5, table_md5)
from lmrl.tasks.sql.procedural import content_hash

DEV = Path("/work/shared/data/dbbench/dev.jsonl")
needs_dev = pytest.mark.skipif(not DEV.exists(), reason=f"{DEV} is not here")


def record(**changes) -> dict:
    base = {"description": "How many?", "add_description": "A table.", "type": ["counting"], "label": ["2"],
            "table": {"table_name": "t", "table_info": {"columns": [{"name": "a", "type": "TEXT"}],
                                                        "rows": [["x"], ["y"]]}}}
    return {**base, **changes}


def write(tmp_path, *records) -> Path:
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --- the DBBench loader ----------------------------------------------------------------------------------

@needs_dev
def test_dev_jsonl_loads_60_tasks_of_every_type():
    tasks = load_dbbench(DEV)
    groups = group_by_skill(tasks)
    assert len(tasks) == 60
    assert {k: len(v) for k, v in groups.items()} == {
        "INSERT": 20, "UPDATE": 20, "other": 4, "comparison": 4, "counting": 3, "ranking": 3,
        "aggregation-SUM": 2, "aggregation-MAX": 2, "aggregation-MIN": 1, "aggregation-AVG": 1}
    assert all(t.is_modification == (t.skill in ("INSERT", "UPDATE")) for t in tasks)
    assert all(t.table.rows and t.table.columns for t in tasks)


@needs_dev
def test_our_table_hash_reproduces_every_answer_md5_in_dev_jsonl():
    # Each modification record's label holds the reference SQL; run it and hash the table.
    modifications = [t for t in load_dbbench(DEV) if t.is_modification]
    assert len(modifications) == 40
    for task in modifications:
        with InProcessSandbox(task.table) as db:  # the sandbox's own rules: the allow-list passes them
            before = table_md5(db.table_rows())
            db.fetch_all(task.reference_sql)
            after = table_md5(db.table_rows())
        assert after == task.answer_md5, task.id
        assert before != task.answer_md5, task.id


@needs_dev
def test_every_dev_task_is_solved_in_the_env_by_its_reference_sql_or_label():
    # Modifications: the reference SQL as the agent's operation; questions: the label as the answer.
    for task in load_dbbench(DEV):
        turns = [run_sql(task.reference_sql), final([])] if task.is_modification else [final(list(task.label))]
        obs, reward, done, info = play(task, *turns)
        assert info["outcome"] == "correct", (task.id, obs)


@needs_dev
def test_all_60_dev_records_load_whole_into_the_sandbox_and_their_checks_tell_right_from_wrong():
    # As benchmarks/sql_agent.py plays them: a sandbox worker per episode, the sql-agent-smollm2 environment
    # (3 rounds, 300-character observations). Modifications are checked by the table's hash, questions by the label.
    env_config = load_config("sql-agent-smollm2").sql
    tasks = load_dbbench(DEV)
    assert len(tasks) == 60
    for task in tasks:
        with Sandbox(task.table, env_config.limits()) as db:
            as_text = [tuple(None if v is None else str(v) for v in row) for row in task.table.rows]
            assert sorted(db.table_rows(), key=repr) == sorted(as_text, key=repr), task.id  # every row, as written
        if task.is_modification:
            assert play(task, final([]), config=env_config)[3]["outcome"] == "wrong", task.id  # the table untouched
            solved = play(task, run_sql(task.reference_sql), final([]), config=env_config)
        else:
            assert task.label and all(isinstance(v, str) and v.strip() for v in task.label), task.id
            assert play(task, final(["not the answer"]), config=env_config)[3]["outcome"] == "wrong", task.id
            assert play(task, final([]), config=env_config)[3]["outcome"] == "wrong", task.id
            solved = play(task, final(list(task.label)), config=env_config)  # the label, written as the prompt asks
        assert solved[3]["outcome"] == "correct", (task.id, solved[0])


@needs_dev
def test_no_dev_question_query_is_refused_by_the_allow_list():
    # A question's sql.query is MySQL and often fails in SQLite, but never for want of an allowed function.
    records = [json.loads(line) for line in DEV.read_text().splitlines()]
    for task, record in zip(load_dbbench(DEV), records):
        query = (record.get("sql") or {}).get("query")
        if task.is_modification or not query:
            continue
        with InProcessSandbox(task.table) as db:
            assert "not authorized" not in db.run(query), (task.id, query)


@pytest.mark.parametrize("changes, line_2_error", [
    ({"table": None}, "missing field 'table'"),
    ({"description": None}, "missing field 'description'"),
    ({"table": {"table_name": "t", "table_info": {"columns": [{"name": "a"}]}}},
     "missing field 'table.table_info.rows'"),
    ({"type": ["INSERT"]}, "missing field 'answer_md5'"),
    ({"type": ["INSERT"], "answer_md5": "abc"}, "field 'answer_md5': answer_md5 'abc' is neither"),
    ({"type": []}, "field 'type' must be a list holding one type name"),
    ({"label": "2"}, "field 'label' must be a list (got str)"),
    ({"table": {"table_name": "t", "table_info": {"columns": [{"name": "a"}], "rows": [["x", "y"]]}}},
     "field 'table.table_info.rows[0]' has 2 values; the table has 1 columns"),
])
def test_bad_record_names_file_line_and_field(tmp_path, changes, line_2_error):
    bad = {k: v for k, v in record(**changes).items() if v is not None}
    path = write(tmp_path, record(), bad)
    with pytest.raises(DataError) as err:
        load_dbbench(path)
    assert str(err.value).startswith(f"{path}:2: {line_2_error}")


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps(record()) + "\n\n{oops\n")
    with pytest.raises(DataError, match=rf"^{path}:3: invalid JSON"):
        load_dbbench(path)


def test_table_with_no_rows_loads_and_runs(tmp_path):
    table = {"table_name": "Empty Table", "table_info": {"columns": [{"name": "a b", "type": "INT"}], "rows": []}}
    md5 = "[(None,)]"  # what DBBench stores when the table ends up empty
    path = write(tmp_path, record(table=table, label=["0"]), record(table=table, type=["DELETE"], answer_md5=md5))
    question, deletion = load_dbbench(path)
    assert question.table.rows == () and question.id == "bench-1"
    env = SQLEnv()
    env.reset(question)
    assert env.step('Action: Operation\n```sql\nSELECT COUNT(*) FROM "Empty Table"\n```')[0] == "[(0,)]"
    assert env.step("Action: Answer\nFinal Answer: [0]")[3]["outcome"] == "correct"
    env.reset(deletion)
    assert env.step("Action: Answer\nFinal Answer: []")[3]["outcome"] == "correct"  # empty stays empty


# --- answer checks and the hash --------------------------------------------------------------------------

@pytest.mark.parametrize("answer, label, expected", [
    (["2"], ["2.0"], True),
    ([21000], ["21000.0"], True),
    (["3.333"], ["3.3333333"], True),  # within 1e-2
    (["3.3"], ["3.3333333"], False),
    (["1,429"], ["1429"], True),
    (["99.8%"], ["99.8"], True),
    (["Rome", "Paris"], ["Paris", "Rome"], True),
    ([" 'Paris' "], ["Paris"], True),
    (["paris"], ["Paris"], False),  # case is kept
    (["Paris"], ["Paris", "Rome"], False),
    ([1, 2, 2], [2, 1, 2.001], True),
    ([1, 2], [1, 2, 2], False),  # numbers match one to one
    ([None], ["none"], True),
    (["0"], ["none"], False),
    ([], ["2"], False),
])
def test_answers_match(answer, label, expected):
    assert answers_match(answer, label) is expected


def test_table_md5_is_dbbench_formula_and_ignores_row_order():
    def md5(text):
        return hashlib.md5(text.encode()).hexdigest()
    # MySQL: md5(group_concat(substring(md5(concat_ws(',', a, b)), 1, 5) ORDER BY 1)); concat_ws skips NULL.
    expected = md5(",".join(sorted([md5("Ben,2")[:5], md5("Ana")[:5]])))
    assert table_md5([("Ben", "2"), ("Ana", None)]) == expected
    assert table_md5([("Ana", None), ("Ben", "2")]) == expected
    assert table_md5([("Ana", None), ("Ben", "3")]) != expected
    assert table_md5([("2", "Ben"), ("Ana", None)]) != expected  # column order matters
    assert table_md5([]) == "NULL"


def test_parse_answer_md5_reads_dbbench_form():
    digest = "09aa8fbf72f39362970f95a1276b957c"
    assert parse_answer_md5(f"[('{digest}',)]") == digest == parse_answer_md5(digest)
    assert parse_answer_md5("[(None,)]") == "NULL"
    with pytest.raises(ValueError):
        parse_answer_md5("[('not-a-digest',)]")


# --- procedural tasks ------------------------------------------------------------------------------------

def task_of(skill: str, seed: int):
    rng = random.Random(seed)
    while (task := build_task(rng, skill)) is None:
        pass
    return task


def play(task, *turns, config: SQLEnvConfig | None = None):
    env = SQLEnv(config)
    env.reset(task)
    for turn in turns:
        obs, reward, done, info = env.step(turn)
    return obs, reward, done, info


def run_sql(sql: str) -> str:
    return f"Action: Operation\n```sql\n{sql}\n```"


def final(items) -> str:
    return f"Action: Answer\nFinal Answer: {json.dumps(items)}"


@pytest.mark.parametrize("skill", [s for s in SKILLS if s not in ("insert", "update", "delete")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_question_label_is_what_a_correct_query_answers(skill, seed):
    task = task_of(skill, seed)
    assert task.skill == skill and task.answer_md5 is None and task.label
    env = SQLEnv()
    env.reset(task)
    obs, *_ = env.step(run_sql(task.reference_sql))
    items = [row[0] for row in ast.literal_eval(obs)]
    assert env.step(final(items))[3]["outcome"] == "correct"
    numbers = all(isinstance(x, (int, float)) for x in items)
    wrong = [items[0] + 1, *items[1:]] if numbers else [*items[1:], "Nobody Here"]
    assert play(task, final(wrong))[3]["outcome"] == "wrong"


@pytest.mark.parametrize("skill", ["insert", "update", "delete"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_modification_is_correct_after_the_reference_change_only(skill, seed):
    task = task_of(skill, seed)
    assert task.label == (task.reference_sql,) and len(task.answer_md5) == 32
    assert play(task, run_sql(task.reference_sql), final([]))[3]["outcome"] == "correct"
    assert play(task, final([]))[3]["outcome"] == "wrong"  # no change made
    table = '"' + task.table.name.replace('"', '""') + '"'
    twice = task.reference_sql if skill == "insert" else f"DELETE FROM {table}"
    assert play(task, run_sql(task.reference_sql), run_sql(twice), final([]))[3]["outcome"] == "wrong"


def test_tables_have_the_promised_shape():
    for task in ProceduralSQLTasks(seed=3).take(60):
        assert 5 <= len(task.table.rows) <= 15 + (task.skill == "insert")
        assert 3 <= len(task.table.columns) <= 5
        assert task.add_description.startswith(f"The name of this table is {task.table.name}, ")


def test_train_and_heldout_never_share_a_task():
    train = ProceduralSQLTasks(seed=0).take(400)
    heldout = ProceduralSQLTasks(seed=0, split="heldout").take(60)
    assert not {content_hash(t) for t in train} & {content_hash(t) for t in heldout}
    assert not any(is_heldout(t) for t in train) and all(is_heldout(t) for t in heldout)
    assert len({t.id for t in train}) == 400
    assert {t.skill for t in train} == set(SKILLS)


def test_same_seed_same_tasks_other_seed_other_tasks():
    ids = [t.id for t in ProceduralSQLTasks(seed=5).take(20)]
    assert ids == [t.id for t in ProceduralSQLTasks(seed=5).take(20)]
    assert ids != [t.id for t in ProceduralSQLTasks(seed=6).take(20)]


def test_unknown_skill_or_split_is_refused():
    with pytest.raises(ValueError, match="unknown skills \\['join'\\]"):
        ProceduralSQLTasks(skills=["join"])
    with pytest.raises(ValueError, match="split must be one of"):
        ProceduralSQLTasks(split="test")
