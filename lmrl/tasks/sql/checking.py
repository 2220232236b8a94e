"""DBBench answer checks, as pure functions.

    answers_match(["2.0"], ["2"])                     # True: numbers compare as exact decimals
    answers_match(["Paris", "Rome"], ["Rome", "Paris"])  # True: otherwise as sets of strings
    table_md5([("a", "1"), ("b", None)])               # the hash DBBench stores as answer_md5

Questions (AgentBench `result_processor.py`, `compare_results`): numbers compare within `tol`
(AgentBench: 1e-2 absolute), one value against one or lists one to one (so their counts must
agree); anything else compares as sets of normalised strings. Normalising strips whitespace and
one pair of surrounding quotes, a trailing `%` and thousands separators in numbers ("1,429" ->
1429), and writes every null-like value (None, "none", "null", "") as "none". Case is kept:
DBBench asks for answers "exactly the same as the correct answer". Unlike AgentBench, null does
not also equal "0".

Stricter than Python's float(), which AgentBench uses: a number is ASCII digits only (no "٧", no
"1_000", no "inf"), written without leading zeros ("07" is text, so it equals only "07"), and it
is compared as an exact decimal, so integers above 2**53 that differ in the last digit differ.
An integer of any size (`[0xfff...]` with thousands of digits) is compared too, never raising
Python's int-to-str digit limit.

Modifications (INSERT/UPDATE/DELETE): DBBench hashes the whole table after the episode, in MySQL:

    SELECT md5(group_concat(rowhash ORDER BY rowhash)) FROM
      (SELECT substring(md5(concat_ws(',', col1, col2, ...)), 1, 5) AS rowhash FROM t) AS sub

`table_md5` computes the same in Python (reproducing all 40 answer_md5 values of dev.jsonl): each
row's non-NULL values joined by ",", md5, first 5 hex digits; those sorted and joined by ","; cut
at 1024 bytes (MySQL's default group_concat_max_len, reached at 171 rows); md5. The row order
does not matter, the column order does. Past 170 rows the hash reads only the first 170 row hashes
in sorted order, so a change to a row whose hash sorts later goes unseen; `max_bytes=None` hashes
every row (what `sql.strict_hash` checks with).
"""

from __future__ import annotations

import ast
import hashlib
import re
from decimal import Decimal
from typing import Iterable, Sequence

MODIFICATION_TYPES = ("INSERT", "UPDATE", "DELETE")
NULL_TEXT = "none"
EMPTY_TABLE_MD5 = "NULL"  # MySQL's group_concat over no rows is NULL, and md5(NULL) too
GROUP_CONCAT_MAX_LEN = 1024  # bytes; MySQL's default
_NULL_LIKE = {"", "none", "null"}
# ASCII only: an integer part without leading zeros, optional fraction and exponent.
_NUMBER = re.compile(r"[+-]?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,4})?")
_THOUSANDS = re.compile(r"[+-]?[1-9][0-9]{0,2}(?:,[0-9]{3})+(?:\.[0-9]+)?")


def normalise_value(value) -> str:
    """One answer or label item as comparable text: stripped, unquoted, null-like -> "none",
    numbers in one canonical form ("2.0", "2" and "2.00" -> "2"; "1,429" -> "1429"; "45%" -> "45")."""
    if value is None:
        return NULL_TEXT
    if isinstance(value, int) and not isinstance(value, bool):
        return _canonical(Decimal(value))  # str() refuses ints past 4,300 digits (`Final Answer: [0xfff...]`)
    text = str(value).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].strip()
    if text.lower() in _NULL_LIKE:
        return NULL_TEXT
    number = as_number(text)
    return text if number is None else _canonical(number)


def as_number(text) -> Decimal | None:
    """`text` as an exact decimal ("1,429", "45%", " 2.0 " included; a float as its repr), or None
    when it is not a number written in ASCII digits without leading zeros."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return Decimal(text)  # exact, and no int-to-str digit limit
    if isinstance(text, float):
        text = repr(text)
    text = str(text).strip()
    if text.endswith("%"):
        text = text[:-1].strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return Decimal(text) if _NUMBER.fullmatch(text) else None


def _canonical(number: Decimal) -> str:
    """Plain digits, exactly, without trailing zeros: 2, 2.0 and 2.00 -> "2"; 2.50 -> "2.5"; 1e3 -> "1000"."""
    if number.is_zero():
        return "0"
    text = format(number, "f")  # exact: formatting does not round to the context precision
    return text.rstrip("0").rstrip(".") if "." in text else text


def answers_match(answer: Sequence, label: Sequence, tol: float = 1e-2) -> bool:
    """Whether an agent's answer list is right for a question whose correct answer is `label`."""
    got = [normalise_value(v) for v in answer]
    want = [normalise_value(v) for v in label]
    got_numbers = [as_number(v) for v in got]
    want_numbers = [as_number(v) for v in want]
    if None not in got_numbers and None not in want_numbers and got and want:
        if len(got) != len(want):
            return False
        # Sorted pairing is the best one-to-one matching of numbers on a line.
        tolerance = Decimal(repr(tol))
        return all(abs(a - b) <= tolerance for a, b in zip(sorted(got_numbers), sorted(want_numbers)))
    return set(got) == set(want)


def is_modification(task_type: str) -> bool:
    """Whether a DBBench type is checked by the table's hash rather than by the answer."""
    return task_type.upper() in MODIFICATION_TYPES


def row_hash(row: Sequence) -> str:
    """MySQL `substring(md5(concat_ws(',', ...)), 1, 5)` of one row: NULLs are skipped."""
    text = ",".join(_mysql_text(v) for v in row if v is not None)
    return hashlib.md5(text.encode("utf-8")).hexdigest()[:5]


def table_md5(rows: Iterable[Sequence], max_bytes: int | None = GROUP_CONCAT_MAX_LEN) -> str:
    """DBBench's order-independent hash of a table's rows (see the module docstring); `max_bytes=None`:
    of every row, not only those within MySQL's group_concat limit."""
    hashes = sorted(row_hash(row) for row in rows)
    if not hashes:
        return EMPTY_TABLE_MD5
    joined = ",".join(hashes).encode("ascii")[:max_bytes]
    return hashlib.md5(joined).hexdigest()


def parse_answer_md5(text: str) -> str:
    """The hex digest inside DBBench's stored form "[('09aa8f...',)]" (a bare digest passes through);
    "[(None,)]" (an empty table) becomes EMPTY_TABLE_MD5. Raises ValueError on anything else."""
    text = text.strip()
    if re.fullmatch(r"[0-9a-f]{32}", text) or text == EMPTY_TABLE_MD5:
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], tuple) and len(value[0]) == 1:
        digest = value[0][0]
        if digest is None:
            return EMPTY_TABLE_MD5
        if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{32}", digest):
            return digest
    raise ValueError(f"answer_md5 {text[:80]!r} is neither a 32-digit md5 nor DBBench's \"[('<md5>',)]\"")


def _mysql_text(value) -> str:
    """A value as MySQL's concat_ws sees it in a TEXT column; Python's str for the rest."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
