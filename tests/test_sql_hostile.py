"""Hostile model output against the SQL agent (issue 28): each case as the hostile pass found it,
played through `SQLEnv.step` as the trainer plays it, with bounds on wall-clock time and memory.
Cases that once crashed or bloated the process run in a subprocess, so a regression fails the
test instead of taking pytest down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmrl.tasks.sql import (InProcessSandbox, Sandbox, SandboxLimits, SQLEnv, SQLEnvConfig, SQLTask, Table,
                            answers_match, parse_action, table_md5)

REPO = Path(__file__).resolve().parents[1]
TABLE = Table(name="staff", columns=(("name", "TEXT"), ("age", "INTEGER")),
              rows=(("Ana", 31), ("Ben", 45), ("Chen", 28)))
# 64 KiB rows without end: doubling builds one wide value, the second CTE repeats it forever.
WIDE_ENDLESS = ("WITH RECURSIVE w(n, y) AS (SELECT 0, 'x' UNION ALL SELECT n + 1, y || y FROM w WHERE n < 16), "
                "c(x, y) AS (SELECT 1, (SELECT y FROM w WHERE n = 16) UNION ALL SELECT x + 1, y FROM c)")
REFUSED = "Error: not authorized: {} is disabled in this sandbox"


def op(sql: str, newline: str = "\n", label: str = "sql") -> str:
    return f"I will run it.{newline}Action: Operation{newline}```{label}{newline}{sql}{newline}```"


def answer(items: list) -> str:
    return f"Done.\nAction: Answer\nFinal Answer: {json.dumps(items)}"


def question(label: tuple = ("2",)) -> SQLTask:
    return SQLTask(id="q", description="How many are over 30?", add_description="", table=TABLE, skill="counting",
                   label=label)


def update_task() -> SQLTask:
    expected = table_md5([("Ana", 31), ("Ben", 46), ("Chen", 28)])
    return SQLTask(id="u", description="Ben turned 46.", add_description="", table=TABLE, skill="UPDATE",
                   label=("UPDATE staff SET age = 46 WHERE name = 'Ben'",), answer_md5=expected)


def play(task: SQLTask, *turns: str, config: SQLEnvConfig | None = None) -> list[tuple]:
    """Every step's (observation, reward, done, info) of one episode."""
    env = SQLEnv(config or SQLEnvConfig(query_timeout_s=1.0))
    env.reset(task)
    try:
        return [env.step(turn) for turn in turns]
    finally:
        env.close()


def run_script(code: str, timeout: float = 120) -> dict:
    """Run `code` in a fresh Python; its last stdout line is JSON. A crash (e.g. SIGSEGV) fails here."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- 1. fts3_tokenizer: an address leak and a segfault -----------------------------------------------------

FTS3_SCRIPT = """
import json
from lmrl.tasks.sql import InProcessSandbox, SQLEnv, SQLEnvConfig, SQLTask, Table
table = Table("docs", (("body", "TEXT"),), (("hello world",),))
turns = ["SELECT fts3_tokenizer('simple')", "SELECT fts3_tokenizer('evil', x'4141414141414141')",
         "CREATE VIRTUAL TABLE t USING fts3(x, tokenize=evil)", "INSERT INTO t VALUES ('boom')",
         "SELECT COUNT(*) FROM docs"]
env = SQLEnv(SQLEnvConfig(query_timeout_s=1.0))
env.reset(SQLTask(id="h", description="?", add_description="", table=table, skill="other", label=("1",)))
played = [env.step("Action: Operation\\n```sql\\n" + sql + "\\n```")[0] for sql in turns]
with InProcessSandbox(table) as db:  # the same rules in this very process, where a crash would end it
    local = [db.run(sql) for sql in turns]
print(json.dumps({"env": played, "local": local}))
"""


def test_fts3_tokenizer_is_refused_so_no_address_leaks_and_nothing_crashes():
    out = run_script(FTS3_SCRIPT)
    expected = [REFUSED.format("fts3_tokenizer()"), REFUSED.format("fts3_tokenizer()"),
                REFUSED.format("changing the schema"), "Error: no such table: t", "[(1,)]"]
    assert out == {"env": expected, "local": expected}


# --- 2. printf's width runs for seconds inside one call ----------------------------------------------------

@pytest.mark.parametrize("sql, what", [
    ("SELECT printf('%.*c', 2147483647, 'x')", "printf()"),
    ("SELECT printf('%.*c', 2147483647, 'x') || printf('%.*c', 2147483647, 'y')", "printf()"),
    ("SELECT format('%2147483647d', 1)", "format()"),
    ("SELECT length(zeroblob(1000000000))", "zeroblob()"),
    ("SELECT hex(randomblob(1000000000))", "randomblob()"),
])
def test_functions_that_build_huge_values_are_refused_at_once(sql, what):
    start = time.monotonic()
    (obs, reward, done, _), = play(question(), op(sql))
    assert (obs, reward, done) == (REFUSED.format(what), 0.0, False)
    assert time.monotonic() - start < 5  # a worker's start and one refusal; the printf call alone took 13.8 s


def test_a_value_grown_past_max_value_bytes_fails_fast():
    start = time.monotonic()
    (obs, *_), = play(question(), op("WITH RECURSIVE s(v) AS (SELECT 'x' UNION ALL SELECT v || v FROM s) "
                                     "SELECT length(v) FROM s"))
    assert obs == "Error: string or blob too big"
    assert time.monotonic() - start < 5


# --- 3. sorting and temporary data of an endless query -----------------------------------------------------

MEMORY_SCRIPT = """
import json, resource, sys, time
from lmrl.tasks.sql import SQLEnv, SQLEnvConfig, SQLTask, Table
table = Table("t", (("a", "TEXT"),), (("x",),))
task = SQLTask(id="m", description="?", add_description="", table=table, skill="other", label=("1",))
queries = sys.argv[1:]
env = SQLEnv(SQLEnvConfig())
env.reset(task)
env.step("Action: Operation\\n```sql\\nSELECT 1\\n```")
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results = []
for sql in queries:
    start = time.monotonic()
    obs = env.step("Action: Operation\\n```sql\\n" + sql + "\\n```")[0]
    results.append([obs, time.monotonic() - start])
env.close()
print(json.dumps({"results": results, "baseline_kib": baseline,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "worker_peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def test_sorting_distinct_and_union_over_an_endless_query_stay_within_the_memory_cap():
    queries = [f"{WIDE_ENDLESS} SELECT x FROM c ORDER BY y, x DESC",
               f"{WIDE_ENDLESS} SELECT COUNT(DISTINCT y || x) FROM c",
               f"{WIDE_ENDLESS} SELECT y || x FROM c UNION SELECT y FROM c"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, *queries], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for obs, seconds in out["results"]:
        assert obs == "Error: out of memory"
        assert seconds < 10  # the query timeout is 2 s; these fail sooner, at the memory cap
    # The episode's process holds none of it (it reached 1.28 GB); the worker stays under its cap.
    assert out["peak_kib"] - out["baseline_kib"] < 32 * 1024
    assert out["worker_peak_kib"] <= SandboxLimits().max_memory_bytes // 1024


# --- 4. a TEMP table shadowing the task's table --------------------------------------------------------------

def test_a_temp_table_cannot_shadow_the_task_table_on_a_modification_task():
    steps = play(update_task(),
                 op("CREATE TEMP TABLE staff AS SELECT * FROM main.staff"),
                 op("UPDATE temp.staff SET age = 46 WHERE name = 'Ben'"),
                 answer([]))
    assert [s[0] for s in steps[:2]] == [REFUSED.format("changing the schema"),
                                         "Error: no such table: temp.staff"]
    assert steps[-1][3]["outcome"] == "wrong"
    fixed = play(update_task(), op("UPDATE staff SET age = 46 WHERE name = 'Ben'"), answer([]))
    assert fixed[-1][3]["outcome"] == "correct"


def test_the_table_check_reads_the_main_schema_even_beside_a_temp_table():
    with InProcessSandbox(TABLE) as db:
        db.conn.set_authorizer(None)  # a shadow made behind the sandbox's back
        db.conn.execute("CREATE TEMP TABLE staff (name TEXT, age INTEGER)")
        db.conn.execute("INSERT INTO temp.staff VALUES ('Eve', 99)")
        assert db.conn.execute("SELECT name FROM staff").fetchall() == [("Eve",)]  # unqualified: the shadow
        assert db.table_rows() == list(TABLE.rows)


# --- 5. answers that only look equal -------------------------------------------------------------------------

@pytest.mark.parametrize("given, label, expected", [
    (["٧"], ["7"], False),  # Arabic-Indic seven: float() reads it as 7
    (["7"], ["٧"], False),
    (["07"], ["7"], False),  # a leading zero makes it text
    (["007"], ["007"], True),
    ([7], ["007"], False),
    ([2**53 + 1], [str(2**53)], False),  # equal as floats
    ([str(2**64 + 1)], [str(2**64)], False),
    ([2**64], [str(2**64)], True),
    (["1_000"], ["1000"], False),  # float() accepts underscores
    ([1], ["1.0"], True),
    (["21000"], ["21000.0"], True),
    ([0.1], ["0.1"], True),
])
def test_numbers_are_ascii_exact_decimals(given, label, expected):
    assert answers_match(given, label) is expected


def test_a_big_integer_one_off_in_the_last_digit_is_wrong_in_an_episode():
    label = (str(2**53),)
    assert play(question(label), answer([2**53 + 1]))[-1][3]["outcome"] == "wrong"
    assert play(question(label), answer([2**53]))[-1][3]["outcome"] == "correct"
    assert play(question(("7",)), answer(["٧"]))[-1][3]["outcome"] == "wrong"
    assert play(question(("7",)), answer(["07"]))[-1][3]["outcome"] == "wrong"


# --- 6. line endings and fence labels ------------------------------------------------------------------------

@pytest.mark.parametrize("turn", [
    op("SELECT COUNT(*) FROM staff WHERE age > 30", newline="\r\n"),
    op("SELECT COUNT(*) FROM staff WHERE age > 30", newline="\r"),
    op("SELECT COUNT(*) FROM staff WHERE age > 30", label="sqlite"),
    op("SELECT COUNT(*) FROM staff WHERE age > 30", label="SQL"),
    op("SELECT COUNT(*) FROM staff WHERE age > 30", label=""),
    "Let me look.\n```python\nprint('not sql')\n```\n" + op("SELECT COUNT(*) FROM staff WHERE age > 30"),
])
def test_crlf_turns_and_common_fence_labels_run_the_whole_statement(turn):
    assert parse_action(turn).sql == "SELECT COUNT(*) FROM staff WHERE age > 30"
    obs, reward, done, info = play(question(), turn)[0]
    assert (obs, info["action"]) == ("[(2,)]", "operation")


def test_a_crlf_answer_turn_is_scored():
    steps = play(question(), "Done.\r\nAction: Answer\r\nFinal Answer: [\"2\"]\r\n")
    assert steps[-1][3]["outcome"] == "correct"


# --- 7. the 800-character cut ----------------------------------------------------------------------------------

def test_a_result_cut_at_exactly_800_characters_keeps_the_marker():
    # Ten rows of ('<73 letters>',) print as exactly 800 characters; two more follow.
    rows = tuple((f"{i:02d}" + "x" * 71,) for i in range(12))
    table = Table(name="t", columns=(("v", "TEXT"),), rows=rows)
    task = SQLTask(id="c", description="?", add_description="", table=table, skill="other", label=("x",))
    assert len(str(list(rows[:10]))) == 800
    obs = play(task, op("SELECT v FROM t"), config=SQLEnvConfig())[0][0]
    assert obs == str(list(rows))[:800] + "[TRUNCATED]"  # AgentBench: cut at 800, marker appended
    whole = play(task, op("SELECT v FROM t LIMIT 10"), config=SQLEnvConfig())[0][0]
    assert whole == str(list(rows[:10]))  # exactly 800 and nothing left out: no marker


# --- the worker process: a stuck C call, a crash -------------------------------------------------------------

# One LIKE call over ~98,000 characters with a ~49,000-character pattern: billions of comparisons.
LONG_LIKE = ("WITH RECURSIVE s(n, a) AS (SELECT 0, 'a' UNION ALL SELECT n + 1, a || a FROM s WHERE n < 15) "
             "SELECT (a || a || a) LIKE '%' || substr(a || a, 1, 49000) || 'b' FROM s WHERE n = 15")


def test_a_statement_stuck_inside_one_call_is_killed_and_the_table_survives():
    limits = SandboxLimits(query_timeout_s=0.2, max_like_pattern=50_000)  # lets one LIKE call run for seconds
    with Sandbox(TABLE, limits) as db:
        assert db.run("UPDATE staff SET age = 46 WHERE name = 'Ben'") == "[]"
        start = time.monotonic()
        assert db.run(LONG_LIKE) == "Error: query timed out after 0.2 s and was stopped"
        assert time.monotonic() - start < 5  # the progress handler cannot stop it; the kill does
        assert db.run("SELECT age FROM staff WHERE name = 'Ben'") == "[(46,)]"  # replayed in a fresh worker


def test_the_default_like_pattern_limit_stops_that_call_at_once():
    with Sandbox(TABLE, SandboxLimits(query_timeout_s=0.2)) as db:
        assert db.run(LONG_LIKE) == "Error: LIKE or GLOB pattern too complex"


def test_a_crashed_worker_ends_neither_the_caller_nor_the_episode():
    env = SQLEnv(SQLEnvConfig(query_timeout_s=1.0))
    env.reset(update_task())
    env.step(op("UPDATE staff SET age = 46 WHERE name = 'Ben'"))
    os.kill(env._db.process.pid, signal.SIGSEGV)
    obs, reward, done, _ = env.step(op("SELECT COUNT(*) FROM staff"))
    assert obs == "Error: the query crashed the database process (signal 11); the table is as it was before it"
    assert not done
    assert env.step(op("SELECT age FROM staff WHERE name = 'Ben'"))[0] == "[(46,)]"
    assert env.step(answer([]))[3]["outcome"] == "correct"


def test_a_worker_that_never_answers_is_killed_at_the_deadline():
    with Sandbox(TABLE, SandboxLimits(query_timeout_s=0.2)) as db:
        db.run("SELECT 1")
        os.kill(db.process.pid, signal.SIGSTOP)
        start = time.monotonic()
        assert db.run("SELECT 1") == "Error: query timed out after 0.2 s and was stopped"
        assert time.monotonic() - start < 5
        assert db.run("SELECT COUNT(*) FROM staff") == "[(3,)]"


# --- issue 45: answers and worker recovery --------------------------------------------------------------------

def test_an_answer_past_pythons_int_to_str_digit_limit_is_judged_wrong_without_raising():
    turn = "Action: Answer\nFinal Answer: [0x" + "f" * 3700 + "]"
    assert answers_match(parse_action(turn).answer, ["2"]) is False
    obs, reward, done, info = play(question(), turn)[-1]
    assert (info["outcome"], done) == ("wrong", True)
    big = int("f" * 3700, 16)
    assert answers_match([big], [big]) is True  # still compared exactly, not refused


def test_an_sql_env_step_that_raises_is_one_env_error_for_the_rollout(monkeypatch):
    from lmrl.envs import EnvError
    from lmrl.generation.agent import Stepper

    def broken(*args):
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    monkeypatch.setattr("lmrl.tasks.sql.env.answers_match", broken)
    env = SQLEnv(SQLEnvConfig(query_timeout_s=1.0))
    env.reset(question())
    (result,) = Stepper(1, 30.0).map([(env, "step", (answer(["2"]),))])
    env.close()
    assert isinstance(result, EnvError)
    assert "step() raised ValueError: Exceeds the limit (4300 digits)" in str(result)


NOW_INSERT = "INSERT INTO staff VALUES (strftime('%Y-%m-%d %H:%M:%f', 'now'), 1)"  # milliseconds: a replay differs
SLOW_INSERT = ("INSERT INTO staff SELECT 'slow', (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
               "WHERE x < 200000) SELECT COUNT(*) FROM c)")


def test_a_killed_worker_comes_back_with_the_exact_rows_even_after_strftime_now():
    with Sandbox(TABLE, SandboxLimits(query_timeout_s=1.0)) as db:
        assert db.run(NOW_INSERT) == "[]"
        before = db.table_rows()
        time.sleep(0.05)
        os.kill(db.process.pid, signal.SIGKILL)
        assert db.run("SELECT 1").startswith("Error: the query crashed the database process")
        assert db.table_rows() == before


def test_recovery_runs_no_earlier_statement_so_its_time_does_not_grow_with_them(monkeypatch):
    with Sandbox(TABLE, SandboxLimits(query_timeout_s=2.0)) as db:
        for _ in range(12):
            assert db.run(SLOW_INSERT) == "[]"
        before = db.table_rows()
        sent = []
        request = Sandbox._request
        monkeypatch.setattr(Sandbox, "_request", lambda self, line, deadline: sent.append(line) or
                            request(self, line, deadline))
        os.kill(db.process.pid, signal.SIGKILL)
        start = time.monotonic()
        db.run("SELECT 1")
        recovery = time.monotonic() - start
        assert sent == ['{"sql": "SELECT 1"}']  # the failed statement only: nothing replayed
        assert recovery < 2  # 12 replayed statements of ~0.1 s each took longer
        assert db.table_rows() == before
