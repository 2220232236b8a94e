"""Offline training data: preference pairs (DPO, reward models) and supervised rows (SFT), in the
JSONL formats TRL users already have, checked row by row with `path:line: what is wrong` errors.

    pairs = read_preference("pairs.jsonl")   # {"prompt", "chosen", "rejected"}
    rows = read_sft("sft.jsonl")             # {"prompt", "response" | "completion"}, {"messages"}, {"conversations"}
    counter = TruncationCounter()
    prompt_ids, response_ids = counter.truncate(prompt_ids, response_ids, max_len=1024)
    print(counter)                           # "3 of 500 rows truncated (0.6%)"

Over-long rows are cut, never dropped, and every cut is counted so the caller can report it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

from ..data import DataError, read_jsonl

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system",
                  "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass(frozen=True)
class PreferenceRow:
    prompt: str | list[dict]  # a string, or the conversation so far as {"role", "content"} messages
    chosen: str               # the preferred response
    rejected: str             # the dispreferred response


@dataclass(frozen=True)
class SFTRow:
    """One supervised example as a conversation; the loss goes on the assistant turns.

    A {"prompt", "response" | "completion"} row becomes [user: prompt, assistant: response] with
    chat=False: plain text, to be joined without a chat template. Conversation rows have chat=True."""
    messages: list[dict]  # {"role", "content"}; roles system, user, assistant, tool
    chat: bool            # False: a plain prompt/response pair, not a chat


def read_preference(path: str | os.PathLike) -> list[PreferenceRow]:
    """Rows {"prompt": str, "chosen": str, "rejected": str}, or {"messages": [...], "chosen", "rejected"}
    with the prompt as a conversation. Refused, naming path:line and the field: a missing or non-string
    chosen/rejected, an empty (or all-whitespace) prompt, chosen or rejected, both prompt and messages,
    and chosen identical to rejected (up to surrounding whitespace), which teaches nothing."""
    rows = read_jsonl(path, ["chosen", "rejected"], alternatives=[["prompt"], ["messages"]])
    pairs = []
    for line, row in zip(_row_lines(path), rows):
        where = f"{path}:{line}"
        if "prompt" in row and "messages" in row:
            raise DataError(f"{where}: the row has both 'prompt' and 'messages'; keep one (the prompt)")
        for key in ("prompt", "chosen", "rejected"):
            if key in row and not row[key].strip():
                raise DataError(f"{where}: {key!r} is empty")
        if row["chosen"].strip() == row["rejected"].strip():
            raise DataError(f"{where}: 'chosen' and 'rejected' are the same text ({_preview(row['chosen'])}); "
                            f"a pair must differ to say which is preferred")
        pairs.append(PreferenceRow(row.get("prompt", row.get("messages")), row["chosen"], row["rejected"]))
    return pairs


def read_sft(path: str | os.PathLike) -> list[SFTRow]:
    """Rows {"prompt", "response"} or {"prompt", "completion"} (strings), or a conversation:
    {"messages": [{"role", "content"}, ...]}, or {"conversations": [...]} whose turns are
    {"role", "content"} or ShareGPT's {"from", "value"} (human → user, gpt → assistant, system).
    A turn may say `"training": false` (as in axolotl): an assistant turn that is context, not loss
    (a worked example). A conversation needs an assistant turn to train on; a prompt, response or
    assistant turn must not be empty."""
    rows = read_jsonl(path, alternatives=[["prompt", "response"], ["prompt", "completion"],
                                          ["messages"], ["conversations"]])
    out = []
    for line, row in zip(_row_lines(path), rows):
        where = f"{path}:{line}"
        present = [k for k in ("prompt", "messages", "conversations") if k in row]
        if len(present) > 1:
            raise DataError(f"{where}: the row has {' and '.join(map(repr, present))}; keep one format")
        if "prompt" in row:
            answer_key = "response" if "response" in row else "completion"
            if "response" in row and "completion" in row:
                raise DataError(f"{where}: the row has both 'response' and 'completion'; keep one")
            for key in ("prompt", answer_key):
                if not isinstance(row[key], str):
                    raise DataError(f"{where}: {key!r} must be a string, got {_preview(row[key])}")
                if not row[key].strip():
                    raise DataError(f"{where}: {key!r} is empty")
            messages = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row[answer_key]}]
            out.append(SFTRow(messages, chat=False))
            continue
        key = present[0]
        messages = _conversation(row[key], key, where)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: {key!r} has no assistant turn, so there is nothing to learn")
        if not any(m["role"] == "assistant" and m.get("training", True) for m in messages):
            raise DataError(f"{where}: every assistant turn of {key!r} is \"training\": false, so there is "
                            f"nothing to learn")
        out.append(SFTRow(messages, chat=True))
    return out


def _conversation(turns, key: str, where: str) -> list[dict]:
    """{"role", "content"} messages from role/content or ShareGPT from/value turns."""
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: {key!r} must be a non-empty list of turns, got {_preview(turns)}")
    messages = []
    for i, turn in enumerate(turns):
        field = f"{key!r}[{i}]"
        if isinstance(turn, dict) and isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str):
            if turn["from"] not in SHAREGPT_ROLES:
                raise DataError(f"{where}: {field} 'from' is {turn['from']!r}; ShareGPT speakers are "
                                f"{', '.join(map(repr, SHAREGPT_ROLES))}")
            role, content = SHAREGPT_ROLES[turn["from"]], turn["value"]
        elif isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str):
            role, content = turn["role"], turn["content"]
            if role not in ("system", "user", "assistant", "tool"):
                raise DataError(f"{where}: {field} 'role' is {role!r}; use system, user, assistant or tool")
        else:
            raise DataError(f"{where}: {field} must be an object with string 'role' and 'content' "
                            f"(or ShareGPT 'from' and 'value'), got {_preview(turn)}")
        if role == "assistant" and not content.strip():
            raise DataError(f"{where}: {field} is an empty assistant turn")
        message = {"role": role, "content": content}
        if "training" in turn:
            if not isinstance(turn["training"], bool):
                raise DataError(f"{where}: {field} 'training' must be true or false, got {_preview(turn['training'])}")
            if not turn["training"]:
                message["training"] = False
        messages.append(message)
    return messages


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


def _row_lines(path: str | os.PathLike) -> list[int]:
    """The line numbers of the rows `read_jsonl` returned: its non-blank lines, in order (it has
    already checked that each is a JSON object)."""
    with open(path, "rb") as f:
        return [n for n, raw in enumerate(f, 1) if raw.decode("utf-8").strip()]


def _preview(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
