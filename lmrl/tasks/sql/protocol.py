"""The DBBench turn protocol: what an agent turn may say, and the text that teaches it.

An agent turn is exactly one of

    Action: Operation                    Action: Answer
    ```sql                               Final Answer: ["Paris", "Rome"]
    SELECT city FROM `people`;
    ```

(free-form reasoning may come before). `parse_action` reads a turn into an `Action`:
`operation` (exactly one SQL block), `answer` (a list literal, read with json or
ast.literal_eval, never eval) or `invalid` with the reason. Line endings may be \n, \r\n or \r.
An SQL block is a fence labelled `sql`, `sqlite` or `mysql` (any case) or not labelled at all;
blocks in other languages are ignored. Stricter than AgentBench, which runs the first of several
SQL blocks: two blocks, or two Action lines, are invalid here.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

MAX_ANSWER_CHARS = 4000  # a longer answer is invalid: literal_eval on huge input is slow and deep
# Both patterns run in linear time on any text: the action's surrounding blanks are stripped in Python
# (a lazy group before `[ \t]*$` tried every split of a long blank run), and a fence's body is found
# with str.find (`(.*?)```` after a label retried the whole rest of the text for every shorter label).
_ACTION_LINE = re.compile(r"^[ \t]*Action:(.*)$", re.MULTILINE)
# A fence's opening after its ```: an optional language label, blanks, one optional newline.
_FENCE_HEAD = re.compile(r"([A-Za-z0-9_+-]*)[ \t]*\n?")
_FENCE = "```"
SQL_LABELS = ("", "sql", "sqlite", "mysql")  # fence labels read as SQL (lower-cased)
_FINAL_ANSWER = "Final Answer:"
_SCALARS = (str, int, float, type(None))

SYSTEM_PROMPT = """\
You are a database agent. I will ask you a question about a SQLite table, or ask you to change it. \
Work it out over several rounds: in each round, first explain briefly what you will do and why, then \
choose exactly one of two actions.

To run SQL, write:
Action: Operation
```sql
SELECT * FROM `table name` WHERE condition;
```
Put exactly one SQL statement in exactly one ```sql block. I will run it and reply with the raw \
result, a Python list of row tuples such as [('Paris', 3)], or with an error message. Quote table \
and column names that contain spaces or symbols with backticks or double quotes.

When you are sure of the result, write:
Action: Answer
Final Answer: ["ANSWER1", "ANSWER2", ...]
The final answer must be a list, even for a single value, and it must match the correct answer \
exactly. If you were asked to change the table, make the change with operations first, then \
answer with Final Answer: [] (the table itself is checked).

You have at most {max_rounds} rounds, counting the round with your answer. A reply that follows \
neither pattern wastes a round."""


@dataclass(frozen=True)
class Action:
    """One parsed agent turn: kind "operation" (sql), "answer" (answer) or "invalid" (reason)."""
    kind: str
    sql: str | None = None
    answer: list | None = None
    reason: str | None = None


# A worked episode put before the real one (`example_turns`): small models copy the format from it.
EXAMPLE_TURNS = (
    ("user", "How many players are older than 30?\nThe name of this table is team, and the headers of this "
             "table are name,age,club."),
    ("assistant", "I will count the rows with age above 30.\nAction: Operation\n```sql\n"
                  "SELECT COUNT(*) FROM `team` WHERE `age` > 30;\n```"),
    ("user", "[(4,)]"),
    ("assistant", "The query returned 4.\nAction: Answer\nFinal Answer: [4]"),
)


def example_turns() -> list[dict]:
    """The worked example as chat messages (a question, an operation, its result, the answer)."""
    return [{"role": role, "content": content} for role, content in EXAMPLE_TURNS]


def system_prompt(max_rounds: int) -> str:
    """The instructions for the system message (or the first user turn)."""
    return SYSTEM_PROMPT.format(max_rounds=max_rounds)


def render_task(task) -> str:
    """The first user message of an episode: the question (or change) and the table description,
    as AgentBench's DBBench writes them: description, newline, add_description."""
    return f"{task.description}\n{task.add_description}".strip()


def parse_action(text: str) -> Action:
    """Read one agent turn (see the module docstring). Never raises on model text."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    actions = [action.strip(" \t") for action in _ACTION_LINE.findall(text)]
    if not actions:
        return _invalid("no 'Action: Operation' or 'Action: Answer' line")
    if len(actions) > 1:
        return _invalid(f"{len(actions)} 'Action:' lines; write exactly one per turn")
    action = actions[0].lower()
    if action == "operation":
        return _operation(text)
    if action == "answer":
        return _answer(text)
    return _invalid(f"unknown action {actions[0][:40]!r}; use 'Operation' or 'Answer'")


def _operation(text: str) -> Action:
    blocks = [body for label, body in _fences(text) if label.lower() in SQL_LABELS]
    if not blocks:
        return _invalid("'Action: Operation' without a ```sql block")
    if len(blocks) > 1:
        return _invalid(f"{len(blocks)} ```sql blocks; write exactly one per turn")
    sql = blocks[0].strip()
    if not sql:
        return _invalid("the ```sql block is empty")
    return Action("operation", sql=sql)


def _fences(text: str) -> list[tuple[str, str]]:
    """Every fenced block as (label, body), in order: ``` and a label, then the body up to the next ```."""
    blocks, start = [], text.find(_FENCE)
    while start >= 0:
        head = _FENCE_HEAD.match(text, start + len(_FENCE))
        end = text.find(_FENCE, head.end())
        if end < 0:  # no closing fence: nothing after this one can close either
            break
        blocks.append((head.group(1), text[head.end():end]))
        start = text.find(_FENCE, end + len(_FENCE))
    return blocks


def _answer(text: str) -> Action:
    count = text.count(_FINAL_ANSWER)
    if count != 1:
        return _invalid("'Action: Answer' without a 'Final Answer:' line" if count == 0
                        else f"{count} 'Final Answer:' lines; write exactly one")
    rest = text.split(_FINAL_ANSWER, 1)[1].strip()
    if len(rest) > MAX_ANSWER_CHARS:
        return _invalid(f"the final answer is longer than {MAX_ANSWER_CHARS} characters")
    first_line = rest.split("\n", 1)[0].strip()
    for candidate in dict.fromkeys((first_line, rest)):  # a one-line list, else one over several lines
        value = _literal(candidate)
        if isinstance(value, list):
            if not all(isinstance(v, _SCALARS) and not isinstance(v, bool) for v in value):
                return _invalid("the final answer's items must be plain strings or numbers, not lists or dicts")
            return Action("answer", answer=value)
    return _invalid(f"the final answer {first_line[:60]!r} is not a list like [\"A\", \"B\"]")


def _literal(text: str):
    """A JSON or Python literal, or None when `text` is neither."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _invalid(reason: str) -> Action:
    return Action("invalid", reason=reason)
