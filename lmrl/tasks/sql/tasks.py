"""SQL agent tasks, and the loader for AgentBench DBBench files.

    tasks = load_dbbench("dev.jsonl")           # 60 SQLTasks
    by_skill = group_by_skill(tasks)            # {"INSERT": [...], "counting": [...], ...}

A DBBench record (one JSON object a line) holds `description`, `add_description`, `type` (a
one-item list: "counting", "INSERT", ...), `label` (the answer list; the reference SQL for
INSERT/UPDATE/DELETE), `answer_md5` (INSERT/UPDATE/DELETE only: the table's hash after the
correct change, "[('<md5>',)]") and `table` = {table_name, table_info: {columns: [{name, type}],
rows}}. A modification's label SQL becomes `reference_sql` (in dev.jsonl all 40 reproduce their
answer_md5); a question's `sql.query` is dropped (most do not reproduce the label).

Every column is created as TEXT, as AgentBench creates them in MySQL: a TEXT column keeps "7.400"
as written, so the hash of the changed table matches `answer_md5`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ...common.data import DataError
from .checking import is_modification, parse_answer_md5
from .sandbox import Table


@dataclass(frozen=True)
class SQLTask:
    """One episode's task: a table to work on and what counts as success."""
    id: str
    description: str  # the question, or the change to make
    add_description: str  # the table's name and headers, in words
    table: Table
    skill: str  # DBBench's type ("counting", "INSERT", ...) or a procedural skill ("filter", ...)
    label: tuple[str, ...]  # the answer; for a modification, the reference SQL (as DBBench stores it)
    answer_md5: str | None = None  # a modification's expected table hash (checking.table_md5); None for questions
    reference_sql: str | None = None  # one statement that solves the task, when known

    @property
    def is_modification(self) -> bool:
        return self.answer_md5 is not None


def load_dbbench(path: str | os.PathLike) -> list[SQLTask]:
    """The tasks of a DBBench JSONL file; a bad record raises DataError naming `path:line` and the field."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
            tasks.append(_task(record, where, f"{Path(path).stem}-{lineno}"))
    if not tasks:
        raise DataError(f"{path}: the file has no records (it is empty)")
    return tasks


def group_by_skill(tasks: list[SQLTask]) -> dict[str, list[SQLTask]]:
    """The tasks of each skill (DBBench type), in file order."""
    groups: dict[str, list[SQLTask]] = {}
    for task in tasks:
        groups.setdefault(task.skill, []).append(task)
    return groups


def _task(record, where: str, task_id: str) -> SQLTask:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object {{...}}, got {type(record).__name__}")
    description = _field(record, "description", str, where)
    types = _field(record, "type", list, where)
    if not types or not isinstance(types[0], str):
        raise DataError(f"{where}: field 'type' must be a list holding one type name, like [\"counting\"] "
                        f"(got {types!r})")
    skill = types[0]
    label = _field(record, "label", list, where)
    table = _table(_field(record, "table", dict, where), where)
    add_description = record.get("add_description", "")
    if not isinstance(add_description, str):
        raise DataError(f"{where}: field 'add_description' must be a string (got {type(add_description).__name__})")
    answer_md5, reference_sql = None, None
    if is_modification(skill):
        stored_md5 = _field(record, "answer_md5", str, where)
        try:
            answer_md5 = parse_answer_md5(stored_md5)
        except ValueError as e:
            raise DataError(f"{where}: field 'answer_md5': {e}") from None
        reference_sql = label[0] if label and isinstance(label[0], str) else None
    # A question's `sql.query` is not kept: in dev.jsonl only 3 of 20 reproduce their label in SQLite.
    return SQLTask(id=task_id, description=description, add_description=add_description, table=table,
                   skill=skill, label=tuple(str(v) for v in label), answer_md5=answer_md5,
                   reference_sql=reference_sql)


def _table(table: dict, where: str) -> Table:
    name = _field(table, "table_name", str, where, "table.")
    info = _field(table, "table_info", dict, where, "table.")
    columns = _field(info, "columns", list, where, "table.table_info.")
    rows = _field(info, "rows", list, where, "table.table_info.")
    names = []
    for i, column in enumerate(columns):
        if not isinstance(column, dict) or not isinstance(column.get("name"), str):
            raise DataError(f"{where}: field 'table.table_info.columns[{i}]' must be {{\"name\": ..., "
                            f"\"type\": ...}} (got {column!r})")
        names.append(column["name"])
    if not names:
        raise DataError(f"{where}: field 'table.table_info.columns' is empty; a table needs a column")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(names):
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise DataError(f"{where}: field 'table.table_info.rows[{i}]' has {got}; the table has "
                            f"{len(names)} columns")
        bad = [v for v in row if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float)))]
        if bad:
            raise DataError(f"{where}: field 'table.table_info.rows[{i}]' holds {bad[0]!r}; values must be "
                            f"strings, numbers or null")
    return Table(name=name, columns=tuple((n, "TEXT") for n in names), rows=tuple(tuple(r) for r in rows))


def _field(record: dict, key: str, kind: type, where: str, prefix: str = ""):
    if key not in record:
        raise DataError(f"{where}: missing field '{prefix}{key}' (the record has: {', '.join(map(repr, record))})")
    value = record[key]
    if not isinstance(value, kind):
        raise DataError(f"{where}: field '{prefix}{key}' must be a {kind.__name__} (got {type(value).__name__})")
    return value
