"""Procedural single-skill SQL tasks over small random tables.

    train = ProceduralSQLTasks(seed=0)                      # split="train"
    heldout = ProceduralSQLTasks(seed=1, split="heldout").take(200)
    task = train.sample(random.Random(7))                   # one task, its skill drawn uniformly

A table has 5-15 rows and 3-5 columns: a unique name column, a category (city, team, ...) with
repeats, and 1-3 numeric columns whose values are distinct within the column, so "the highest"
never ties. Each skill fills a template and writes one reference statement; the label comes from
running that statement in the sandbox (for a modification: the hash of the changed table, as
DBBench's answer_md5). A task whose reference result is empty, tied or changes nothing is drawn
again.

The split is a function of a task's content (sha256 of table and question): held-out when the
hash is 0 mod `heldout_every`, so train and held-out never share a task, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, replace

from .checking import table_md5
from .sandbox import InProcessSandbox, Table, quote_identifier as q, quote_literal as lit
from .tasks import SQLTask

SKILLS = ("filter", "count", "sum", "avg", "max", "min", "ranking", "group_by", "comparison",
          "insert", "update", "delete")
MODIFYING_SKILLS = ("insert", "update", "delete")
SPLITS = ("train", "heldout")

_TABLE_NAMES = ("employees", "Club Members", "player_stats", "Survey Results", "Bob's Roster", "sales-2024")
_KEYS = ("name", "Full Name", "player")
_FIRST = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena",
          "Marco", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Viktor", "Wen", "Yusuf")
_LAST = ("Silva", "Novak", "Okafor", "Berg", "Tanaka", "Costa", "Haddad", "Kim", "Larsen", "Moreau")
_CATEGORIES = {
    "city": ("Lisbon", "Oslo", "Lagos", "Lima", "Kyoto", "Quebec"),
    "Home City": ("New York", "Cape Town", "Sao Paulo", "San Diego", "Hong Kong"),
    "team": ("Red", "Blue", "Green", "Gold"),
    "department": ("Sales", "R&D", "Support", "Legal", "Finance"),
}
_NUMBERS = {
    "age": ("INTEGER", tuple(range(18, 70))),
    "salary": ("INTEGER", tuple(range(30_000, 150_001, 500))),
    "points": ("INTEGER", tuple(range(0, 100))),
    "Year Joined": ("INTEGER", tuple(range(1980, 2024))),
    "score": ("REAL", tuple(x / 10 for x in range(0, 1001))),
    "Height (m)": ("REAL", tuple(x / 100 for x in range(150, 211))),
    "rating": ("REAL", tuple(x / 10 for x in range(10, 51))),
}


@dataclass(frozen=True)
class _Shape:
    """A random table and the roles of its columns."""
    table: Table
    key: str
    cat: str
    nums: tuple[str, ...]

    def values(self, column: str) -> list:
        i = self.table.column_names.index(column)
        return [row[i] for row in self.table.rows]


def _random_table(rng: random.Random) -> _Shape:
    n = rng.randint(5, 15)
    key, cat = rng.choice(_KEYS), rng.choice(list(_CATEGORIES))
    nums = tuple(rng.sample(list(_NUMBERS), rng.randint(1, 3)))
    names = rng.sample([f"{a} {b}" for a in _FIRST for b in _LAST], n)
    kinds = rng.sample(_CATEGORIES[cat], rng.randint(2, 4))
    columns = {key: ("TEXT", names), cat: ("TEXT", [rng.choice(kinds) for _ in range(n)])}
    for num in nums:
        columns[num] = (_NUMBERS[num][0], rng.sample(_NUMBERS[num][1], n))
    order = [key] + rng.sample([cat, *nums], len(nums) + 1)
    table = Table(name=rng.choice(_TABLE_NAMES), columns=tuple((c, columns[c][0]) for c in order),
                  rows=tuple(zip(*(columns[c][1] for c in order))))
    return _Shape(table, key, cat, nums)


def _say(value) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)


def _filter(rng, s):
    t = q(s.table.name)
    if rng.random() < 0.5:
        c = rng.choice(s.values(s.cat))
        return (f"List the {s.key} of every row whose {s.cat} is {_say(c)}.",
                f"SELECT {q(s.key)} FROM {t} WHERE {q(s.cat)} = {lit(c)}")
    num, name = rng.choice(s.nums), rng.choice(s.values(s.key))
    return f"What is the {num} of {name}?", f"SELECT {q(num)} FROM {t} WHERE {q(s.key)} = {lit(name)}"


def _count(rng, s):
    t = q(s.table.name)
    if rng.random() < 0.5:
        num = rng.choice(s.nums)
        x = rng.choice(s.values(num))
        return (f"How many rows have a {num} greater than {_say(x)}?",
                f"SELECT COUNT(*) FROM {t} WHERE {q(num)} > {lit(x)}")
    c = rng.choice(s.values(s.cat))
    return f"How many rows have {s.cat} equal to {_say(c)}?", f"SELECT COUNT(*) FROM {t} WHERE {q(s.cat)} = {lit(c)}"


def _aggregate(function: str, word: str):
    def build(rng, s):
        num, where, scope = rng.choice(s.nums), "", ""
        if rng.random() < 0.5:
            c = rng.choice(s.values(s.cat))
            where, scope = f" WHERE {q(s.cat)} = {lit(c)}", f" among rows whose {s.cat} is {_say(c)}"
        return f"What is the {word} {num}{scope}?", f"SELECT {function}({q(num)}) FROM {q(s.table.name)}{where}"
    return build


def _ranking(rng, s):
    num, k, top = rng.choice(s.nums), rng.randint(1, 3), rng.random() < 0.5
    word = "highest" if top else "lowest"
    text = (f"Which {s.key} has the {word} {num}?" if k == 1
            else f"List the {s.key} of the {k} rows with the {word} {num}.")
    return text, f"SELECT {q(s.key)} FROM {q(s.table.name)} ORDER BY {q(num)} {'DESC' if top else 'ASC'} LIMIT {k}"


def _group_by(rng, s):
    t = q(s.table.name)
    if rng.random() < 0.5:
        num = rng.choice(s.nums)
        totals = Counter()
        for c, x in zip(s.values(s.cat), s.values(num)):
            totals[c] += x
        best = sorted(totals.values(), reverse=True)
        if len(best) < 2 or abs(best[0] - best[1]) < 1e-6:
            return None  # one category, or a tie at the top
        return (f"Which {s.cat} has the largest total {num}?",
                f"SELECT {q(s.cat)} FROM {t} GROUP BY {q(s.cat)} ORDER BY SUM({q(num)}) DESC LIMIT 1")
    return (f"Which {s.cat} values appear in at least 2 rows?",
            f"SELECT {q(s.cat)} FROM {t} GROUP BY {q(s.cat)} HAVING COUNT(*) >= 2")


def _comparison(rng, s):
    num = rng.choice(s.nums)
    top = max(s.values(num))
    name = rng.choice([k for k, x in zip(s.values(s.key), s.values(num)) if x < top])
    t = q(s.table.name)
    return (f"List the {s.key} of every row with a {num} greater than that of {name}.",
            f"SELECT {q(s.key)} FROM {t} WHERE {q(num)} > (SELECT {q(num)} FROM {t} WHERE {q(s.key)} = {lit(name)})")


def _insert(rng, s):
    row = {s.key: f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", s.cat: rng.choice(_CATEGORIES[s.cat])}
    if row[s.key] in s.values(s.key):
        return None
    row.update({num: rng.choice(_NUMBERS[num][1]) for num in s.nums})
    columns = s.table.column_names
    parts = ", ".join(f"{c} {_say(row[c])}" for c in columns)
    return (f"Insert a new row into the table with {parts}.",
            f"INSERT INTO {q(s.table.name)} ({', '.join(map(q, columns))}) VALUES "
            f"({', '.join(lit(row[c]) for c in columns)})")


def _update(rng, s):
    num, i = rng.choice(s.nums), rng.randrange(len(s.table.rows))
    name, old = s.values(s.key)[i], s.values(num)[i]
    new = rng.choice([x for x in _NUMBERS[num][1] if x != old])
    return (f"Change the {num} of {name} to {_say(new)}.",
            f"UPDATE {q(s.table.name)} SET {q(num)} = {lit(new)} WHERE {q(s.key)} = {lit(name)}")


def _delete(rng, s):
    t = q(s.table.name)
    if rng.random() < 0.5:
        num = rng.choice(s.nums)
        x = sorted(s.values(num))[rng.randint(1, len(s.table.rows) - 1)]  # deletes some rows, never all
        return f"Delete every row whose {num} is less than {_say(x)}.", f"DELETE FROM {t} WHERE {q(num)} < {lit(x)}"
    counts = Counter(s.values(s.cat))
    c = rng.choice(sorted(counts))
    if counts[c] == len(s.table.rows):
        return None
    return f"Delete every row whose {s.cat} is {_say(c)}.", f"DELETE FROM {t} WHERE {q(s.cat)} = {lit(c)}"


_BUILDERS = {"filter": _filter, "count": _count, "sum": _aggregate("SUM", "total"),
             "avg": _aggregate("AVG", "average"), "max": _aggregate("MAX", "highest"),
             "min": _aggregate("MIN", "lowest"), "ranking": _ranking, "group_by": _group_by,
             "comparison": _comparison, "insert": _insert, "update": _update, "delete": _delete}


def label_text(value) -> str:
    """A query result value as label text: None -> "none", floats rounded to 6 decimals."""
    if value is None:
        return "none"
    return repr(round(value, 6)) if isinstance(value, float) else str(value)


def content_hash(task: SQLTask) -> str:
    """sha256 of what makes a task itself: its table and its question."""
    t = task.table
    blob = json.dumps([t.name, t.columns, t.rows, task.description], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def is_heldout(task: SQLTask, heldout_every: int = 10) -> bool:
    """Whether a task belongs to the held-out split (1 in `heldout_every`, by content)."""
    return int(content_hash(task)[:16], 16) % heldout_every == 0


def build_task(rng: random.Random, skill: str) -> SQLTask | None:
    """One task of `skill` on a fresh random table, or None when this draw is unusable."""
    shape = _random_table(rng)
    made = _BUILDERS[skill](rng, shape)
    if made is None:
        return None
    description, sql = made
    with InProcessSandbox(shape.table) as db:
        if skill in MODIFYING_SKILLS:
            db.fetch_all(sql)
            rows = db.table_rows()
            if not rows or table_md5(rows) == table_md5(shape.table.rows):
                return None
            label, answer_md5 = (sql,), table_md5(rows)
        else:
            result = db.fetch_all(sql)
            if not result:
                return None
            label, answer_md5 = tuple(label_text(row[0]) for row in result), None
    headers = ",".join(shape.table.column_names)
    task = SQLTask(id="", description=description, table=shape.table, skill=skill, label=label,
                   add_description=f"The name of this table is {shape.table.name}, and the headers of this "
                                   f"table are {headers}.",
                   answer_md5=answer_md5, reference_sql=sql)
    return replace(task, id=f"sql-{skill}-{content_hash(task)[:12]}")


class ProceduralSQLTasks:
    """Endless single-skill tasks of one split; `seed` drives `take` (and `sample` without an rng)."""

    def __init__(self, seed: int = 0, split: str = "train", heldout_every: int = 10, skills=SKILLS):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} (got {split!r})")
        if heldout_every < 2:
            raise ValueError(f"heldout_every must be at least 2 (got {heldout_every})")
        unknown = [s for s in skills if s not in _BUILDERS]
        if unknown or not skills:
            raise ValueError(f"unknown skills {unknown or list(skills)}; choose from {list(SKILLS)}")
        self.split, self.heldout_every, self.skills = split, heldout_every, tuple(skills)
        self.rng = random.Random(seed)

    def sample(self, rng: random.Random | None = None) -> SQLTask:
        """One task of this split: a skill drawn uniformly, then tables drawn until one fits."""
        rng = self.rng if rng is None else rng
        skill = rng.choice(self.skills)
        for _ in range(10_000):
            task = build_task(rng, skill)
            if task is not None and is_heldout(task, self.heldout_every) == (self.split == "heldout"):
                return task
        raise RuntimeError(f"no usable {skill!r} task in 10,000 draws")  # a bug in a builder, not bad luck

    def take(self, n: int) -> list[SQLTask]:
        """`n` distinct tasks (by content), drawn from this generator's own seeded stream."""
        tasks, seen = [], set()
        while len(tasks) < n:
            task = self.sample()
            if task.id not in seen:
                seen.add(task.id)
                tasks.append(task)
        return tasks
