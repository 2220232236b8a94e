"""The SQL sandbox refuses or cuts off hostile SQL, the turn protocol is parsed strictly, and
SQLEnv episodes end with the right rewards."""

from __future__ import annotations

import ast
import time

import pytest

from lmrl.tasks.sql import (InProcessSandbox, Sandbox, SandboxLimits, SQLEnv, SQLEnvConfig, SQLTask, Table,
                            parse_action, table_md5)
from lmrl.tasks.sql.checking import row_hash

TABLE = Table(name='Bob\'s "odd" table', columns=(("name", "TEXT"), ("home city", "TEXT"), ("age", "INTEGER")),
              rows=(("Ana", "Oslo", 31), ("Ben", "Lima", 45), ("Chen", "Oslo", 28)))
T = '"Bob\'s ""odd"" table"'
FAST = SandboxLimits(max_rows=5, max_chars=200, query_timeout_s=0.2)
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c)"


def op(sql: str) -> str:
    return f"I will run a query.\nAction: Operation\n```sql\n{sql}\n```"


def answer(items: list) -> str:
    return f"I am sure now.\nAction: Answer\nFinal Answer: {items!r}"


def question(label=("2",)) -> SQLTask:
    return SQLTask(id="q", description="How many people live in Oslo?", add_description="One table.",
                   table=TABLE, skill="count", label=tuple(label))


@pytest.fixture
def db():
    with Sandbox(TABLE, FAST) as sandbox:
        yield sandbox


# --- the sandbox -----------------------------------------------------------------------------------------

def test_table_with_quotes_and_spaces_in_names_is_built_and_queried(db):
    assert db.run(f'SELECT name FROM {T} WHERE "home city" = \'Oslo\' ORDER BY name') == "[('Ana',), ('Chen',)]"
    assert db.run("SELECT age FROM `Bob's \"odd\" table` WHERE name = 'Ben'") == "[(45,)]"


def test_attach_of_a_file_is_refused_and_no_file_appears(db, tmp_path):
    evil = tmp_path / "evil.db"
    assert db.run(f"ATTACH DATABASE '{evil}' AS evil") == "Error: not authorized: ATTACH is disabled in this sandbox"
    assert db.run(f"VACUUM INTO '{tmp_path / 'copy.db'}'").startswith("Error: not authorized: ATTACH")
    assert list(tmp_path.iterdir()) == []
    assert db.run(f"SELECT COUNT(*) FROM {T}") == "[(3,)]"


def test_load_extension_is_refused(db):
    assert db.run("SELECT load_extension('/tmp/evil.so')") == \
        "Error: not authorized: load_extension() is disabled in this sandbox"


def test_pragma_writes_are_refused_and_change_nothing(db):
    assert db.run("PRAGMA user_version = 7").startswith("Error: not authorized: PRAGMA")
    assert db.run("PRAGMA writable_schema = ON").startswith("Error: not authorized: PRAGMA")
    with InProcessSandbox(TABLE, FAST) as local:  # the same rules in this process, to look behind their back
        assert local.run("PRAGMA user_version = 7").startswith("Error: not authorized: PRAGMA")
        assert local.run("PRAGMA writable_schema = ON").startswith("Error: not authorized: PRAGMA")
        local.conn.set_authorizer(None)
        assert local.conn.execute("PRAGMA user_version").fetchone() == (0,)
        assert local.conn.execute("PRAGMA writable_schema").fetchone() == (0,)


@pytest.mark.parametrize("sql, what", [
    (f"DROP TABLE {T}", "changing the schema"),
    (f"ALTER TABLE {T} RENAME TO other", "ALTER TABLE"),
    ("CREATE TABLE other (x)", "changing the schema"),
    ("CREATE TEMP VIEW v AS SELECT 1", "changing the schema"),
    (f"CREATE TRIGGER tr AFTER INSERT ON {T} BEGIN SELECT 1; END", "CREATE TRIGGER"),
    ("BEGIN", "TRANSACTION"),
    ("SAVEPOINT s", "SAVEPOINT"),
    ("SELECT * FROM pragma_table_info('x')", "changing the schema"),
    ("SELECT sqlite_version()", "sqlite_version()"),
    ("SELECT random()", "random()"),
    ("SELECT json_extract('{}', '$.a')", "json_extract()"),
])
def test_statements_and_functions_outside_the_allow_list_are_refused(db, sql, what):
    assert db.run(sql) == f"Error: not authorized: {what} is disabled in this sandbox"
    assert db.run(f"SELECT COUNT(*) FROM {T}") == "[(3,)]"


def test_what_dbbench_tasks_need_is_allowed(db):
    assert db.run(f"SELECT upper(name), length(name), round(age / 7.0, 2), substr(\"home city\", 1, 2) FROM {T} "
                  f"WHERE name LIKE 'A%'") == "[('ANA', 3, 4.43, 'Os')]"
    assert db.run(f"SELECT \"home city\", COUNT(*), AVG(age), MAX(age) FROM {T} GROUP BY 1 ORDER BY 1") == \
        "[('Lima', 1, 45.0, 45), ('Oslo', 2, 29.5, 31)]"
    assert db.run(f"SELECT name, rank() OVER (ORDER BY age DESC) FROM {T}") == \
        "[('Ben', 1), ('Ana', 2), ('Chen', 3)]"
    assert db.run(f"WITH old AS (SELECT * FROM {T} WHERE age > 30) SELECT group_concat(name) FROM old") == \
        "[('Ana,Ben',)]"
    assert db.run("SELECT date('2020-01-31', '+1 day'), strftime('%Y', '1998-03-19'), abs(-2), coalesce(NULL, 1)") == \
        "[('2020-02-01', '1998', 2, 1)]"
    assert db.run(f"INSERT INTO {T} VALUES ('Dara', 'Lima', 52)") == "[]"
    assert db.run(f"UPDATE {T} SET age = age + 1 WHERE name = 'Dara'") == "[]"
    assert db.run(f"DELETE FROM {T} WHERE age > 50") == "[]"
    assert db.run("SELECT name FROM sqlite_master") == "[('Bob\\'s \"odd\" table',)]"


def test_runaway_recursive_cte_is_cut_at_max_rows(db):
    start = time.monotonic()
    observation = db.run(f"{ENDLESS} SELECT x FROM c")
    assert time.monotonic() - start < 10  # a cut query returns at once; an uncut one never would
    assert observation == "[(1,), (2,), (3,), (4,), (5,)] [TRUNCATED] (more than 5 rows)"


def test_endless_aggregate_times_out(db):
    start = time.monotonic()
    assert db.run(f"{ENDLESS} SELECT COUNT(*) FROM c") == "Error: query timed out after 0.2 s and was stopped"
    assert time.monotonic() - start < 10  # bounded by the 0.2 s timeout, not by the query
    assert db.run(f"SELECT COUNT(*) FROM {T}") == "[(3,)]"  # the connection still works


def test_million_row_result_shows_max_rows_within_max_chars():
    with Sandbox(TABLE, SandboxLimits(max_rows=100, max_chars=120)) as db:
        observation = db.run(f"{ENDLESS} SELECT x, 'padding' FROM c LIMIT 1000000")
    assert observation.startswith("[(1, 'padding'), (2, 'padding')")
    assert observation.endswith("[TRUNCATED]")
    assert len(observation) == 120 + len("[TRUNCATED]")


def test_huge_value_is_refused(db):
    doubling = "WITH RECURSIVE s(v) AS (SELECT 'x' UNION ALL SELECT v || v FROM s)"
    assert db.run(f"{doubling} SELECT max(length(v)) FROM s") == "Error: string or blob too big"


def test_database_growth_is_capped_and_temp_tables_are_refused():
    wide = "'" + "x" * 500 + "'"
    with Sandbox(TABLE, SandboxLimits(max_db_bytes=1 << 20)) as db:
        observation = db.run(f"INSERT INTO {T} (name) {ENDLESS} SELECT {wide} FROM c LIMIT 100000")
        assert observation == "Error: database or disk is full"
        assert db.run(f"CREATE TEMP TABLE big AS SELECT {wide}") == \
            "Error: not authorized: changing the schema is disabled in this sandbox"
        assert db.run(f"SELECT COUNT(*) FROM {T}") == "[(3,)]"


def test_multiple_statements_are_refused_and_none_runs(db):
    assert db.run(f"SELECT 1; DROP TABLE {T}") == "Error: only one SQL statement can run per turn"
    assert db.run(f"SELECT COUNT(*) FROM {T}") == "[(3,)]"


def test_sql_errors_become_observations(db):
    assert db.run("SELEC nonsense") == 'Error: near "SELEC": syntax error'
    assert db.run("SELECT missing FROM nowhere") == "Error: no such table: nowhere"
    assert db.run(f"UPDATE {T} SET age = 46 WHERE name = 'Ben'") == "[]"


def test_table_rows_is_none_once_the_table_is_gone():
    with InProcessSandbox(TABLE, FAST) as db:
        assert sorted(db.table_rows()) == sorted(TABLE.rows)
        db.conn.set_authorizer(None)  # the model cannot drop it: do it behind the sandbox's back
        db.conn.execute(f"DROP TABLE {T}")
        assert db.table_rows() is None


# --- the protocol ----------------------------------------------------------------------------------------

def test_operation_with_reasoning_before_it_is_parsed():
    action = parse_action("Let me count.\nAction: Operation\n```sql\nSELECT COUNT(*)\nFROM t;\n```\n")
    assert (action.kind, action.sql) == ("operation", "SELECT COUNT(*)\nFROM t;")


@pytest.mark.parametrize("text, items", [
    ('Action: Answer\nFinal Answer: ["Paris", "Rome"]', ["Paris", "Rome"]),
    ("Action: Answer\nFinal Answer: ['O\\'Neil', 2.5]\nThat is all.", ["O'Neil", 2.5]),
    ("Action: Answer\nFinal Answer: [\n  \"a\",\n  \"b\"\n]", ["a", "b"]),
    ("Action: Answer\nFinal Answer: []", []),
])
def test_answer_list_is_parsed(text, items):
    action = parse_action(text)
    assert (action.kind, action.answer) == ("answer", items)


@pytest.mark.parametrize("text, reason", [
    ("The answer is Paris.", "no 'Action: Operation' or 'Action: Answer' line"),
    ("Action: Operation\n```sql\nSELECT 1\n```\n```sql\nSELECT 2\n```", "2 ```sql blocks; write exactly one per turn"),
    ("Action: Operation\nSELECT 1", "'Action: Operation' without a ```sql block"),
    ("Action: Operation\n```sql\n\n```", "the ```sql block is empty"),
    ("Action: Answer\nFinal Answer: Paris", "the final answer 'Paris' is not a list like [\"A\", \"B\"]"),
    ("Action: Answer\nFinal Answer: [['a', 1]]",
     "the final answer's items must be plain strings or numbers, not lists or dicts"),
    ("Action: Answer\nParis", "'Action: Answer' without a 'Final Answer:' line"),
    ("Action: Answer\nFinal Answer: __import__('os').system('true')",
     "the final answer \"__import__('os').system('true')\" is not a list like [\"A\", \"B\"]"),
    ("Action: Operation\n```sql\nSELECT 1\n```\nAction: Answer\nFinal Answer: [1]",
     "2 'Action:' lines; write exactly one per turn"),
    ("Action: Guess\n", "unknown action 'Guess'; use 'Operation' or 'Answer'"),
])
def test_malformed_turns_are_invalid_with_a_reason(text, reason):
    action = parse_action(text)
    assert (action.kind, action.reason) == ("invalid", reason)


@pytest.mark.parametrize("text, parsed", [
    ("  Action:   Operation  \t\n```sql\nSELECT 1\n```", ("operation", "SELECT 1", None, None)),
    ("Action:\tAnswer\t\nFinal Answer: [1]", ("answer", None, [1], None)),
    ("Action: Operation\n```sqlite   \nSELECT 2```", ("operation", "SELECT 2", None, None)),
    ("Action: Operation\n```python\nx\n```\n```\nSELECT 3\n```", ("operation", "SELECT 3", None, None)),
    ("Action: Operation\n````sql\nSELECT 4\n````", ("operation", "`sql\nSELECT 4", None, None)),
    ("Action: Operation\n```sql SELECT 5```", ("operation", "SELECT 5", None, None)),
    ("Action: Operation\n```SQL\nSELECT 6\n``` and then ```", ("operation", "SELECT 6", None, None)),
    ("action: Operation\n```sql\nSELECT 7\n```",
     ("invalid", None, None, "no 'Action: Operation' or 'Action: Answer' line")),
    ("xAction: Operation\n```sql\nSELECT 8\n```",
     ("invalid", None, None, "no 'Action: Operation' or 'Action: Answer' line")),
    ("Action:Operation\n```mysql\nSELECT 9;\n```", ("operation", "SELECT 9;", None, None)),
    ("Action: Operation\n```c++\nint x;\n```\n```sql\n\tSELECT 10\n```", ("operation", "SELECT 10", None, None)),
    ("Action: Operation\n```sql\nSELECT 11", ("invalid", None, None, "'Action: Operation' without a ```sql block")),
    ("Action:   \n```sql\nSELECT 12\n```", ("invalid", None, None, "unknown action ''; use 'Operation' or 'Answer'")),
    ("Action: Operation Answer\n",
     ("invalid", None, None, "unknown action 'Operation Answer'; use 'Operation' or 'Answer'")),
])
def test_action_lines_and_fences_parse_as_they_always_have(text, parsed):
    action = parse_action(text)
    assert (action.kind, action.sql, action.answer, action.reason) == parsed


@pytest.mark.parametrize("text", [
    "Action: x" + " " * 200_000 + "y",  # the action line's pattern took 18.5 s at 100,000 spaces
    "Action: Operation\n```" + "a" * 200_000,  # a fence label without a closing fence
    "Action: Operation\n```sql" + " \t" * 100_000,
    "Action: Operation\n" + "```sql\n" * 30_000,
], ids=["action-line-spaces", "fence-label", "fence-blanks", "many-fences"])
def test_parsing_a_turn_takes_linear_time(text):
    start = time.monotonic()
    parse_action(text)
    assert time.monotonic() - start < 1


# --- episodes --------------------------------------------------------------------------------------------

def test_correct_answer_after_a_query_earns_reward_correct():
    env = SQLEnv(SQLEnvConfig(query_timeout_s=0.2))
    first = env.reset(question())
    assert first == "How many people live in Oslo?\nOne table."
    obs, reward, done, info = env.step(op(f"SELECT COUNT(*) FROM {T} WHERE \"home city\" = 'Oslo'"))
    assert (obs, reward, done, info["outcome"]) == ("[(2,)]", 0.0, False, None)
    count = ast.literal_eval(obs)[0][0]
    obs, reward, done, info = env.step(answer([count]))
    assert (reward, done) == (1.0, True)
    assert info == {"action": "answer", "rounds": 2, "invalid_actions": 0, "outcome": "correct", "skill": "count",
                    "episode_reward": 1.0}


def test_hostile_queries_and_invalid_turns_do_not_end_the_episode():
    env = SQLEnv(SQLEnvConfig(query_timeout_s=0.2, max_rows=5, invalid_action_penalty=0.05))
    env.reset(question())
    turns = [op("ATTACH 'x.db' AS x"), op(f"{ENDLESS} SELECT COUNT(*) FROM c"), op("PRAGMA user_version = 1"),
             op("SELECT 1; SELECT 2"), "no action at all", op("SELECT 1") + op("SELECT 2"),
             "Action: Answer\nFinal Answer: two"]
    rewards = []
    for turn in turns:
        obs, reward, done, info = env.step(turn)
        assert not done
        rewards.append(reward)
    assert rewards == [0.0] * 4 + [-0.05] * 3
    assert info["invalid_actions"] == 3 and info["rounds"] == 7
    obs, reward, done, info = env.step(answer(["2"]))
    assert (reward, done, info["outcome"]) == (1.0, True, "correct")
    assert info["episode_reward"] == pytest.approx(1.0 - 3 * 0.05)


def test_wrong_answer_earns_reward_wrong():
    env = SQLEnv()
    env.reset(question())
    obs, reward, done, info = env.step(answer(["3"]))
    assert (reward, done, info["outcome"]) == (-0.1, True, "wrong")


def test_round_limit_without_an_answer_is_a_timeout():
    env = SQLEnv(SQLEnvConfig(max_rounds=3))
    env.reset(question())
    results = [env.step(op("SELECT 1")) for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    obs, reward, done, info = results[-1]
    assert (reward, info["outcome"], info["rounds"]) == (-0.3, "timeout", 3)
    assert obs == "Round limit reached: 3 turns without a final answer."
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(answer(["2"]))


def test_answer_on_the_last_round_is_scored_not_timed_out():
    env = SQLEnv(SQLEnvConfig(max_rounds=2))
    env.reset(question())
    env.step("thinking, no action")
    obs, reward, done, info = env.step(answer(["2"]))
    assert (reward, done, info["outcome"]) == (1.0, True, "correct")


def test_modification_is_checked_by_the_final_table_not_the_answer():
    expected = table_md5([("Ana", "Oslo", 31), ("Ben", "Lima", 46), ("Chen", "Oslo", 28)])
    task = SQLTask(id="u", description="Ben turned 46.", add_description="", table=TABLE, skill="UPDATE",
                   label=(), answer_md5=expected)
    env = SQLEnv()
    env.reset(task)
    env.step(op(f"UPDATE {T} SET age = 46 WHERE name = 'Ben'"))
    assert env.step(answer(["anything"]))[1] == 1.0
    env.reset(task)  # a fresh table: the update above is gone
    obs, reward, done, info = env.step(answer([]))
    assert (reward, done, info["outcome"]) == (-0.1, True, "wrong")
    env.reset(task)
    assert env.step(op(f"DROP TABLE {T}"))[0].startswith("Error: not authorized")
    assert env.step(answer([]))[3]["outcome"] == "wrong"


# --- the table hash's 1024-byte cut (issue 45) ---------------------------------------------------------------

def long_delete_task() -> SQLTask:
    """A DELETE on 200 rows whose row hash sorts last: AgentBench's hash reads ~170 rows, never that one."""
    rows = tuple((f"person {i}", str(i)) for i in range(200))
    gone = max(rows, key=row_hash)
    table = Table(name="people", columns=(("name", "TEXT"), ("age", "TEXT")), rows=rows)
    sql = f"DELETE FROM people WHERE name = '{gone[0]}'"
    return SQLTask(id="d", description=f"Remove {gone[0]}.", add_description="", table=table, skill="delete",
                   label=(sql,), answer_md5=table_md5([r for r in rows if r != gone]), reference_sql=sql)


@pytest.mark.parametrize("strict, expected", [(False, "correct"), (True, "wrong")])
def test_doing_nothing_on_a_long_delete_task_is_correct_only_with_agentbenchs_hash(strict, expected):
    task = long_delete_task()
    assert table_md5(task.table.rows) == task.answer_md5  # the row to delete is past the hash's cut
    env = SQLEnv(SQLEnvConfig(strict_hash=strict, query_timeout_s=1.0), sandbox=InProcessSandbox)
    env.reset(task)
    assert env.step(answer([]))[3]["outcome"] == expected


@pytest.mark.parametrize("strict", [False, True])
def test_the_right_delete_on_a_long_table_is_correct_with_either_hash(strict):
    task = long_delete_task()
    env = SQLEnv(SQLEnvConfig(strict_hash=strict, query_timeout_s=1.0), sandbox=InProcessSandbox)
    env.reset(task)
    env.step(op(task.reference_sql))
    assert env.step(answer([]))[3]["outcome"] == "correct"


def test_the_whole_table_hash_reads_every_row():
    rows = list(long_delete_task().table.rows)
    last = sorted(rows, key=row_hash)[-1]
    kept = [r for r in rows if r != last]
    assert table_md5(rows) == table_md5(kept)  # AgentBench's: cut at 1024 bytes of row hashes
    assert table_md5(rows, max_bytes=None) != table_md5(kept, max_bytes=None)
    assert table_md5(rows[:10], max_bytes=None) == table_md5(rows[:10])  # a short table: the same hash
