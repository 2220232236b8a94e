"""Public data sets converted to the JSONL files lmrl trains on: preference pairs (DPO, reward models)
and prompt/response rows or conversations (SFT).

    prepare(["hh-rlhf", "belle"], "data")                        # from the Hugging Face hub
    prepare(["hh-rlhf"], "data", from_path="raw/hh-rlhf")        # from local .jsonl/.json/.parquet files
    prepare([], "data", hf=["trl-lib/ultrafeedback_binarized"])  # any data set whose columns say its format

    lmrl prepare-data --datasets hh-rlhf belle --max-samples 5000 --output-dir data

Each data set becomes `<output_dir>/<name>.jsonl`, re-read with read_preference / read_sft once
written, so a file written here is one training can load. A row that cannot be converted (chosen
identical to rejected, an empty reply, ...) is skipped and counted by reason, never silently lost.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ..data import DataError, write_jsonl
from .preference_data import SHAREGPT_ROLES, read_preference, read_sft

# name: (hub id, format). Formats are told apart by their columns, see FORMATS.
NAMED = {
    "hh-rlhf": ("Anthropic/hh-rlhf", "transcripts"),
    "belle": ("BelleGroup/train_0.5M_CN", "instruction"),
    "alpaca-chinese": ("shibing624/alpaca-zh", "instruction"),
}
# format: (columns it needs, kind of rows it becomes); detection tries them in this order.
FORMATS = {
    "pairs": (("prompt", "chosen", "rejected"), "preference"),
    "transcripts": (("chosen", "rejected"), "preference"),  # whole dialogues, e.g. hh-rlhf's "\n\nHuman: ..."
    "conversation": (("messages|conversations",), "sft"),
    "instruction": (("instruction", "output"), "sft"),      # alpaca style; "input" is optional
    "completion": (("prompt", "completion|response"), "sft"),
}
SOURCE_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz", ".json.gz")
_SPLIT_NAME = re.compile(r"(train|test|validation|valid|dev|eval)(?![a-z])")
_HH_TURN = re.compile(r"(?:\A|\n\n)(Human|Assistant):")


@dataclass(frozen=True)
class PreparedFile:
    """One written file and what went into it."""
    path: Path
    kind: str           # "preference" or "sft"
    rows_written: int
    rows_skipped: int   # rows read but not convertible; skipped_because says why
    skipped_because: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        line = f"wrote {self.path}: {self.rows_written} {self.kind} rows"
        if not self.rows_skipped:
            return line + ", none skipped"
        return line + f", {self.rows_skipped} skipped ({_reasons(self.skipped_because)})"


class _Skip(Exception):
    """A row that cannot be converted; the message says why, and rows are counted by it."""


def detect_format(columns: Iterable[str]) -> str | None:
    """The first of FORMATS whose columns are all present ("a|b": either), or None."""
    cols = set(columns)
    for name, (needs, _) in FORMATS.items():
        if all(any(c in cols for c in need.split("|")) for need in needs):
            return name
    return None


def prepare(datasets: Sequence[str], output_dir: str | Path, *, hf: Sequence[str] = (),
            from_path: str | Path | None = None, max_samples: int | None = None,
            split: str = "train") -> list[PreparedFile]:
    """Convert the named `datasets` (keys of NAMED) and the hub data sets `hf` to
    `<output_dir>/<name>.jsonl`. With `from_path`, read local files instead of the hub: for one data
    set, a file or a directory of them; for several, a directory holding `<name>/` or `<name>.jsonl`
    (.json, .parquet) for each. `max_samples` keeps the first N converted rows of each."""
    unknown = [d for d in datasets if d not in NAMED]
    if unknown:
        raise DataError(f"unknown data set {', '.join(map(repr, unknown))}; choose from {', '.join(NAMED)} "
                        f"or name any hub data set with --hf")
    jobs = [(d, *NAMED[d]) for d in datasets] + [(h, h, None) for h in hf]
    if not jobs:
        raise DataError(f"name at least one data set: --datasets {' '.join(NAMED)}, or --hf NAME")
    if max_samples is not None and max_samples < 1:
        raise DataError(f"--max-samples must be at least 1, got {max_samples}")
    names = [_short(name) for name, _, _ in jobs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"two data sets would both be written to {', '.join(f'{n}.jsonl' for n in twice)}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Every local source is found before anything is written, so a typo fails fast.
    files = {name: _local_files(Path(from_path), name, len(jobs) > 1, split)
             for name, _, _ in jobs} if from_path is not None else {}
    results = []
    for name, hub_id, fmt in jobs:
        if from_path is not None:
            where = str(from_path)
            rows = [r for f in files[name] for r in _read_local(f)]
            columns = list(dict.fromkeys(k for r in rows for k in r))
        else:
            where = hub_id
            rows = _load_hub(hub_id, split)
            columns = list(rows.column_names)
        fmt = _check_format(name, where, columns, fmt)
        kind = FORMATS[fmt][1]
        converted, skipped = _convert(rows, fmt, max_samples)
        if not converted:
            raise DataError(f"{where}: no row of {name} could be converted "
                            f"({sum(skipped.values())} skipped: {_reasons(skipped) or 'no rows'})")
        path = write_jsonl(out / f"{_short(name)}.jsonl", converted)
        (read_preference if kind == "preference" else read_sft)(path)  # what training will read
        results.append(PreparedFile(path, kind, len(converted), sum(skipped.values()), dict(skipped)))
    return results


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `prepare-data` on the `lmrl` command's subparsers; `run` carries it out."""
    p = subparsers.add_parser("prepare-data", help="convert public data sets (hh-rlhf, belle, ...) to JSONL")
    p.add_argument("--datasets", nargs="+", choices=list(NAMED), default=[], metavar="NAME",
                   help=f"named data sets: {', '.join(NAMED)}")
    p.add_argument("--hf", action="append", default=[], metavar="NAME",
                   help="any hub data set, its format told from its columns (repeatable)")
    p.add_argument("--from", dest="from_path", type=Path, default=None, metavar="PATH",
                   help="local .jsonl/.json/.parquet file or directory to read instead of the hub")
    p.add_argument("--max-samples", type=int, default=None, metavar="N", help="keep the first N rows of each")
    p.add_argument("--output-dir", type=Path, default=Path("data"), metavar="DIR",
                   help="where NAME.jsonl goes (default data/)")
    p.add_argument("--split", default="train", help="split to read (default train)")
    return p


def run(args: argparse.Namespace) -> int:
    for prepared in prepare(args.datasets, args.output_dir, hf=args.hf, from_path=args.from_path,
                            max_samples=args.max_samples, split=args.split):
        print(prepared)
    return 0


def _check_format(name: str, where: str, columns: list[str], fmt: str | None) -> str:
    found = detect_format(columns)
    if fmt is None and found is not None:
        return found
    if fmt is not None and all(any(c in columns for c in n.split("|")) for n in FORMATS[fmt][0]):
        return fmt
    cols = ", ".join(columns) or "none"
    if fmt is not None:
        raise DataError(f"{where}: {name} rows need the columns {', '.join(FORMATS[fmt][0])}; found {cols}")
    expected = "; ".join(" + ".join(needs) for needs, _ in FORMATS.values())
    raise DataError(f"{where}: cannot tell the format of {name} from its columns ({cols}); expected {expected}")


def _convert(rows: Iterable[dict], fmt: str, max_samples: int | None) -> tuple[list[dict], Counter]:
    convert = _preference if FORMATS[fmt][1] == "preference" else _sft
    out, skipped = [], Counter()
    for row in rows:
        if max_samples is not None and len(out) >= max_samples:
            break
        try:
            out.append(convert(row, fmt))
        except _Skip as e:
            skipped[str(e)] += 1
    return out, skipped


def _preference(row: dict, fmt: str) -> dict:
    """{"prompt": str} or {"messages": [...]} plus the two final replies. Both sides are seen as whole
    conversations that must share everything before their last (assistant) turn."""
    if row.get("chosen") is None or row.get("rejected") is None:
        raise _Skip("no chosen or rejected")
    if fmt == "transcripts":
        context, chosen, rejected = [], _transcript(row.get("chosen")), _transcript(row.get("rejected"))
    else:
        context = _turns(row.get("prompt"), "user")
        chosen = _after(context, _turns(row.get("chosen"), "assistant"))  # some sets repeat the prompt there
        rejected = _after(context, _turns(row.get("rejected"), "assistant"))
    chosen, rejected = context + chosen, context + rejected
    if chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        raise _Skip("does not end in an assistant reply")
    if chosen[:-1] != rejected[:-1]:
        raise _Skip("chosen and rejected follow different conversations")
    prompt, reply_c, reply_r = chosen[:-1], chosen[-1]["content"], rejected[-1]["content"]
    if not any(m["content"].strip() for m in prompt):
        raise _Skip("empty prompt")
    if not reply_c.strip() or not reply_r.strip():
        raise _Skip("empty reply")
    if reply_c.strip() == reply_r.strip():
        raise _Skip("chosen same as rejected")
    if isinstance(row.get("prompt"), str) and len(prompt) == 1:
        return {"prompt": prompt[0]["content"], "chosen": reply_c, "rejected": reply_r}
    return {"messages": prompt, "chosen": reply_c, "rejected": reply_r}


def _sft(row: dict, fmt: str) -> dict:
    if fmt == "instruction":
        instruction, extra, output = row.get("instruction"), row.get("input") or "", row.get("output")
        if not all(isinstance(v, str) for v in (instruction, extra, output)):
            raise _Skip("instruction, input or output is not text")
        prompt = instruction.strip() + ("\n" + extra.strip() if extra.strip() else "")
        return _prompt_response(prompt, output.strip())
    if fmt == "completion":
        prompt, answer = row.get("prompt"), row.get("completion", row.get("response"))
        if isinstance(prompt, str) and isinstance(answer, str):
            return _prompt_response(prompt.strip(), answer.strip())
        messages = _turns(prompt, "user") + _turns(answer, "assistant")
    else:
        messages = _turns(row.get("messages") or row.get("conversations"), "user")
    if not any(m["role"] == "assistant" for m in messages):
        raise _Skip("no assistant turn")
    if any(m["role"] == "assistant" and not m["content"].strip() for m in messages):
        raise _Skip("empty reply")
    return {"messages": messages}


def _prompt_response(prompt: str, response: str) -> dict:
    if not prompt:
        raise _Skip("empty prompt")
    if not response:
        raise _Skip("empty reply")
    return {"prompt": prompt, "response": response}


def _turns(value, role: str) -> list[dict]:
    """A text as one turn of `role`, or a list of {role, content} / ShareGPT {from, value} turns."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, list) or not value:
        raise _Skip("a turn list is missing or empty")
    turns = []
    for turn in value:
        if not isinstance(turn, dict):
            raise _Skip("a turn is not an object")
        speaker, content = turn.get("role", turn.get("from")), turn.get("content", turn.get("value"))
        if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:
            raise _Skip(f"unknown speaker {speaker!r}")
        if not isinstance(content, str):
            raise _Skip("a turn's content is not text")
        turns.append({"role": SHAREGPT_ROLES[speaker], "content": content})
    return turns


def _transcript(value) -> list[dict]:
    """hh-rlhf's "\\n\\nHuman: ...\\n\\nAssistant: ..." text as user/assistant turns, or a turn list."""
    if not isinstance(value, str):
        return _turns(value, "assistant")
    parts = _HH_TURN.split(value.lstrip())
    if len(parts) < 3 or parts[0].strip():
        raise _Skip("not in 'Human: ... Assistant: ...' form")
    return [{"role": "user" if speaker == "Human" else "assistant", "content": text.strip()}
            for speaker, text in zip(parts[1::2], parts[2::2])]


def _after(prefix: list[dict], turns: list[dict]) -> list[dict]:
    return turns[len(prefix):] if len(turns) > len(prefix) and turns[:len(prefix)] == prefix else turns


def _load_hub(hub_id: str, split: str):
    try:
        import datasets
    except ImportError:
        raise DataError(f"{hub_id}: reading the Hugging Face hub needs the datasets package "
                        f"(pip install datasets); or pass --from PATH with local files") from None
    try:
        return datasets.load_dataset(hub_id, split=split)
    except Exception as e:  # one line for the user, whatever the hub client raised
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if isinstance(e, ConnectionError) or type(e).__name__ in ("OfflineModeIsEnabled", "LocalEntryNotFoundError"):
            raise DataError(f"{hub_id}: could not reach the Hugging Face hub ({detail}); download the data set "
                            f"and pass --from PATH with its local .jsonl/.json/.parquet files") from None
        if type(e).__name__ == "DatasetNotFoundError":
            raise DataError(f"{hub_id}: not found on the Hugging Face hub (check the name; a gated data set needs "
                            f"`hf auth login`), or pass --from PATH with local files") from None
        raise DataError(f"{hub_id}: could not load split {split!r} from the hub: {detail}") from None


def _local_files(root: Path, name: str, several: bool, split: str) -> list[Path]:
    """The source files of data set `name` under `root`; a directory's files are filtered to `split`
    (a file named train*, test*, validation* ... belongs to that split; others to every split)."""
    short = _short(name)
    own = [p for p in [root / short, *(root / f"{short}{s}" for s in SOURCE_SUFFIXES)] if p.exists()]
    if own:
        root = own[0]
    elif several:
        raise DataError(f"--from {root}: no files for {name}; with several data sets, put each in "
                        f"{root / short}/ or {root / short}.jsonl (.json, .parquet)")
    if not root.exists():
        raise DataError(f"--from {root}: no such file or directory")
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SOURCE_SUFFIXES)
                   and not p.name.startswith("."))
    chosen = [p for p in files if (m := _SPLIT_NAME.match(p.name.lower())) is None or m.group(1) == split]
    if not chosen:
        found = f"only {', '.join(p.name for p in files[:5])}" if files else "none"
        raise DataError(f"--from {root}: no {' or '.join(SOURCE_SUFFIXES)} files for split {split!r} ({found})")
    return chosen


def _read_local(path: Path) -> list[dict]:
    """The rows of a .parquet file, a JSON list, or JSON lines (also in a .json file, as the hub has them)."""
    if path.name.endswith(".parquet"):
        try:
            import pyarrow.parquet
        except ImportError:
            raise DataError(f"{path}: reading .parquet files needs pyarrow (pip install pyarrow)") from None
        return pyarrow.parquet.read_table(path).to_pylist()
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if path.name.endswith((".json", ".json.gz")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSON lines under a .json name
        if isinstance(data, list) or (data is not None and "\n" in text.strip()):
            if not (isinstance(data, list) and all(isinstance(r, dict) for r in data)):
                raise DataError(f"{path}: expected a JSON list of row objects, or one JSON object a line")
            return data
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object {{...}}")
        rows.append(row)
    return rows


def _short(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def _reasons(counts: dict[str, int]) -> str:
    return "; ".join(f"{n} {why}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1]))
