"""A throwaway SQLite database for one episode, and safe execution of model-written SQL.

    with Sandbox(table, SandboxLimits(query_timeout_s=1.0)) as db:
        db.run("SELECT COUNT(*) FROM `people`")    # "[(12,)]"
        db.run("ATTACH '/etc/x' AS x")              # "Error: not authorized: ATTACH is disabled in this sandbox"

The database lives in memory (`:memory:`) and is discarded on `close()`. Model SQL is untrusted:
- an authorizer denies ATTACH and DETACH (VACUUM INTO goes through ATTACH, so it is denied too),
  every PRAGMA (reads included: the table's schema is in the task text and `sqlite_master`, and a
  blanket rule cannot be talked round), and any call of `load_extension`; extension loading is
  also switched off and at most 0 databases may be attached;
- a progress handler stops a statement that runs past `query_timeout_s` (fetching included);
- at most `max_rows` rows are fetched (`fetchmany`, so an endless recursive CTE stops there), no
  string or blob may exceed `max_value_bytes`, the database (temp tables included) may not grow
  past `max_db_bytes`, and the observation is cut at `max_chars`;
- one statement per call; errors come back as `Error: ...` text, never as exceptions.

Results are shown as AgentBench's DBBench shows MySQL results: Python's `str` of the row tuples,
`[('March 19, 1998',)]`, with `[TRUNCATED]` after a cut.
"""

from __future__ import annotations

import math
import sqlite3
import time
from dataclasses import dataclass

TRUNCATED = "[TRUNCATED]"
_PROGRESS_OPS = 1000  # SQLite VM instructions between two deadline checks
_DENIED_ACTIONS = {sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH", sqlite3.SQLITE_PRAGMA: "PRAGMA"}
_DENIED_FUNCTIONS = {"load_extension"}


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

    def __post_init__(self):
        for key in ("max_rows", "max_chars", "max_value_bytes", "max_db_bytes"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1 (got {getattr(self, key)})")
        if not self.query_timeout_s > 0:
            raise ValueError(f"query_timeout_s must be > 0 seconds (got {self.query_timeout_s})")


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


class Sandbox:
    """An in-memory SQLite database holding one table, open until `close()`."""

    def __init__(self, table: Table, limits: SandboxLimits = SandboxLimits()):
        self.table, self.limits = table, limits
        self._deadline = math.inf
        self._denied: str | None = None  # what the authorizer refused last, for the error text
        # Autocommit (no implicit BEGIN); usable from any one thread at a time, e.g. a rollout worker pool.
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            self._create(table)
            self._lock_down()
        except BaseException:
            self.conn.close()
            raise

    def _create(self, table: Table) -> None:
        if not table.columns:
            raise ValueError(f"table {table.name!r} has no columns")
        self.conn.execute("PRAGMA temp_store = MEMORY")  # sorts and temp tables never touch the disk
        pages = max(1, self.limits.max_db_bytes // self.conn.execute("PRAGMA page_size").fetchone()[0])
        self.conn.execute(f"PRAGMA main.max_page_count = {pages}")
        self.conn.execute(f"PRAGMA temp.max_page_count = {pages}")
        columns = ", ".join(f"{quote_identifier(n)} {t}" for n, t in table.columns)
        self.conn.execute(f"CREATE TABLE {quote_identifier(table.name)} ({columns})")
        marks = ", ".join("?" * len(table.columns))
        self.conn.executemany(f"INSERT INTO {quote_identifier(table.name)} VALUES ({marks})", table.rows)

    def _lock_down(self) -> None:
        if hasattr(self.conn, "enable_load_extension"):  # absent when Python was built without it
            self.conn.enable_load_extension(False)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.limits.max_value_bytes)
        self.conn.set_authorizer(self._authorize)
        self.conn.set_progress_handler(self._past_deadline, _PROGRESS_OPS)

    def _authorize(self, action: int, arg1, arg2, db_name, trigger) -> int:
        what = _DENIED_ACTIONS.get(action)
        if what is None and action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
            what = f"{arg2}()"
        if what is None:
            return sqlite3.SQLITE_OK
        self._denied = what
        return sqlite3.SQLITE_DENY

    def _past_deadline(self) -> int:
        return time.monotonic() > self._deadline  # nonzero stops the statement: "interrupted"

    def run(self, sql: str) -> str:
        """The observation for one model-written statement: its rows as text, or `Error: ...`."""
        self._denied = None
        self._deadline = time.monotonic() + self.limits.query_timeout_s
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchmany(self.limits.max_rows + 1) if cursor.description else []
        except Exception as e:  # the model's SQL may fail in any way; it must never end the episode
            return self._error_text(e)
        finally:
            self._deadline = math.inf
            cursor.close()
        return self._render(rows)

    def _error_text(self, e: Exception) -> str:
        message = str(e)
        if message == "interrupted":
            return f"Error: query timed out after {self.limits.query_timeout_s:g} s and was stopped"
        if self._denied and ("not authorized" in message or "authorization denied" in message):
            return f"Error: not authorized: {self._denied} is disabled in this sandbox"
        if "one statement at a time" in message:
            return "Error: only one SQL statement can run per turn"
        return _cut(f"Error: {message}", self.limits.max_chars)

    def _render(self, rows: list[tuple]) -> str:
        # Built row by row, so a huge result never becomes one huge string.
        limit, parts, size = self.limits.max_chars, [], 1
        for row in rows[: self.limits.max_rows]:
            parts.append(repr(row))
            size += len(parts[-1]) + 2
            if size > limit:
                break
        text = _cut("[" + ", ".join(parts) + "]", limit)
        if len(rows) > self.limits.max_rows and not text.endswith(TRUNCATED):
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
        """The task table's rows, its columns in their original order; None when the table cannot be
        read (dropped, a column renamed) or holds more than `max_rows` rows."""
        columns = ", ".join(quote_identifier(c) for c in self.table.column_names)
        self._deadline = time.monotonic() + self.limits.query_timeout_s
        try:
            cursor = self.conn.execute(f"SELECT {columns} FROM {quote_identifier(self.table.name)}")
            rows = cursor.fetchmany(max_rows + 1)
            cursor.close()
        except sqlite3.Error:
            return None
        finally:
            self._deadline = math.inf
        return rows if len(rows) <= max_rows else None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED
