"""Offline training data: preference pairs (DPO, reward models) and supervised rows (SFT), in the
formats TRL users already have, checked row by row with `where: what is wrong` errors.

    pairs = read_preference("pairs.jsonl")        # a JSONL file (.jsonl.gz too)
    pairs = read_preference(dataset)              # or rows: a datasets.Dataset, a list of dicts
    trl_preference(preference_row(row))           # one row read the same way, written back as TRL's JSON row
    rows = read_sft("sft.jsonl")
    counter = TruncationCounter()
    prompt_ids, response_ids = counter.truncate(prompt_ids, response_ids, max_len=1024)
    print(counter)                                # "3 of 500 rows truncated (0.6%)"

Preference rows, standard (strings) or conversational (lists of {"role", "content"} messages):
    {"prompt", "chosen", "rejected"}      explicit prompt; conversational replies are assistant messages
    {"messages", "chosen", "rejected"}    the prompt as a conversation
    {"chosen", "rejected"}                implicit prompt: the two share their beginning, which is the prompt
                                          (Anthropic HH-RLHF's "\\n\\nHuman: ... \\n\\nAssistant: ..." dialogues
                                          become conversational rows: the shared turns, then each side's reply)
Any of them may carry "margin", a number (TRL's reward-model data: the reward trainer's Bradley–Terry
loss wants the chosen reward ahead by at least that much); the DPO trainer ignores it.
Any row but a {"text"} one (no template) may carry "chat_template_kwargs": the row's own keyword arguments
for the chat template (e.g. {"enable_thinking": false}), as TRL's DPO, reward and SFT trainers read them,
over the run's model.chat_template_kwargs; an entry a datasets.Dataset fills with None counts as absent.
SFT rows:
    {"prompt", "completion" | "response"} strings, or prompt messages + completion assistant messages
    {"messages"}, {"conversations"}       a conversation (ShareGPT's {"from", "value"} turns too)
    {"text"}                              language modelling: the loss on every token
Rows whose columns have other names are read through `Columns` (the config's data.prompt_key,
data.response_key, data.messages_key, data.chosen_key, data.rejected_key, data.text_field; a dotted
name reaches into a nested object):
    read_preference("pairs.jsonl", columns=Columns(prompt="question", chosen="better", rejected="worse"))

Errors name `path:line` for a file and `row i` (0-based, as `dataset[i]`) for rows handed in, then the
field. Every row becomes a row or an error; none is dropped. Over-long rows are cut when encoded,
never dropped, and every cut is counted so the caller can report it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Sequence, Union

from ..common.chat import template_kwargs_problem
from ..common.data import ABSENT, DataError, iter_file_rows, value_at

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system",
                  "user": "user", "assistant": "assistant", "tool": "tool"}
HH_ASSISTANT = "\n\nAssistant:"  # where an assistant turn starts in HH-RLHF's dialogue text
DIALOGUES = ("auto", "hh", "text")
_HH_TURN = re.compile(r"(?:\A|\n\n)(Human|Assistant):")

Source = Union[str, os.PathLike, Iterable[Mapping]]  # a JSONL or parquet path, or the rows themselves


@dataclass(frozen=True)
class Columns:
    """Where a row holds its fields: a column's name, or a dotted path into nested objects (`answer.text`).
    The defaults are TRL's names; a name set away from its default is said with its config key in errors."""
    prompt: str = "prompt"      # data.prompt_key: SFT's prompt/response rows, a pair's explicit prompt
    response: str = "response"  # data.response_key: SFT's response (with the default, TRL's "completion" too)
    messages: str = "messages"  # data.messages_key: SFT's conversation, or a pair's prompt as a conversation
    chosen: str = "chosen"      # data.chosen_key: a pair's preferred reply
    rejected: str = "rejected"  # data.rejected_key: a pair's dispreferred reply
    text: str = "text"          # data.text_field: SFT's language-modelling text

    @classmethod
    def of(cls, data) -> "Columns":
        """The columns a config's data section names."""
        return cls(data.prompt_key, data.response_key, data.messages_key, data.chosen_key, data.rejected_key,
                   data.text_field)

    def named(self, field_name: str) -> str:
        """A column as errors show it: 'question' (data.prompt_key) where the config renamed it."""
        column = getattr(self, field_name)
        if column == getattr(COLUMNS, field_name):
            return repr(column)
        return f"{column!r} (data.{'text_field' if field_name == 'text' else field_name + '_key'})"


COLUMNS = Columns()


@dataclass(frozen=True)
class PreferenceRow:
    prompt: str | list[dict]    # a string, or the conversation so far as {"role", "content"} messages
    chosen: str | list[dict]    # the preferred reply: a string, or messages starting with the assistant's
    rejected: str | list[dict]  # the dispreferred reply, in the same form as chosen
    margin: float | None = None  # how far the chosen reply's reward should beat the rejected's (TRL's reward data)
    chat_template_kwargs: dict = field(default_factory=dict)  # the row's own chat template arguments
    source: str = field(default="", compare=False, repr=False)  # "path:line" or "row i", for later errors


@dataclass(frozen=True)
class SFTRow:
    """One supervised example as a conversation; the loss goes on the assistant turns.

    A {"prompt", "response" | "completion"} row of strings becomes [user: prompt, assistant: response]
    with chat=False: plain text, to be joined without a chat template. Conversation rows have
    chat=True. A {"text"} row has `text` set and no messages: the loss covers all of it."""
    messages: list[dict]  # {"role", "content"}; roles system, user, assistant, tool
    chat: bool            # False: a plain prompt/response pair (or text), not a chat
    text: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)  # the row's own chat template arguments
    source: str = field(default="", compare=False, repr=False)
    # a conversational prompt/completion row: how many of `messages` are its prompt (0: a conversation)
    prompt_turns: int = field(default=0, compare=False, repr=False)


class _Bad(Exception):
    """A problem with one row's fields; the reader puts the row's location in front."""


def read_preference(source: Source, *, dialogue: str = "auto", columns: Columns = COLUMNS) -> list[PreferenceRow]:
    """Preference pairs from a JSONL (.jsonl, .jsonl.gz) or parquet file or from rows (a `datasets.Dataset`,
    a list of dicts). Row forms: see the module docstring; `columns` names their fields (a prompt
    column named away from "prompt" must be in every row, unless the row has the messages column).

    An implicit prompt is the longest beginning the two sides share, cut back so that it ends where the
    replies start: for message lists, the shared leading messages, fewer if needed so that both sides
    go on with an assistant message; for text, up to and including the last shared "\\n\\nAssistant:",
    else cut back to a word boundary (a shared trailing space goes with the replies, as in TRL's
    `extract_prompt`, which does not look for words or turns). `dialogue` says what to do
    with HH-RLHF text: "auto" makes conversational rows of pairs whose two sides both start with
    "\\n\\nHuman:", "hh" requires every implicit pair to be such a dialogue, "text" keeps them text.

    Refused, naming the row and the field: a missing chosen/rejected; a value that is neither a string
    nor a list of messages; an empty prompt, chosen or rejected (a reply cut from a dialogue may be
    empty: HH-RLHF prefers silence to some requests); chosen and rejected in different forms; both
    prompt and messages; a conversational reply that does not start with an assistant message or does
    not end with one; a pair with no shared beginning; chosen identical to rejected."""
    if dialogue not in DIALOGUES:
        raise ValueError(f"dialogue must be one of {', '.join(DIALOGUES)}, got {dialogue!r}")
    return [_located(where, _preference_row, row, dialogue, columns) for where, row in iter_rows(source)]


def read_sft(source: Source, *, text_field: str | None = None, columns: Columns = COLUMNS) -> list[SFTRow]:
    """SFT rows from a JSONL (.jsonl, .jsonl.gz) or parquet file or from rows (a `datasets.Dataset`, a list of
    dicts): {"prompt", "response" | "completion"} as strings, or as prompt messages and completion
    assistant messages (the loss on the completion only); {"messages": [...]}; {"conversations": [...]}
    whose turns are {"role", "content"} or ShareGPT's {"from", "value"} (human → user, gpt →
    assistant, system); {"text"}, or the column `text_field` names (TRL's dataset_text_field: the loss
    on every token). A turn may say `"training": false` (as in axolotl): an assistant turn that is
    context, not loss (a worked example). A conversation needs an assistant turn to train on; a prompt,
    response, text or assistant turn must not be empty. `columns` names the fields (`text_field`, when
    given, the text's)."""
    columns = columns if text_field is None else replace(columns, text=text_field)
    return [_located(where, _sft_row, row, columns) for where, row in iter_rows(source)]


def preference_row(row: Mapping, *, dialogue: str = "auto", columns: Columns = COLUMNS) -> PreferenceRow:
    """One preference row as `read_preference` reads it (None values count as absent keys); a row that
    cannot be used is a DataError saying what is wrong, for the caller to put its location in front."""
    if dialogue not in DIALOGUES:
        raise ValueError(f"dialogue must be one of {', '.join(DIALOGUES)}, got {dialogue!r}")
    try:
        return _preference_row({k: v for k, v in row.items() if v is not None}, dialogue, columns)
    except _Bad as e:
        raise DataError(str(e)) from None


def trl_preference(pair: PreferenceRow) -> dict:
    """A pair as the JSON row TRL reads: {"prompt", "chosen", "rejected"} as strings (standard), or, when
    the prompt is a conversation, as message lists (conversational: each reply a list of assistant
    messages; a reply given as text becomes one such message); "margin" and "chat_template_kwargs" when
    the pair has them."""
    chosen, rejected = pair.chosen, pair.rejected
    if isinstance(pair.prompt, list) and isinstance(chosen, str):
        chosen, rejected = ([{"role": "assistant", "content": reply}] for reply in (chosen, rejected))
    row = {"prompt": pair.prompt, "chosen": chosen, "rejected": rejected}
    if pair.chat_template_kwargs:
        row["chat_template_kwargs"] = pair.chat_template_kwargs
    return row if pair.margin is None else {**row, "margin": pair.margin}


def iter_rows(source: Source) -> Iterator[tuple[str, dict]]:
    """(where, row) for each row: `path:line` for a JSONL file (gzip-compressed when it starts with
    gzip's magic bytes; blank lines skipped), `path:row N` for a parquet file (`common.data.iter_file_rows`),
    `row i` for rows handed in, where a None value (a column a datasets.Dataset row does not fill, a null
    parquet cell) counts as an absent key."""
    if isinstance(source, (str, os.PathLike)):
        yield from iter_file_rows(source)
        return
    if isinstance(source, Mapping):
        hint = "; pass one split, e.g. data['train']" if "train" in source else ""
        raise DataError(f"expected rows (a datasets.Dataset or a list of dicts), got a {type(source).__name__} "
                        f"with keys {', '.join(map(repr, list(source)[:5]))}{hint}")
    count = 0
    for i, row in enumerate(source):
        if not isinstance(row, Mapping):
            raise DataError(f"row {i}: expected a dict of fields, got a {type(row).__name__}")
        count += 1
        yield f"row {i}", {k: v for k, v in row.items() if v is not None}
    if not count:
        raise DataError("no rows were given (the data set is empty)")


def hh_messages(text: str) -> list[dict]:
    """HH-RLHF dialogue text as {"role", "content"} messages (Human → user, Assistant → assistant),
    each turn's text stripped."""
    parts = _HH_TURN.split(text.lstrip())
    if len(parts) < 3 or parts[0].strip():
        raise DataError(f"not a 'Human: ... Assistant: ...' dialogue: {_preview(text)}")
    return [{"role": "user" if speaker == "Human" else "assistant", "content": said.strip()}
            for speaker, said in zip(parts[1::2], parts[2::2])]


# ------------------------------------------------------------------------------------ preference rows

def _preference_row(row: dict, dialogue: str, c: Columns = COLUMNS) -> PreferenceRow:
    missing = [c.named(side) for side in ("chosen", "rejected") if value_at(row, getattr(c, side)) is ABSENT]
    if missing:
        raise _Bad(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)} {_keys(row)}")
    has_prompt = value_at(row, c.prompt) is not ABSENT
    has_messages = c.messages != c.prompt and value_at(row, c.messages) is not ABSENT
    if has_prompt and has_messages:
        raise _Bad(f"the row has both {c.prompt!r} and {c.messages!r}; keep one (the prompt)")
    if not has_prompt and not has_messages and c.prompt != COLUMNS.prompt:  # a renamed prompt column is meant
        raise _Bad(f"missing key {c.named('prompt')} {_keys(row)}")
    chosen = _text_or_messages(value_at(row, c.chosen), c.chosen)
    rejected = _text_or_messages(value_at(row, c.rejected), c.rejected)
    if isinstance(chosen, list) != isinstance(rejected, list):
        raise _Bad(f"{c.chosen!r} is {_form(chosen)} but {c.rejected!r} is {_form(rejected)}; give both the same way")
    prompt_key = c.prompt if has_prompt else c.messages if has_messages else None
    if prompt_key is None:
        prompt, chosen, rejected = _implicit_prompt(chosen, rejected, dialogue, c)
    else:
        value = value_at(row, prompt_key)
        if has_messages and not isinstance(value, list):
            raise _Bad(f"{prompt_key!r} must be a list of {{role, content}} messages, got {_describe(value)}")
        prompt = _text_or_messages(value, prompt_key)
        if isinstance(chosen, list):
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            chosen, rejected = _after_prompt(prompt, chosen), _after_prompt(prompt, rejected)
    if isinstance(prompt, list) and not any(m["content"].strip() for m in prompt):
        raise _Bad(f"{prompt_key or c.prompt!r} is empty (every message's content is blank)")
    if isinstance(chosen, list):
        for key, reply in ((c.chosen, chosen), (c.rejected, rejected)):
            _check_reply(reply, key)
    if _comparable(chosen) == _comparable(rejected):
        raise _Bad(f"{c.chosen!r} and {c.rejected!r} are the same text ({_preview(chosen)}); a pair must differ to "
                   f"say which is preferred")
    return PreferenceRow(prompt, chosen, rejected, _margin(row.get("margin")), _template_kwargs(row))


def _margin(value) -> float | None:
    """The optional `margin` column: a finite number, or null / absent for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Bad(f"'margin' must be a finite number (how much the chosen reply's reward should exceed the "
                   f"rejected one's), got {_describe(value)}")
    return float(value)


def _template_kwargs(row: dict) -> dict:
    """The optional `chat_template_kwargs` column: the row's own chat template arguments."""
    value = row.get("chat_template_kwargs", {})
    problem = template_kwargs_problem(value)
    if problem:
        raise _Bad(f"'chat_template_kwargs' {problem}")
    return {k: v for k, v in value.items() if v is not None}


def _text_or_messages(value, key: str) -> str | list[dict]:
    """A non-empty string, or a list of messages (see `_conversation`)."""
    if isinstance(value, str):
        if not value.strip():
            raise _Bad(f"{key!r} is empty")
        return value
    if isinstance(value, list):
        return _conversation(value, key)
    raise _Bad(f"{key!r} must be a string or a list of {{role, content}} messages, got {_describe(value)}")


def _implicit_prompt(chosen, rejected, dialogue: str, c: Columns = COLUMNS):
    """(prompt, chosen, rejected) from two sides that share their beginning; `c` names them in errors."""
    if isinstance(chosen, list):
        return _split_messages(chosen, rejected, c)
    if dialogue == "hh" or (dialogue == "auto" and _is_hh(chosen) and _is_hh(rejected)):
        return _hh_split(chosen, rejected, c)
    return _split_text(chosen, rejected, c)


def _split_messages(chosen: list[dict], rejected: list[dict], c: Columns = COLUMNS):
    """The shared leading messages are the prompt, cut back until both sides go on with an assistant
    message (the reply starts there)."""
    k = 0
    while k < min(len(chosen), len(rejected)) and _comparable([chosen[k]]) == _comparable([rejected[k]]):
        k += 1
    while k > 0 and not (k < len(chosen) and k < len(rejected) and
                         chosen[k]["role"] == rejected[k]["role"] == "assistant"):
        k -= 1
    if k == 0:
        raise _Bad(f"{c.chosen!r} and {c.rejected!r} share no leading messages before an assistant reply, so there is "
                   f"no prompt; give a {c.prompt!r}, or both whole conversations from the start")
    return chosen[:k], chosen[k:], rejected[k:]


def _split_text(chosen: str, rejected: str, c: Columns = COLUMNS):
    """The shared beginning is the prompt: up to and including its last "\\n\\nAssistant:" when it has
    one, else cut back to a word boundary (the prompt never ends inside a word unless it has no
    whitespace at all, e.g. Chinese), with a trailing space given to the replies."""
    shared = os.path.commonprefix([chosen, rejected])
    turn = shared.rfind(HH_ASSISTANT)
    if turn >= 0:  # a dialogue: the prompt ends where the assistant's reply starts
        cut = turn + len(HH_ASSISTANT)
        return chosen[:cut], chosen[cut:], rejected[cut:]
    cut = len(shared)
    inside_word = cut > 0 and not shared[-1].isspace() and any(
        len(side) == cut or not side[cut].isspace() for side in (chosen, rejected))
    if inside_word:
        space = max((i for i, ch in enumerate(shared) if ch.isspace()), default=-1)
        cut = space if space > 0 else cut
    if cut > 0 and chosen[cut - 1] == " ":
        cut -= 1
    if not chosen[:cut].strip():
        raise _Bad(f"{c.chosen!r} and {c.rejected!r} share no beginning, so there is no prompt (they start "
                   f"{_preview(chosen[:20])} and {_preview(rejected[:20])}); give a {c.prompt!r}")
    for key, side in ((c.chosen, chosen), (c.rejected, rejected)):
        if not side[cut:].strip():
            raise _Bad(f"{key!r} has nothing after the prompt it shares with the other side ({_preview(side)})")
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _is_hh(text: str) -> bool:
    return text.lstrip().startswith("Human:") and HH_ASSISTANT in text


def _hh_split(chosen: str, rejected: str, c: Columns = COLUMNS):
    """(prompt, chosen, rejected) of an HH-RLHF pair as conversational messages: the prompt is the shared
    text up to its last "\\n\\nAssistant:" as user / assistant messages; each reply is the rest of its side
    (stripped) as one assistant message, so a side that goes on for more turns keeps them in its one
    reply, as TRL's HH script does."""
    for key, side in ((c.chosen, chosen), (c.rejected, rejected)):
        if not _is_hh(side):
            raise _Bad(f"{key!r} is not a '\\n\\nHuman: ... \\n\\nAssistant: ...' dialogue (it starts "
                       f"{_preview(side[:30])})")
    shared = os.path.commonprefix([chosen, rejected])
    turn = shared.rfind(HH_ASSISTANT)
    if turn < 0:
        raise _Bad(f"{c.chosen!r} and {c.rejected!r} share no turns up to an '\\n\\nAssistant:' reply, so there is "
                   f"no prompt")
    try:
        prompt = hh_messages(chosen[:turn])
    except DataError as e:
        raise _Bad(f"{c.chosen!r}: {e}") from None
    start = turn + len(HH_ASSISTANT)
    return prompt, [{"role": "assistant", "content": chosen[start:].strip()}], \
        [{"role": "assistant", "content": rejected[start:].strip()}]


def _after_prompt(prompt: list[dict], reply: list[dict]) -> list[dict]:
    """The reply without a copy of the prompt in front (some sets, e.g. UltraFeedback, repeat it)."""
    n = len(prompt)
    if len(reply) > n and _comparable(reply[:n]) == _comparable(prompt):
        return reply[n:]
    return reply


def _check_reply(reply: list[dict], key: str) -> None:
    if reply[0]["role"] != "assistant":
        raise _Bad(f"{key!r} must start with the assistant's reply, got a {reply[0]['role']!r} message first")
    if reply[-1]["role"] != "assistant":
        raise _Bad(f"{key!r} must end with an assistant message, got a {reply[-1]['role']!r} message last")


def _comparable(value) -> object:
    """What two replies are compared on: stripped text, or (role, stripped content) per message."""
    if isinstance(value, str):
        return value.strip()
    return [(m["role"], m["content"].strip()) for m in value]


# ------------------------------------------------------------------------------------------- SFT rows

def _sft_forms(c: Columns) -> str:
    """The SFT row forms under `c`'s names, for the error of a row that has none."""
    answers = [c.named("response")] + (["'completion'"] if c.response == COLUMNS.response else [])
    return " | ".join([f"{c.named('prompt')} + {answer}" for answer in answers]
                      + [c.named("messages"), "'conversations'", c.named("text")])


def _sft_row(row: dict, c: Columns = COLUMNS) -> SFTRow:
    present = [k for k in dict.fromkeys((c.prompt, c.messages, "conversations", c.text))
               if value_at(row, k) is not ABSENT]
    # TRL names the reply "completion"; with the default response column a row may use either name
    answers = [k for k in ((c.response, "completion") if c.response == COLUMNS.response else (c.response,))
               if value_at(row, k) is not ABSENT]
    if present == [c.prompt] and not answers and c.response != COLUMNS.response:  # a renamed column is meant
        raise _Bad(f"missing key {c.named('response')} {_keys(row)}")
    if not present or (present == [c.prompt] and not answers):
        raise _Bad(f"needs one of {_sft_forms(c)} {_keys(row)}")
    if len(present) > 1:
        raise _Bad(f"the row has {' and '.join(map(repr, present))}; keep one format")
    key = present[0]
    value = value_at(row, key)
    if key == c.text:
        if not isinstance(value, str):
            raise _Bad(f"{key!r} must be a string, got {_describe(value)}")
        if not value.strip():
            raise _Bad(f"{key!r} is empty")
        return SFTRow([], chat=False, text=value)
    if key == c.prompt:
        if len(answers) > 1:
            raise _Bad(f"the row has both {answers[0]!r} and {answers[1]!r}; keep one")
        answer_key = answers[0]
        prompt, answer = _text_or_messages(value, key), _text_or_messages(value_at(row, answer_key), answer_key)
        if isinstance(prompt, str) and isinstance(answer, str):
            return SFTRow([{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}], chat=False,
                          chat_template_kwargs=_template_kwargs(row))
        # conversational: the prompt (a string becomes one user message) is context, the completion is the loss
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        answer = [{"role": "assistant", "content": answer}] if isinstance(answer, str) else \
            _after_prompt(prompt, answer)
        _check_reply(answer, answer_key)
        context = [{**m, "training": False} if m["role"] == "assistant" else m for m in prompt]
        messages = context + answer
        key = answer_key
        prompt_turns = len(context)
    else:
        messages, prompt_turns = _conversation(value, key), 0
    if not any(m["role"] == "assistant" for m in messages):
        raise _Bad(f"{key!r} has no assistant turn, so there is nothing to learn")
    if not any(m["role"] == "assistant" and m.get("training", True) for m in messages):
        raise _Bad(f"every assistant turn of {key!r} is \"training\": false, so there is nothing to learn")
    return SFTRow(messages, chat=True, chat_template_kwargs=_template_kwargs(row), prompt_turns=prompt_turns)


def _conversation(turns, key: str) -> list[dict]:
    """{"role", "content"} messages from role/content or ShareGPT from/value turns."""
    if not isinstance(turns, list) or not turns:
        raise _Bad(f"{key!r} must be a non-empty list of turns, got {_preview(turns)}")
    messages = []
    for i, turn in enumerate(turns):
        where = f"{key!r}[{i}]"
        if isinstance(turn, Mapping) and isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str):
            if turn["from"] not in SHAREGPT_ROLES:
                raise _Bad(f"{where} 'from' is {turn['from']!r}; ShareGPT speakers are "
                           f"{', '.join(map(repr, SHAREGPT_ROLES))}")
            role, content = SHAREGPT_ROLES[turn["from"]], turn["value"]
        elif isinstance(turn, Mapping) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str):
            role, content = turn["role"], turn["content"]
            if role not in ("system", "user", "assistant", "tool"):
                raise _Bad(f"{where} 'role' is {role!r}; use system, user, assistant or tool")
        else:
            raise _Bad(f"{where} must be an object with string 'role' and 'content' "
                       f"(or ShareGPT 'from' and 'value'), got {_preview(turn)}")
        if role == "assistant" and not content.strip():
            raise _Bad(f"{where} is an empty assistant turn")
        message = {"role": role, "content": content}
        training = turn.get("training")  # None: absent (a datasets.Dataset fills missing struct fields with None)
        if training is not None:
            if not isinstance(training, bool):
                raise _Bad(f"{where} 'training' must be true or false, got {_preview(training)}")
            if not training:
                message["training"] = False
        messages.append(message)
    return messages


# ---------------------------------------------------------------------------------------- truncation

def truncate_pair(prompt_ids: Sequence[int], response_ids: Sequence[int],
                  max_len: int) -> tuple[list[int], list[int], bool]:
    """Cut prompt + response to at most max_len tokens: first drop the prompt's oldest tokens (its
    left end; the text next to the response matters most), then, if the response alone is still
    too long, its end, so the response's start is always kept. Returns (prompt_ids, response_ids,
    truncated); an over-long response leaves an empty prompt."""
    if max_len < 1:
        raise ValueError(f"truncate_pair: max_len must be at least 1, got {max_len}")
    prompt_ids, response_ids = list(prompt_ids), list(response_ids)
    excess = len(prompt_ids) + len(response_ids) - max_len
    if excess <= 0:
        return prompt_ids, response_ids, False
    cut_prompt = min(excess, len(prompt_ids))
    prompt_ids = prompt_ids[cut_prompt:]
    response_ids = response_ids[:max_len - len(prompt_ids)]
    return prompt_ids, response_ids, True


@dataclass
class TruncationCounter:
    """Counts rows seen and rows truncated, so a run can say how much of its data was cut."""
    rows: int = 0
    truncated: int = 0

    def truncate(self, prompt_ids: Sequence[int], response_ids: Sequence[int],
                 max_len: int) -> tuple[list[int], list[int]]:
        """`truncate_pair`, counted."""
        prompt_ids, response_ids, cut = truncate_pair(prompt_ids, response_ids, max_len)
        self.rows += 1
        self.truncated += cut
        return prompt_ids, response_ids

    @property
    def fraction(self) -> float:
        return self.truncated / self.rows if self.rows else 0.0

    def __str__(self) -> str:
        return f"{self.truncated} of {self.rows} rows truncated ({100 * self.fraction:.1f}%)"


# -------------------------------------------------------------------------------------------- reading

def _located(where: str, parse, *args):
    """parse(*args), its problems as `where: ...` errors and its row marked with where it came from."""
    try:
        return replace(parse(*args), source=where)
    except _Bad as e:
        raise DataError(f"{where}: {e}") from None


def _keys(row: dict) -> str:
    return f"(the row has keys: {', '.join(map(repr, row)) or 'none'})"


def _form(value) -> str:
    return "a list of messages" if isinstance(value, list) else "a string"


def _describe(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number"}
    kind = "null" if value is None else names.get(type(value), f"a {type(value).__name__}")
    return f"{kind} ({_preview(value)})" if isinstance(value, (int, float)) and not isinstance(value, bool) else kind


def _preview(value) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except TypeError:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
