"""Preference pairs and SFT rows generated offline: demo data for DPO and reward models, no download.

    rows = generate_preferences(1000, seed=0)
    # [{"prompt": "What is 37 + 48?", "chosen": "37 + 48 = 85.", "rejected": "37 + 48 = 58."}, ...]
    write_preference_splits("data/preferences", n_train=2000, n_test=200, seed=0)
    write_sft_splits("data/preferences-sft", n_train=2000, n_test=200, seed=0)  # the chosen side, for warm-up

Two kinds, mixed at random, each a preference a small model can learn:
- arithmetic: small sums, differences and products; chosen states the right result, rejected is the same
  sentence with a wrong one (off by a little, or two digits swapped), so the pair differs only in correctness.
- concise: a short factual or word question; chosen answers in one sentence, rejected buries the same
  answer in filler and repeats it, so the pair differs only in style.
Every row is a distinct item (37 + 48 and 48 + 37 are one item; so are the phrasings of "capital of
France"), so train and test never share a question. A seed always gives the same rows, and the SFT
and preference files of one seed split the same questions the same way.
"""

from __future__ import annotations

import random
from pathlib import Path

from ..common.data import write_jsonl

KINDS = ("arithmetic", "concise")

ARITHMETIC_PROMPTS = ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Calculate {a} {op} {b}.",
                      "What does {a} {op} {b} equal?", "{a} {op} {b} = ?"]

WORDS = ["apple", "garden", "window", "planet", "river", "yellow", "summer", "pencil", "castle", "dragon",
         "bottle", "rabbit", "forest", "butter", "silver", "orange", "monkey", "candle", "jacket", "ladder",
         "basket", "violin", "winter", "number", "island", "pocket", "camera", "rocket", "tunnel", "button",
         "kitten", "meadow", "harbor", "lemon", "tiger", "cloud", "bridge", "guitar", "market", "puzzle"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _pairs(text: str) -> list[tuple[str, str]]:
    """ "France=Paris; Japan=Tokyo" → [("France", "Paris"), ("Japan", "Tokyo")]"""
    return [tuple(item.split("=")) for item in text.split("; ")]


# category: (phrasings of the question, the one-sentence answer, the items filling both: {0}, {1}, ...)
CONCISE = {
    "capital": (["What is the capital of {0}?", "Name the capital of {0}.", "Which city is the capital of {0}?"],
                "The capital of {0} is {1}.",
                _pairs("France=Paris; Germany=Berlin; Italy=Rome; Spain=Madrid; Portugal=Lisbon; Japan=Tokyo; "
                       "China=Beijing; India=New Delhi; Canada=Ottawa; Australia=Canberra; Egypt=Cairo; "
                       "Kenya=Nairobi; Russia=Moscow; Norway=Oslo; Sweden=Stockholm; Finland=Helsinki; "
                       "Denmark=Copenhagen; Greece=Athens; Poland=Warsaw; Ireland=Dublin; Austria=Vienna; "
                       "Belgium=Brussels; Peru=Lima; Argentina=Buenos Aires; Mexico=Mexico City; "
                       "South Korea=Seoul; Thailand=Bangkok; Turkey=Ankara; Hungary=Budapest")),
    "colour": (["What colour is {0}?", "What color is {0}?"], "{0} is {1}.",
               _pairs("the sky on a clear day=blue; fresh grass=green; fresh snow=white; a ripe banana=yellow; "
                      "coal=black; a ripe tomato=red; a lemon=yellow; milk=white; a ripe strawberry=red; "
                      "a carrot=orange; a lime=green; milk chocolate=brown; a flamingo=pink; a raven=black")),
    "synonym": (["Give a synonym for '{0}'.", "What is another word for '{0}'?"], "A synonym for '{0}' is '{1}'.",
                _pairs("happy=glad; big=large; small=little; fast=quick; begin=start; end=finish; smart=clever; "
                       "easy=simple; hard=difficult; rich=wealthy; scared=afraid; shut=close; gift=present; "
                       "buy=purchase; answer=reply; choose=select; huge=enormous; tired=sleepy")),
    "antonym": (["What is the opposite of '{0}'?", "Give an antonym for '{0}'."], "The opposite of '{0}' is '{1}'.",
                _pairs("hot=cold; up=down; day=night; early=late; full=empty; win=lose; push=pull; wet=dry; "
                       "above=below; strong=weak; fast=slow; happy=sad; loud=quiet; first=last; inside=outside; "
                       "buy=sell; remember=forget; true=false")),
    "plural": (["What is the plural of '{0}'?", "Write the plural form of '{0}'."], "The plural of '{0}' is '{1}'.",
               _pairs("mouse=mice; child=children; foot=feet; tooth=teeth; man=men; woman=women; goose=geese; "
                      "person=people; leaf=leaves; knife=knives; wolf=wolves; box=boxes; city=cities; "
                      "baby=babies; sheep=sheep; bus=buses; potato=potatoes")),
    "past": (["What is the past tense of '{0}'?", "Give the past tense of the verb '{0}'."],
             "The past tense of '{0}' is '{1}'.",
             _pairs("go=went; eat=ate; see=saw; run=ran; swim=swam; write=wrote; take=took; give=gave; "
                    "buy=bought; think=thought; bring=brought; teach=taught; fly=flew; drink=drank; sing=sang; "
                    "begin=began; speak=spoke; drive=drove; make=made; sleep=slept")),
    "young": (["What is a baby {0} called?", "What do you call a young {0}?"], "A baby {0} is called {1}.",
              _pairs("dog=a puppy; cat=a kitten; cow=a calf; horse=a foal; sheep=a lamb; pig=a piglet; "
                     "duck=a duckling; frog=a tadpole; kangaroo=a joey; bear=a cub; deer=a fawn; swan=a cygnet; "
                     "owl=an owlet; goose=a gosling")),
    "count": (["How many {0} are there in {1}?", "How many {0} are in {1}?"], "There are {2} {0} in {1}.",
              [tuple(item.split("=")) for item in
               ("days=a week=7; months=a year=12; hours=a day=24; minutes=an hour=60; seconds=a minute=60; "
                "days=a leap year=366; weeks=a year=52; years=a century=100; years=a decade=10; eggs=a dozen=12; "
                "letters=the English alphabet=26; centimetres=a metre=100; grams=a kilogram=1000; "
                "metres=a kilometre=1000").split("; ")]),
    "legs": (["How many legs does {0} have?", "Tell me how many legs {0} has."], "{0} has {1} legs.",
             _pairs("a spider=8; an ant=6; a bee=6; a beetle=6; a dog=4; a cat=4; a horse=4; a cow=4; "
                    "a bird=2; a chicken=2; a duck=2; a person=2")),
    "length": (["How many letters are in the word '{0}'?", "Count the letters in '{0}'."],
               "The word '{0}' has {1} letters.", [(w, str(len(w))) for w in WORDS]),
    "first": (["What is the first letter of '{0}'?", "Which letter does the word '{0}' start with?"],
              "The word '{0}' starts with '{1}'.", [(w, w[0]) for w in WORDS]),
    "last": (["What is the last letter of the word '{0}'?", "Which letter does '{0}' end with?"],
             "The word '{0}' ends with '{1}'.", [(w, w[-1]) for w in WORDS]),
    "reverse": (["Spell '{0}' backwards.", "Write the word '{0}' in reverse."], "'{0}' backwards is '{1}'.",
                [(w, w[::-1]) for w in WORDS]),
    "upper": (["Write '{0}' in capital letters.", "Write the word '{0}' in upper case."],
              "'{0}' in capital letters is '{1}'.", [(w, w.upper()) for w in WORDS]),
    "minutes": (["How many minutes are in {0} hours?", "Convert {0} hours to minutes."], "{0} hours is {1} minutes.",
                [(str(n), str(60 * n)) for n in range(2, 25)]),
    "weeks": (["How many days are in {0} weeks?", "Convert {0} weeks to days."], "{0} weeks is {1} days.",
              [(str(n), str(7 * n)) for n in range(2, 21)]),
    "next": (["What comes after {0}?", "What comes right after {0}?"], "{1} comes after {0}.",
             [(d, DAYS[(i + 1) % 7]) for i, d in enumerate(DAYS)]
             + [(m, MONTHS[(i + 1) % 12]) for i, m in enumerate(MONTHS)]
             + [(f"the letter {c} in the alphabet", f"The letter {LETTERS[i + 1]}")
                for i, c in enumerate(LETTERS[:-1])]),
}

OPENERS = ["That is a great question, and I am glad you asked it.",
           "Let me think about this carefully before I answer.",
           "Many people wonder about this, so it is a good thing to ask.",
           "There are a lot of ways to look at a question like this one.",
           "Before I answer, it helps to start from the very beginning.",
           "Well, this is something that comes up quite often.",
           "I will do my best to give you a complete and thorough answer."]
FILLERS = ["It is worth keeping in mind that there is often more to say.",
           "This is something a lot of people find interesting.",
           "Of course, it always helps to double-check things like this.",
           "Questions like this one are a good way to learn.",
           "There is a lot that could be said about this topic."]
REPEATS = ["Let me say that again.", "To repeat the main point.", "Once more, for clarity.",
           "In other words, as I said."]
CLOSERS = ["I hope this helps!", "Let me know if you have any other questions.",
           "Feel free to ask if anything is unclear.", "Thank you for asking such a good question."]


def generate_preferences(n: int, seed: int = 0, kinds=KINDS) -> list[dict]:
    """`n` rows {"prompt", "chosen", "rejected"} of distinct items, each kind drawn evenly at random. There
    are about 440 concise and 320 arithmetic items: once one kind runs out, the remaining rows are the other."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown kinds {unknown or list(kinds)}; choose from {list(KINDS)}")
    rng, rows, seen, misses = random.Random(seed), [], set(), 0
    while len(rows) < n and misses < 10_000:  # that many repeats in a row: the items are used up
        key, row = _arithmetic(rng) if rng.choice(kinds) == "arithmetic" else _concise(rng)
        if key in seen:
            misses += 1
            continue
        seen.add(key)
        rows.append(row)
        misses = 0
    if len(rows) < n:
        raise ValueError(f"could only make {len(rows)} distinct items of kinds {list(kinds)} "
                         f"(concise has {sum(len(c[2]) for c in CONCISE.values())}); ask for fewer")
    rng.shuffle(rows)  # concise items run out first: spread them over train and test alike
    return rows


def write_preference_splits(out_dir: str | Path, n_train: int, n_test: int, seed: int = 0,
                            kinds=KINDS) -> tuple[Path, Path]:
    """`out_dir/train.jsonl` and `out_dir/test.jsonl` of preference rows: no item is in both."""
    return _write_pair(out_dir, generate_preferences(n_train + n_test, seed, kinds), n_train)


def write_sft_splits(out_dir: str | Path, n_train: int, n_test: int, seed: int = 0,
                     kinds=KINDS) -> tuple[Path, Path]:
    """train.jsonl / test.jsonl of SFT rows {"prompt", "response"}: the chosen side of the same seed's
    preference rows, so a warm-up on them sees none of the preference test questions."""
    pairs = generate_preferences(n_train + n_test, seed, kinds)
    return _write_pair(out_dir, [{"prompt": r["prompt"], "response": r["chosen"]} for r in pairs], n_train)


def _arithmetic(rng: random.Random) -> tuple[tuple, dict]:
    """Small numbers (sums of 1..12, differences within 20, times tables to 10 × 10): facts a 135M-parameter
    model has seen, so a reward model or DPO can learn to check them rather than to guess."""
    op = rng.choice("+-×")
    if op == "+":
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        result = a + b
    elif op == "-":
        a = rng.randint(3, 20)
        b = rng.randint(1, a - 1)
        result = a - b
    else:
        a, b = rng.randint(2, 10), rng.randint(2, 10)
        result = a * b
    key = ("arithmetic", op, *(sorted((a, b)) if op != "-" else (a, b)))  # 37 + 48 is 48 + 37
    prompt = rng.choice(ARITHMETIC_PROMPTS).format(a=a, op=op, b=b)
    return key, {"prompt": prompt, "chosen": f"{a} {op} {b} = {result}.",
                 "rejected": f"{a} {op} {b} = {wrong_result(rng, result)}."}


def wrong_result(rng: random.Random, result: int) -> int:
    """A plausible mistake: two neighbouring digits swapped (85 → 58) or off by 1 to 10; never `result`
    itself, never negative."""
    digits = str(result)
    swaps = [i for i in range(len(digits) - 1) if digits[i] != digits[i + 1] and (i > 0 or digits[1] != "0")]
    if swaps and rng.random() < 0.3:
        i = rng.choice(swaps)
        return int(digits[:i] + digits[i + 1] + digits[i] + digits[i + 2:])
    return result + rng.choice([d for d in range(-10, 11) if d and result + d >= 0])


def _concise(rng: random.Random) -> tuple[tuple, dict]:
    category = rng.choice(list(CONCISE))
    phrasings, answer, items = CONCISE[category]
    item = rng.choice(items)
    prompt = rng.choice(phrasings).format(*item)
    chosen = _capitalised(answer.format(*item))
    return ("concise", category, item), {"prompt": prompt, "chosen": chosen, "rejected": _ramble(rng, chosen)}


def _ramble(rng: random.Random, answer: str) -> str:
    """`answer` buried in filler: openers, the answer, more filler, the answer again, closers."""
    parts = [*rng.sample(OPENERS, rng.randint(1, 2)), answer, rng.choice(FILLERS), rng.choice(REPEATS), answer,
             rng.choice(CLOSERS)]
    return " ".join(parts)


def _capitalised(text: str) -> str:
    return text[0].upper() + text[1:]


def _write_pair(out_dir: str | Path, rows: list[dict], n_train: int) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_jsonl(out / "train.jsonl", rows[:n_train]), write_jsonl(out / "test.jsonl", rows[n_train:])
