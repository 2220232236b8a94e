"""JSONL data files: one JSON object per line, in the formats TRL users already have.

    rows = read_jsonl("train.jsonl", ["ground_truth"], alternatives=[["prompt"], ["messages"]])
    write_jsonl("train.jsonl", rows)

Every problem is reported as `path:line: what is wrong`, so a bad row in a large file is found at
once. Known keys are type-checked wherever they appear: `prompt`, `completion`, `chosen`,
`rejected` and `ground_truth` are strings; `messages` is a list of {"role", "content"} dicts.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

_STRING_KEYS = ("prompt", "completion", "chosen", "rejected", "ground_truth")


class DataError(ValueError):
    """A data file that cannot be used, explained as `path:line: what is wrong`."""


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = (), *,
               alternatives: Sequence[Sequence[str]] = (), check: Callable[[dict], str | None] | None = None
               ) -> list[dict]:
    """The rows of a JSONL file; blank lines are skipped.

    A row must hold every key in `required` and, when `alternatives` is given, every key of at
    least one of its sets: alternatives=[["prompt"], ["messages"]] means "prompt or messages".
    `check(row)` says what else is wrong with a row (None: nothing), reported as `path:line: ...`."""
    rows = []
    for where, row in iter_jsonl(path):
        problem = _missing(row, required, alternatives) or _wrong_type(row) or (check(row) if check else None)
        if problem:
            raise DataError(f"{where}: {problem}")
        rows.append(row)
    return rows


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """(`path:line`, row) for each row of a JSONL file, plain or gzip-compressed (found by gzip's magic
    bytes); blank lines skipped. A file that cannot be read, a line that is not UTF-8 or not a JSON
    object, and a file with no rows are DataErrors naming the file and line; a missing file stays a
    FileNotFoundError, whose message names it."""
    count = 0
    for lineno, raw in enumerate(_read_lines(path), 1):
        where = f"{path}:{lineno}"
        try:
            # utf-8-sig on the first line: a byte-order mark some editors write is not part of the row
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start} of the line)") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        except RecursionError:
            raise DataError(f"{where}: invalid JSON: nested too deeply to read") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object {{...}}, got a {_json_type(row)}")
        count += 1
        yield where, row
    if not count:
        raise DataError(f"{path}: the file has no rows (it is empty)")


def _read_lines(path: str | os.PathLike) -> list[bytes]:
    """The file's lines as bytes (see `read_bytes`)."""
    return read_bytes(path).splitlines(keepends=True)


def read_bytes(path: str | os.PathLike) -> bytes:
    """A data file's bytes, a gzip file (told by gzip's magic bytes) decompressed whole first, so a
    truncated one fails before any of its rows is used. An unreadable path (a directory, no
    permission) or a damaged gzip file is a DataError; a missing file stays a FileNotFoundError,
    whose message names it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise DataError(f"{path}: cannot read the data file: {e.strerror or e}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise DataError(f"{path}: the gzip file is truncated (it ends before gzip's end-of-stream marker); "
                            f"copy or download it again") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"{path}: the gzip file is corrupt ({e}); copy or download it again") from None
    return data


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Write `rows` one JSON object a line, atomically: readers see the old file or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                if not isinstance(row, dict):
                    raise TypeError(f"row {i} is a {type(row).__name__}; each row must be a dict")
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _missing(row: dict, required: Sequence[str], alternatives: Sequence[Sequence[str]]) -> str | None:
    has = f"(the row has keys: {', '.join(map(repr, row)) or 'none'})"
    missing = [k for k in required if k not in row]
    if missing:
        return f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} {has}"
    if alternatives and not any(all(k in row for k in keys) for keys in alternatives):
        options = " | ".join(" + ".join(map(repr, keys)) for keys in alternatives)
        return f"needs one of {options} {has}"
    return None


def _wrong_type(row: dict) -> str | None:
    for key in _STRING_KEYS:
        if key in row and not isinstance(row[key], str):
            hint = f' (write it as "{row[key]}")' if type(row[key]) in (int, float) else ""
            return f"{key!r} must be a string, got a {_json_type(row[key])}{hint}"
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            got = "an empty list" if messages == [] else f"a {_json_type(messages)}"
            return f"'messages' must be a non-empty list of {{role, content}} objects, got {got}"
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                return f"'messages'[{i}] must be an object with string 'role' and 'content', got {json.dumps(m)[:80]}"
    return None


def _json_type(value) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
