"""Data files: JSONL (one JSON object per line, in the formats TRL users already have) or parquet
(verl's format), and the one rule that turns a prompt row into the form the text tasks read.

    rows = read_jsonl("train.jsonl", ["ground_truth"], alternatives=[["prompt"], ["messages"]])
    rows = read_jsonl("train.parquet", shape=prompt_row)       # verl's rows: prompt messages, reward_model
    write_jsonl("train.jsonl", rows)

Every problem is reported as `path:line: what is wrong` (`path:row N` for parquet), so a bad row in a
large file is found at once. Known keys are type-checked wherever they appear: `prompt`,
`completion`, `chosen`, `rejected` and `ground_truth` are strings; `messages` is a list of
{"role", "content"} dicts.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

_STRING_KEYS = ("prompt", "completion", "chosen", "rejected", "ground_truth")
PROMPT_KEY, LABEL_KEY = "prompt", "ground_truth"  # where a prompt row holds its prompt and its ground truth
SOURCE_KEY = "data_source"  # the column naming the data set a row came from (verl's name, fixed as verl fixes it)
PARQUET_MAGIC = b"PAR1"  # the first (and last) four bytes of every parquet file


class DataError(ValueError):
    """A data file that cannot be used, explained as `path:line: what is wrong`."""


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = (), *,
               alternatives: Sequence[Sequence[str]] = (), check: Callable[[dict], str | None] | None = None,
               shape: Callable[[dict], dict] | None = None) -> list[dict]:
    """The rows of a data file: JSONL (blank lines skipped) or parquet (see `iter_file_rows`).

    `shape(row)` first brings each row into the form checked and returned (e.g. `prompt_row`); a
    DataError it raises is reported with the row's place. A row must then hold every key in
    `required` and, when `alternatives` is given, every key of at least one of its sets:
    alternatives=[["prompt"], ["messages"]] means "prompt or messages". `check(row)` says what else
    is wrong with a row (None: nothing), reported as `path:line: ...`."""
    rows = []
    for where, row in iter_file_rows(path):
        try:
            row = shape(row) if shape else row
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        problem = _missing(row, required, alternatives) or _wrong_type(row) or (check(row) if check else None)
        if problem:
            raise DataError(f"{where}: {problem}")
        rows.append(row)
    return rows


def prompt_row(row: dict, prompt_key: str = PROMPT_KEY, label_key: str = LABEL_KEY) -> dict:
    """`row` in the form the text tasks read, the one rule for data files and rows handed in:

    - the prompt is the value at `prompt_key`: a text stays `prompt`, a list of {role, content}
      messages becomes `messages` (TRL's conversational prompt, verl's `prompt` column); a row's own
      `messages` are kept when prompt_key is the default;
    - `ground_truth` is the value at `label_key` (OpenRLHF's --label_key); with the default
      label_key, a row without a top-level ground_truth takes `reward_model.ground_truth` (verl's
      layout).
    A key may be a dotted path into nested objects (`reward_model.ground_truth`). Every other column
    is kept as it is. A row without the prompt, without a label_key other than the default, with a
    prompt list that is not messages, or whose ground truth taken from elsewhere is not a string,
    is a DataError for the caller to put the row's place in front of."""
    out = dict(row)
    if prompt_key != PROMPT_KEY:
        prompt = value_at(row, prompt_key)
        if prompt is ABSENT:
            raise DataError(f"missing key {prompt_key!r} (task.prompt_key) {_has(row)}")
        out = {k: v for k, v in out.items() if k not in ("prompt", "messages", prompt_key)}
        out["prompt"] = prompt
    elif "prompt" not in out and "messages" not in out:
        raise DataError(f"needs one of 'prompt' | 'messages' {_has(row)}; set task.prompt_key to the key that holds "
                        f"the prompt")
    if isinstance(out.get("prompt"), list) and "messages" not in out:
        problem = _messages_problem(prompt_key, out["prompt"], "a string or ")
        if problem:
            raise DataError(problem)
        out = {("messages" if k == "prompt" else k): v for k, v in out.items()}
    source = label_key
    if label_key != LABEL_KEY:
        label = value_at(row, label_key)
        if label is ABSENT:
            raise DataError(f"missing key {label_key!r} (task.label_key) {_has(row)}")
    elif "ground_truth" not in out and value_at(row, "reward_model.ground_truth") is not ABSENT:
        source, label = "reward_model.ground_truth", value_at(row, "reward_model.ground_truth")
    else:
        return out
    if not isinstance(label, str):
        raise DataError(_type_problem(f"{source!r} (the row's ground truth)", label))
    out["ground_truth"] = label
    return out


ABSENT = object()  # what `value_at` finds where a row has no such key


def value_at(row: dict, key: str):
    """The value at `key` in `row`: a top-level key of that name, else the dotted path's (`a.b`), else ABSENT."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return ABSENT
        value = value[part]
    return value


def _has(row: dict) -> str:
    return f"(the row has keys: {', '.join(map(repr, row)) or 'none'})"


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


def iter_file_rows(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """(where, row) for each row of a data file: a parquet file (`is_parquet`) through `iter_parquet`,
    any other through `iter_jsonl`, whose errors it keeps."""
    return iter_parquet(path) if is_parquet(path) else iter_jsonl(path)


def is_parquet(path: str | os.PathLike) -> bool:
    """Whether `path` is read as parquet: its name ends in `.parquet`, or it begins with parquet's magic
    bytes `PAR1` (a parquet file under another name). A file that cannot be opened is not: the JSONL
    reader says what is wrong with it."""
    if str(path).endswith(".parquet"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


def iter_parquet(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """(`path:row N`, row) for each row of a parquet file (pyarrow's reader), N counted from 0 as
    pyarrow and pandas count rows. A null cell is an absent key: a parquet file has a column for
    every key of any row, null where a row had none. A file pyarrow cannot read, and one with no
    rows, are DataErrors naming it; a missing file stays a FileNotFoundError, whose message names it."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise DataError(f"{path}: reading a parquet file needs pyarrow (pip install pyarrow)") from None
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
    try:
        rows = pyarrow.parquet.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as e:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"{path}: not a readable parquet file ({detail})") from None
    if not rows:
        raise DataError(f"{path}: the file has no rows (it is empty)")
    for i, row in enumerate(rows):
        yield f"{path}:row {i}", {k: v for k, v in row.items() if v is not None}


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
    has = _has(row)
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
            return _type_problem(repr(key), row[key])
    return _messages_problem("messages", row["messages"]) if "messages" in row else None


def _type_problem(name: str, value) -> str:
    """`name` (a key as the message shows it) must be a string, said with what `value` is (and how to
    write a number as one)."""
    hint = f' (write it as "{value}")' if type(value) in (int, float) else ""
    return f"{name} must be a string, got a {_json_type(value)}{hint}"


def _messages_problem(key: str, messages, alternative: str = "") -> str | None:
    """What is wrong with `messages` (the value at `key`) as a list of {role, content} messages, or None."""
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else f"a {_json_type(messages)}"
        return f"{key!r} must be {alternative}a non-empty list of {{role, content}} objects, got {got}"
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return f"{key!r}[{i}] must be an object with string 'role' and 'content', got {_excerpt(m)}"
    return None


def _excerpt(value) -> str:
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):  # a value JSON cannot write (parquet's bytes, a date)
        return repr(value)[:80]


def _json_type(value) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
