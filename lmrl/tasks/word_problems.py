"""Arithmetic word problems, generated offline: a small math-reasoning data set with exact answers.

    rows = generate_word_problems(1000, seed=0)   # [{"prompt": "Mia has 12 apples ...", "ground_truth": "19"}, ...]
    write_splits("data/word_problems", n_train=5000, n_test=500, seed=0)

Each kind has a few templates filled with a name, an object and numbers drawn from a seeded
generator, so a seed always gives the same rows. Answers are whole numbers ≥ 1: subtraction never
takes all there is, division is always exact. Prompts hold the problem only; the trainer's
template adds any instructions (e.g. the `<think>`/`<answer>` format).
"""

from __future__ import annotations

import random
from pathlib import Path

from ..common.data import write_jsonl

NAMES = [("Mia", "she"), ("Leo", "he"), ("Ava", "she"), ("Noah", "he"), ("Zoe", "she"), ("Omar", "he"),
         ("Lena", "she"), ("Ravi", "he"), ("Sofia", "she"), ("Kenji", "he"), ("Amara", "she"), ("Tom", "he")]
OBJECTS = [("apple", "apples"), ("marble", "marbles"), ("book", "books"), ("pencil", "pencils"),
           ("cookie", "cookies"), ("sticker", "stickers"), ("shell", "shells"), ("card", "cards"),
           ("stamp", "stamps"), ("balloon", "balloons"), ("candy", "candies"), ("coin", "coins")]

# {n}/{p}: name and pronoun; {a}/{b}: counts such as "12 apples"; {x}/{y}: bare numbers; {os}: the object, plural.
TEMPLATES = {
    "add": [
        "{n} has {a} and buys {b} more. How many {os} does {p} have now?",
        "{n} collected {a} on Monday and {b} on Tuesday. How many {os} did {p} collect in total?",
        "There are {a} in a box. {n} adds {b}. How many {os} are in the box now?",
    ],
    "sub": [
        "{n} has {a} and gives {b} to a friend. How many {os} does {p} have left?",
        "A jar holds {a}. {n} takes out {b}. How many {os} are still in the jar?",
        "{n} had {a}. After losing some, {p} has {b}. How many {os} did {p} lose?",
    ],
    "mul": [
        "{n} has {x} bags with {b} in each bag. How many {os} does {p} have?",
        "Each shelf holds {b}. How many {os} fit on {x} shelves?",
        "{n} buys {x} packs of {os}. Each pack has {y} {os}. How many {os} does {p} buy?",
    ],
    "div": [
        "{n} shares {a} equally among {x} friends. How many {os} does each friend get?",
        "{n} packs {a} into {x} bags with the same number in each. How many {os} are in each bag?",
    ],
}


def generate_word_problems(n: int, seed: int, kinds=("add", "sub", "mul"), max_value: int = 100) -> list[dict]:
    """`n` distinct problems, `{"prompt": ..., "ground_truth": "19"}`, the kinds drawn evenly at random.

    Operands of + and −, products and dividends are at most `max_value`."""
    unknown = [k for k in kinds if k not in TEMPLATES]
    if unknown or not kinds:
        raise ValueError(f"unknown kinds {unknown or list(kinds)}; choose from {list(TEMPLATES)}")
    if max_value < 4:
        raise ValueError(f"max_value must be at least 4 (got {max_value})")
    rng, rows, seen, misses = random.Random(seed), [], set(), 0
    while len(rows) < n and misses < 10_000:  # that many repeats in a row: the space is used up
        prompt, answer = _problem(rng, rng.choice(kinds), max_value)
        if prompt in seen:
            misses += 1
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "ground_truth": str(answer)})
        misses = 0
    if len(rows) == n:
        return rows
    raise ValueError(f"could only make {len(rows)} distinct problems of kinds {list(kinds)} with "
                     f"max_value={max_value}; ask for fewer or raise max_value")


def write_splits(out_dir: str | Path, n_train: int, n_test: int, seed: int, kinds=("add", "sub", "mul"),
                 max_value: int = 100) -> tuple[Path, Path]:
    """`out_dir/train.jsonl` and `out_dir/test.jsonl` of word problems: no prompt is in both."""
    rows = generate_word_problems(n_train + n_test, seed, kinds, max_value)  # distinct: the split cannot overlap
    return _write_pair(out_dir, rows, n_train)


def generate_addition_chat(n: int, seed: int, digits: int = 2) -> list[dict]:
    """`n` distinct questions "What is 23 + 58?" with `digits`-digit operands, ground truth "81"."""
    low, high = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    space = (high - low + 1) ** 2
    if n > space:
        raise ValueError(f"asked for {n} distinct {digits}-digit additions but only {space} exist")
    rng = random.Random(seed)
    pairs = rng.sample(range(space), n)
    size = high - low + 1
    return [{"prompt": f"What is {low + p // size} + {low + p % size}?", "ground_truth": str(2 * low + p // size + p % size)}
            for p in pairs]


def write_addition_chat(out_dir: str | Path, n_train: int, n_test: int, seed: int, digits: int = 2) -> tuple[Path, Path]:
    """train.jsonl / test.jsonl of `generate_addition_chat` questions: no question is in both."""
    return _write_pair(out_dir, generate_addition_chat(n_train + n_test, seed, digits), n_train)


def _write_pair(out_dir: str | Path, rows: list[dict], n_train: int) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_jsonl(out / "train.jsonl", rows[:n_train]), write_jsonl(out / "test.jsonl", rows[n_train:])


def _problem(rng: random.Random, kind: str, max_value: int) -> tuple[str, int]:
    name, pronoun = rng.choice(NAMES)
    one, many = rng.choice(OBJECTS)
    x = y = 0
    if kind == "add":
        a, b = rng.randint(2, max_value), rng.randint(2, max_value)
        answer = a + b
    elif kind == "sub":
        a = rng.randint(2, max_value)
        b = rng.randint(1, a - 1)
        answer = a - b
    else:  # mul and div: a = x·y, both factors at least 2; b is y of the object
        x = rng.randint(2, max_value // 2)
        y = rng.randint(2, max_value // x)
        a, b = x * y, y
        answer = a if kind == "mul" else y

    def count(k: int) -> str:
        return f"{k} {one if k == 1 else many}"

    template = rng.choice(TEMPLATES[kind])
    return template.format(n=name, p=pronoun, a=count(a), b=count(b), x=x, y=y, os=many), answer
