"""A throwaway SQLite database for one episode, and safe execution of model-written SQL.

    with Sandbox(table, SandboxLimits(query_timeout_s=1.0)) as db:
        db.run("SELECT COUNT(*) FROM `people`")    # "[(12,)]"
        db.run("ATTACH '/etc/x' AS x")              # "Error: not authorized: ATTACH is disabled in this sandbox"

Model SQL is untrusted, so two layers hold it.

The database (`InProcessSandbox`) lives in memory (`:memory:`), or for a `Sandbox` worker in a file of
its own in a temporary folder, and is locked down before any model SQL reaches it:
- an authorizer allows only what DBBench tasks need and denies everything else: SELECT (WITH and
  WITH RECURSIVE included) and reading tables (the task's is the only one, beside `sqlite_master`);
  INSERT, UPDATE and DELETE of the task's table in the `main` schema; the functions in
  `ALLOWED_FUNCTIONS` (scalar, string, date, math, aggregate and window functions). Refused, among
  others: ATTACH, PRAGMA, CREATE / DROP / ALTER of anything (TEMP tables, views, triggers and
  virtual tables included), transactions, `printf`/`format` (one call with a huge width runs for
  seconds), `load_extension`, `fts3_tokenizer`, `randomblob`/`zeroblob`, `random`, the JSON
  functions and table-valued functions (`pragma_*`, `json_each`, `dbstat`);
- SQLite limits bound what one call can build: `max_value_bytes` per string or blob
  (SQLITE_LIMIT_LENGTH), `max_like_pattern` per LIKE/GLOB pattern, no attached databases, no sorter
  threads; each database may hold at most `max_db_bytes`; extension loading is off;
- a progress handler stops a statement that runs past `query_timeout_s` (fetching included);
- at most `max_rows` rows are fetched (`fetchmany`, so an endless recursive CTE stops there) and the
  observation is cut at `max_chars`; one statement per call; errors come back as `Error: ...` text.

`Sandbox` runs that database in a worker process of its own (this file, run as a script), so what
the first layer cannot bound stays out of the caller's process:
- memory: the worker's address space is capped at `max_memory_bytes` (RLIMIT_AS) and SQLite's heap
  at half of it, so sorting or DISTINCT over an endless query fails with "out of memory";
- time inside one C call (the progress handler runs only between VM instructions): a statement not
  answered `_KILL_GRACE_S` after its timeout has its worker killed;
- crashes: a worker that dies takes only its own process down.
After a kill or a crash the episode goes on: a fresh worker opens the dead one's database file, and
SQLite's rollback journal undoes the statement that was cut off (as after any crash of a program
using SQLite), so the table is exactly as it was before that statement, byte for byte (values made
by `strftime('now')` included), in the time one worker takes to start, however many statements
came before. The file is written with `synchronous = OFF`: safe against the process dying, which
is the only failure it is there for; it is removed when the sandbox closes.
`InProcessSandbox` alone (same rules, no process) serves trusted SQL: reference statements, labels.

Results are shown as AgentBench's DBBench shows MySQL results: Python's `str` of the row tuples,
`[('March 19, 1998',)]`, cut after `max_chars` characters with `[TRUNCATED]`, which also follows
whenever rows were left out.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

TRUNCATED = "[TRUNCATED]"
_PROGRESS_OPS = 1000  # SQLite VM instructions between two deadline checks
_KILL_GRACE_S = 1.0  # how long past query_timeout_s a worker may stay silent before it is killed
_START_TIMEOUT_S = 60.0  # a worker's start and table build (a loaded machine can be slow)

ALLOWED_FUNCTIONS = frozenset({
    # scalar and string
    "abs", "changes", "char", "coalesce", "concat", "concat_ws", "glob", "hex", "ifnull", "iif", "instr",
    "last_insert_rowid", "length", "like", "likelihood", "likely", "lower", "ltrim", "max", "min", "nullif",
    "octet_length", "quote", "replace", "round", "rtrim", "sign", "substr", "substring", "total_changes", "trim",
    "typeof", "unicode", "unlikely", "upper",
    # date and time
    "date", "datetime", "julianday", "strftime", "time", "timediff", "unixepoch",
    # math
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling", "cos", "cosh", "degrees", "exp",
    "floor", "ln", "log", "log10", "log2", "mod", "pi", "pow", "power", "radians", "sin", "sinh", "sqrt", "tan",
    "tanh", "trunc",
    # aggregate
    "avg", "count", "group_concat", "string_agg", "sum", "total",
    # window
    "cume_dist", "dense_rank", "first_value", "lag", "last_value", "lead", "nth_value", "ntile", "percent_rank",
    "rank", "row_number",
})
_SCHEMA_TABLES = ("sqlite_master", "sqlite_temp_master")
_DML = {sqlite3.SQLITE_INSERT: "INSERT", sqlite3.SQLITE_UPDATE: "UPDATE", sqlite3.SQLITE_DELETE: "DELETE"}
# Names for the error text of the authorizer actions that are always denied.
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ").replace("VTABLE", "VIRTUAL TABLE")
    for name in ("CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
                 "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DROP_INDEX", "DROP_TABLE",
                 "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
                 "DROP_VIEW", "PRAGMA", "TRANSACTION", "ATTACH", "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE",
                 "CREATE_VTABLE", "DROP_VTABLE", "SAVEPOINT")}


@dataclass(frozen=True)
class Table:
    """One table of a task: its name, its (column name, SQL type) pairs and its rows."""
    name: str
    columns: tuple[tuple[str, str], ...]
    rows: tuple[tuple, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)


@dataclass(frozen=True)
class SandboxLimits:
    max_rows: int = 100  # rows fetched per query; more are cut with a [TRUNCATED] note
    max_chars: int = 800  # observation characters (AgentBench cuts MySQL output at 800)
    query_timeout_s: float = 2.0  # wall-clock budget of one statement, fetching included
    max_value_bytes: int = 100_000  # SQLITE_LIMIT_LENGTH: the longest string or blob a query may build
    max_db_bytes: int = 32 * 2**20  # main and temp database size each (pages of 4 KiB); then "database or disk is full"
    max_like_pattern: int = 1000  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH: bytes of a LIKE or GLOB pattern
    max_memory_bytes: int = 256 * 2**20  # a Sandbox worker's address space; SQLite's heap gets half of it

    def __post_init__(self):
        for key in ("max_rows", "max_chars", "max_value_bytes", "max_db_bytes", "max_like_pattern"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1 (got {getattr(self, key)})")
        if not self.query_timeout_s > 0:
            raise ValueError(f"query_timeout_s must be > 0 seconds (got {self.query_timeout_s})")
        if self.max_memory_bytes < 2 * self.max_db_bytes + 64 * 2**20:
            raise ValueError(f"max_memory_bytes must hold the database twice over plus 64 MiB for the worker "
                             f"(at least {2 * self.max_db_bytes + 64 * 2**20}, got {self.max_memory_bytes})")


def quote_identifier(name: str) -> str:
    """`name` as an SQL identifier: "Bob's ""best"" table" (double quotes inside are doubled)."""
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value) -> str:
    """`value` as an SQL literal: NULL, 42, 1.5 or 'O''Brien'."""
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"cannot write {type(value).__name__} {value!r} as an SQL literal")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cannot write {value!r} as an SQL literal")
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


class InProcessSandbox:
    """The locked-down database holding one table, in this process, open until `close()`: in memory,
    or in the file `path` (a `Sandbox` worker's), which is built once and reopened as it is after.
    For trusted SQL; model SQL goes through `Sandbox`, which runs this class in a worker process."""

    def __init__(self, table: Table, limits: SandboxLimits = SandboxLimits(), path: str | None = None):
        if not table.columns:
            raise ValueError(f"table {table.name!r} has no columns")
        self.table, self.limits = table, limits
        self._deadline = math.inf
        self._denied: str | None = None  # what the authorizer refused last, for the error text
        # Autocommit (no implicit BEGIN); usable from any one thread at a time, e.g. a rollout worker pool.
        self.conn = sqlite3.connect(path or ":memory:", isolation_level=None, check_same_thread=False)
        try:
            self._configure()
            # Reading the schema first also rolls back a statement a killed worker left half done.
            if not self.conn.execute("SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                                     (table.name,)).fetchone():
                self._create(table)
            self._lock_down()
        except BaseException:
            self.conn.close()
            raise

    def _configure(self) -> None:
        """The connection's settings (they are not stored in a database file, so every open sets them)."""
        self.conn.execute("PRAGMA temp_store = MEMORY")  # sorts and temp data never touch the disk
        self.conn.execute("PRAGMA synchronous = OFF")  # a file only has to survive its worker's death
        pages = max(1, self.limits.max_db_bytes // self.conn.execute("PRAGMA page_size").fetchone()[0])
        self.conn.execute(f"PRAGMA main.max_page_count = {pages}")
        self.conn.execute(f"PRAGMA temp.max_page_count = {pages}")

    def _create(self, table: Table) -> None:
        columns = ", ".join(f"{quote_identifier(n)} {t}" for n, t in table.columns)
        marks = ", ".join("?" * len(table.columns))
        self.conn.execute("BEGIN")  # one transaction: a file is built whole or not at all
        self.conn.execute(f"CREATE TABLE {quote_identifier(table.name)} ({columns})")
        self.conn.executemany(f"INSERT INTO {quote_identifier(table.name)} VALUES ({marks})", table.rows)
        self.conn.execute("COMMIT")

    def _lock_down(self) -> None:
        if hasattr(self.conn, "enable_load_extension"):  # absent when Python was built without it
            self.conn.enable_load_extension(False)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.limits.max_value_bytes)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, self.limits.max_like_pattern)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0)
        self.conn.set_authorizer(self._authorize)
        self.conn.set_progress_handler(self._past_deadline, _PROGRESS_OPS)

    def _authorize(self, action: int, arg1, arg2, db_name, trigger) -> int:
        """SQLITE_OK for what the module docstring allows, SQLITE_DENY (remembering what) for the rest."""
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if str(arg2).lower() in ALLOWED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            what = f"{arg2}()"
        elif action in _DML:
            if arg1 == self.table.name and db_name == "main":
                return sqlite3.SQLITE_OK
            # CREATE, DROP and ALTER write the schema table before SQLite asks about the statement itself.
            what = "changing the schema" if arg1 in _SCHEMA_TABLES else f"{_DML[action]} on {arg1}"
        else:
            what = _ACTION_NAMES.get(action, f"SQLite action {action}")
        self._denied = what
        return sqlite3.SQLITE_DENY

    def _past_deadline(self) -> int:
        return time.monotonic() > self._deadline  # nonzero stops the statement: "interrupted"

    def run(self, sql: str) -> str:
        """The observation for one model-written statement: its rows as text, or `Error: ...`."""
        return self.execute(sql)[0]

    def execute(self, sql: str) -> tuple[str, bool]:
        """(the observation for `sql`, whether it ran without an error)."""
        self._denied = None
        self._deadline = time.monotonic() + self.limits.query_timeout_s
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchmany(self.limits.max_rows + 1) if cursor.description else []
        except Exception as e:  # the model's SQL may fail in any way; it must never end the episode
            return self._error_text(e), False
        finally:
            self._deadline = math.inf
            cursor.close()
        return self._render(rows), True

    def _error_text(self, e: Exception) -> str:
        message = str(e)
        if message == "interrupted":
            return f"Error: query timed out after {self.limits.query_timeout_s:g} s and was stopped"
        if self._denied:  # a denial always fails the statement, whatever SQLite's message says
            return f"Error: not authorized: {self._denied} is disabled in this sandbox"
        if "one statement at a time" in message:
            return "Error: only one SQL statement can run per turn"
        if isinstance(e, MemoryError) or message == "out of memory":
            return "Error: out of memory"
        return _cut(f"Error: {message}", self.limits.max_chars)

    def _render(self, rows: list[tuple]) -> str:
        """str(rows), as AgentBench prints a MySQL result: longer than max_chars, it is cut there and
        [TRUNCATED] follows; rows beyond max_rows (not fetched) also earn the marker."""
        limit, shown = self.limits.max_chars, rows[: self.limits.max_rows]
        parts, size = ["["], 1
        for i, row in enumerate(shown):  # built row by row, so a huge result never becomes one huge string
            parts.append((", " if i else "") + repr(row))
            size += len(parts[-1])
            if size > limit:
                break
        else:
            parts.append("]")
        text = _cut("".join(parts), limit)
        if len(rows) > len(shown) and not text.endswith(TRUNCATED):
            text += f" {TRUNCATED} (more than {self.limits.max_rows} rows)"
        return text

    def fetch_all(self, sql: str, params: tuple = ()) -> list[tuple]:
        """All rows of trusted SQL (a task's reference query), within the time limit; raises sqlite3.Error."""
        self._deadline = time.monotonic() + self.limits.query_timeout_s
        try:
            return self.conn.execute(sql, params).fetchall()
        finally:
            self._deadline = math.inf

    def table_rows(self, max_rows: int = 100_000) -> list[tuple] | None:
        """The task table's rows in the `main` schema, its columns in their original order; None when
        the table cannot be read or holds more than `max_rows` rows."""
        columns = ", ".join(quote_identifier(c) for c in self.table.column_names)
        self._deadline = time.monotonic() + self.limits.query_timeout_s
        try:
            cursor = self.conn.execute(f"SELECT {columns} FROM main.{quote_identifier(self.table.name)}")
            rows = cursor.fetchmany(max_rows + 1)
            cursor.close()
        except sqlite3.Error:
            return None
        finally:
            self._deadline = math.inf
        return rows if len(rows) <= max_rows else None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> InProcessSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Sandbox:
    """`InProcessSandbox` in a worker process of its own (see the module docstring), open until `close()`.
    Every method may be called from any one thread at a time."""

    def __init__(self, table: Table, limits: SandboxLimits = SandboxLimits()):
        if not table.columns:
            raise ValueError(f"table {table.name!r} has no columns")
        self.table, self.limits = table, limits
        self._folder = tempfile.mkdtemp(prefix="lmrl-sql-")  # the database file, which outlives a worker
        self._setup = json.dumps({"table": [table.name, table.columns, table.rows], "limits": asdict(limits),
                                  "path": os.path.join(self._folder, "db.sqlite")})
        self._lost = False  # a fresh worker could not open the database
        self._lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self._pending = b""  # bytes the worker wrote after its last reply line
        self._ready = self._closed = False
        try:
            self._start()
        except BaseException:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise

    def _start(self) -> None:
        """Start a worker and send it the table; its reply is read by the next request (`_wait_ready`),
        so many sandboxes start side by side."""
        # -I -S: the worker imports the standard library only (no site-packages, no PYTHONPATH).
        self.process = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._pending, self._ready = b"", False
        self.process.stdin.write(self._setup.encode() + b"\n")
        self.process.stdin.flush()

    def _wait_ready(self) -> None:
        if self._ready:
            return
        reply, why = self._reply(time.monotonic() + _START_TIMEOUT_S)
        if reply is None or "error" in reply:
            self._stop()
            detail = reply["error"] if reply else f"no answer in {_START_TIMEOUT_S:g} s" if why == "timeout" else why
            raise RuntimeError(f"the SQL sandbox worker could not build table {self.table.name!r}: {detail}")
        self._ready = True

    def run(self, sql: str) -> str:
        """The observation for one model-written statement: its rows as text, or `Error: ...`."""
        with self._lock:
            self._check_open()
            if self._lost:
                return "Error: the database was lost when its worker process failed; no query can run"
            self._wait_ready()
            reply, why = self._request(json.dumps({"sql": sql}), self._deadline())
            if reply is None:
                self._recover()
                if why == "timeout":
                    return f"Error: query timed out after {self.limits.query_timeout_s:g} s and was stopped"
                return f"Error: the query crashed the database process ({why}); the table is as it was before it"
            return reply["text"]

    def table_rows(self, max_rows: int = 100_000) -> list[tuple] | None:
        """The task table's rows in the `main` schema (see `InProcessSandbox.table_rows`); None also
        when the worker fails to answer."""
        with self._lock:
            self._check_open()
            if self._lost:
                return None
            self._wait_ready()
            reply, _ = self._request(json.dumps({"rows": max_rows}), self._deadline())
            if reply is None:
                self._recover()
                return None
            if reply["rows"] is None:
                return None
            return [tuple(bytes.fromhex(v["blob"]) if isinstance(v, dict) else v for v in row) for row in reply["rows"]]

    def _deadline(self) -> float:
        return time.monotonic() + self.limits.query_timeout_s + _KILL_GRACE_S

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Sandbox is closed; make a new one")

    def _request(self, line: str, deadline: float) -> tuple[dict | None, str]:
        """Send one request line; the reply as `_reply` reads it."""
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
        except OSError:  # a broken pipe: the worker is gone; _reply reads what it left and reaps it
            pass
        return self._reply(deadline)

    def _reply(self, deadline: float) -> tuple[dict | None, str]:
        """(the worker's next reply, ""), or (None, why) once the worker is gone: "timeout" when it
        had not answered by `deadline` and was killed, "signal 11" or "exit status 1" when it died."""
        chunks = [self._pending]
        readable = select.poll()  # not select.select: a trainer may hold more than 1024 open files
        readable.register(self.process.stdout, select.POLLIN)
        while b"\n" not in chunks[-1]:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not readable.poll(math.ceil(remaining * 1000)):
                self._stop()
                return None, "timeout"
            chunks.append(os.read(self.process.stdout.fileno(), 1 << 20))
            if not chunks[-1]:  # end of file: the worker died
                code = self._stop()
                return None, f"signal {-code}" if code < 0 else f"exit status {code}"
        reply, self._pending = b"".join(chunks).split(b"\n", 1)
        return json.loads(reply), ""

    def _recover(self) -> None:
        """A fresh worker on the database file, which SQLite brings back to its state before the failed
        statement (the module docstring); `_lost` if that fails."""
        try:
            self._start()
            self._wait_ready()
        except (OSError, RuntimeError):
            self._lost = True

    def _stop(self) -> int:
        """Kill the worker (if still running) and reap it; returns its exit code."""
        process, self.process = self.process, None
        if process is None:
            return 0
        process.kill()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        return process.wait()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop()
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "process", None) is not None:
                self._stop()
            if getattr(self, "_folder", None) is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
        except Exception:  # at interpreter exit the modules it needs may be gone; the worker ends on EOF
            pass


def _serve() -> None:
    """The worker's loop: a setup line, then one JSON request a line, one JSON reply a line."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which closes the pipe
    setup = json.loads(sys.stdin.readline())
    limits = SandboxLimits(**setup["limits"])
    name, columns, rows = setup["table"]
    resource.setrlimit(resource.RLIMIT_AS, (limits.max_memory_bytes, limits.max_memory_bytes))
    sqlite3.connect(":memory:").execute(f"PRAGMA hard_heap_limit = {limits.max_memory_bytes // 2}")  # process-wide
    try:
        db = InProcessSandbox(Table(name, tuple(map(tuple, columns)), tuple(map(tuple, rows))), limits,
                              path=setup["path"])
    except Exception as e:
        _reply({"error": f"{type(e).__name__}: {e}"})
        return
    _reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        if "sql" in request:
            text, ok = db.execute(request["sql"])
            _reply({"text": text, "ok": ok})
        else:
            table = db.table_rows(request["rows"])
            _reply({"rows": None if table is None else
                    [[{"blob": v.hex()} if isinstance(v, bytes) else v for v in row] for row in table]})


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED


if __name__ == "__main__":
    _serve()
