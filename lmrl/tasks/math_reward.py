r"""Reward for math answers written as `<think>…</think> <answer>…</answer>`.

    reward = MathReward()                                  # 1.0 iff well-formed and correct
    reward(prompts, completions, ground_truth=["19", ...])  # -> [1.0, 0.0, ...]

Format (`parse_completion`). A completion is well-formed when it is exactly one `<think>…</think>`
followed by one `<answer>…</answer>`, with nothing but whitespace before, between and after, and
each of the four tags appearing once (so no nesting, no second block). The answer is the content
of the last `<answer>` block, stripped; None when there is no closed `<answer>…</answer>`.

Correctness. math-verify compares values: `\boxed{\frac12}`, `1/2`, `0.5`, `50\%` and `\frac{2}{4}`
all equal a ground truth of `1/2` (or `0.5`); floats are rounded to 6 places (`0.333333` is 1/3,
`0.333` is not), and an unevaluated `12+7` is 19. A bare answer is wrapped as `$…$` so that
math-verify reads all of it as one LaTeX expression (unwrapped, `3 or 4` would read as `4`).

Lenient mode. With `require_format=False` a completion without an `<answer>` block is read as
the last number it writes (`"56 + 67 = 123. The answer is 123."` answers 123), as GSM8K-style
graders do, so a model that has not yet learned the tags can still be scored.

Currency and units (`plain_value`). A currency sign or code around a number (`\$19`, `USD 19`,
`€19`) and unit words after it (`19 dollars`, `19 km/h`, `19 \text{ miles per hour}`, `19 cm^2`)
are dropped, from answers and ground truths alike, so each of these is 19. A unit is words of
letters (`/` and powers such as `m^2` allowed), at least one of two letters or more; lone letters
(`2 x`, `19 m/s`) and math names (`2 pi`, `2 \sqrt{2}`) stay part of the value.

Hedging. Every value the answer names must be right (`answer_candidates`): each `\boxed{…}`,
`$…$`, `\(…\)` or `\[…\]` group is a candidate, and so is the text around them if it holds a
digit; without groups the whole answer is one. `\boxed{3} or \boxed{4}` and `$3$, no, $4$` are
wrong against 4, and so is `3 or 4`, which math-verify reads as the set {3, 4}: a set equals only
a ground truth that is the same set. `18 \lor 19`, `18 \vee 19` and `18 (or 19)` are that set
too (math-verify alone reads them as 19), and an answer that is a collection (a set, list, tuple
or interval: `[19, 19]`, `\{19\}`) is wrong unless the ground truth is one, however many of its
items are right.

Relations. math-verify reads an equation as its right side, so `\boxed{20 = 19}` would be 19. A
candidate that is a relation (`=`, `\ne`, `<`, `\le`, `>`, `\ge`, or several joined, such as
`a = b = 19`) is wrong unless the ground truth is a relation too; the one exception is a lone
variable set to a value, `x = 19`, which answers 19.

Time. Sympy can take minutes on a hostile answer (`10^{10^{10}}`), and math-verify's own
timeouts use signal.alarm, which only works in the main thread. So they are off, and a checker
server process (spawned once, about 2 s, with math-verify imported) forks one process per answer,
up to `max_parallel` at a time, and kills each that runs past `timeout_s`: the row scores 0 and
`timeouts` counts it. The answers of a batch are checked side by side, so a batch of hostile
answers costs about one `timeout_s`, not one per row. This works from any thread, on Linux (it
forks). Scripts that use MathReward need the usual `if __name__ == "__main__":` guard (the spawned
server imports the main script).

Memory. The checks that run at once share `memory_budget_bytes` (4 GiB by default): each may grow
its address space past the server's by `memory_budget_bytes / max_parallel` at most (128 MiB at the
default 32; a typical check adds under 10 MiB), so together they add at most `memory_budget_bytes`
to the server's own size (about 70 MiB), whatever the answers; a check past its share dies and its
row scores 0 (counted in `errors`). An answer longer than `MAX_ANSWER_CHARS` is wrong without
being parsed.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing
import os
import pickle
import re
import select
import signal
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..common.errors import MissingPackage

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_FORMAT = re.compile(r"\s*<think>.*</think>\s*<answer>.*</answer>\s*", re.DOTALL)
_MATH_GROUP = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# A value with its currency and units (`plain_value`): currency before, the number, currency or units after.
_CURRENCY = r"(?:\\\$|\$|US\$|USD|EUR|GBP|€|£|¥|₹|\\pounds|\\euro|\\textdollar|\\textsterling)"
_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:\s*/\s*\d+)?|\\d?frac\{[^{}]*\}\{[^{}]*\}"
_VALUE_WITH_UNITS = re.compile(rf"\s*(?:{_CURRENCY}\s*)?({_NUMBER})(.*)", re.DOTALL)
_UNIT_WORD = re.compile(r"[A-Za-z]+\.?(?:\^\{?-?\d\}?)?")  # `km`, `hr.`, `m^2`, `cm^{3}`
_TEXT_WRAPPER = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|~")
_MATH_WORDS = {"pi", "sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "lg", "exp", "arcsin",
               "arccos", "arctan", "sinh", "cosh", "tanh", "inf", "infty", "infinity", "mod", "pmod", "and", "or"}
_DISJUNCTION = re.compile(r"\\(?:lor|vee)(?![A-Za-z])")
_PARENTHESISED_OR = re.compile(r"\(\s*or\s+([^()]*)\)", re.IGNORECASE)
_STARTUP_S = 300.0  # the checker server's start (imports sympy and math-verify) is not counted in timeout_s
_SERVER_SLACK_S = 30.0  # beyond its rows' own timeouts, how long a batch may take before the server is given up
MEMORY_BUDGET_BYTES = 4 << 30  # address space all the checks running at once may add to the server's
_MIN_CHECK_MEMORY_BYTES = 64 << 20  # less would fail ordinary checks (sympy's caches grow as it works)
MAX_ANSWER_CHARS = 1000  # a longer answer is wrong unparsed: no math answer needs more, a hostile one only costs


def parse_completion(text: str) -> tuple[bool, str | None]:
    """(format_ok, answer): see the module docstring for the rule."""
    format_ok = all(text.count(tag) == 1 for tag in _TAGS) and _FORMAT.fullmatch(text) is not None
    start = text.rfind("<answer>")
    end = text.find("</answer>", start) if start >= 0 else -1
    answer = text[start + len("<answer>"):end].strip() if end >= 0 else None
    return format_ok, answer


def last_number(text: str) -> str | None:
    """The last number written in `text` (thousands separators dropped), or None."""
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def answer_candidates(answer: str) -> list[str]:
    """Every value an answer names, as LaTeX without delimiters; each must be right."""
    answer = answer.replace("\\$", "")  # an escaped dollar is a currency sign, never a math delimiter
    groups, rest = _take_boxed(answer)
    for m in _MATH_GROUP.finditer(rest):
        groups.append(next(g for g in m.groups() if g is not None))
    rest = _MATH_GROUP.sub(" ", rest)
    groups = [g.strip() for g in groups if g.strip()]
    if not groups:
        return [answer.strip()]
    return groups + [rest.strip()] if re.search(r"\d", rest) else groups


def plain_value(text: str) -> str:
    r"""`text` without a currency sign or code and trailing unit words when it is a number with them
    (`\$19.00` -> `19.00`, `19 km/h` -> `19`), and with `\lor`, `\vee` and `(or …)` written as
    math-verify writes `or`, a comma between the values (`18 (or 19)` -> `18 , 19`)."""
    text = _PARENTHESISED_OR.sub(r", \1", _DISJUNCTION.sub(",", text))
    m = _VALUE_WITH_UNITS.fullmatch(text)
    if m is None:
        return text
    number, tail = m.groups()
    tail = _SPACING.sub(" ", _TEXT_WRAPPER.sub(r" \1 ", tail)).strip()
    tail = re.sub(rf"^{_CURRENCY}|{_CURRENCY}$", "", tail).strip()
    if not tail:
        return number
    words = tail.replace("/", " ").split()
    letters = [re.sub(r"[^A-Za-z]", "", w.split("^")[0]) for w in words]
    is_unit = (all(_UNIT_WORD.fullmatch(w) for w in words) and any(len(w) >= 2 for w in letters)
               and not any(w.lower() in _MATH_WORDS for w in letters))
    return number if is_unit else text


def _take_boxed(text: str) -> tuple[list[str], str]:
    r"""The contents of each `\boxed{…}` (braces balanced), and the text without them."""
    found, kept, i = [], [], 0
    while (start := text.find("\\boxed{", i)) >= 0:
        depth, open_at = 0, start + len("\\boxed")
        for end in range(open_at, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        else:  # never closed: leave it to be read as text
            break
        found.append(text[open_at + 1:end])
        kept.append(text[i:start])
        i = end + 1
    kept.append(text[i:])
    return found, "".join(kept)


def _as_latex(text: str) -> str:
    """`text` as math-verify's `parse` reads it best: inside `$…$` unless already delimited."""
    if re.search(r"\$|\\boxed|\\\(|\\\[", text):
        return text
    return "$" + " ".join(text.split()) + "$"  # one line: math-verify's `$…$` does not span lines


def _init_worker() -> None:
    import logging

    # It warns that its own timeouts are off; the checker's deadline replaces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _check(answer: str, ground_truth: str) -> tuple[bool, str | None]:
    """(correct, error) for one answer; runs in a forked checker process."""
    from math_verify import parse, verify

    candidates = [_as_latex(plain_value(c)) for c in answer_candidates(answer)]
    try:
        gold = parse(_as_latex(plain_value(ground_truth.replace("\\$", ""))), parsing_timeout=None)
        if not gold:
            return False, f"the ground truth {ground_truth!r} does not parse as math"
        preds = [parse(c, parsing_timeout=None) for c in candidates]
        if not _is_relation(gold) and any(_is_relation(p, lone_variable_ok=True) for p in preds):
            return False, None
        if not _is_collection(gold) and any(_is_collection(p) for p in preds):
            return False, None
        return all(p and verify(gold, p, timeout_seconds=None) for p in preds), None
    except Exception as e:  # math-verify failing on this row: the row scores 0, the batch goes on
        return False, f"math-verify raised {type(e).__name__}: {e}"


def _is_relation(parsed: list, lone_variable_ok: bool = False) -> bool:
    """Whether math-verify's parse of an answer is a relation (`20 = 19`, `x \\le 3`, `a = b = 19`);
    with `lone_variable_ok`, `x = 19` (a symbol on the left, no relation on the right) is not one."""
    from sympy import Symbol
    from sympy.core.relational import Equality, Relational
    from sympy.logic.boolalg import BooleanFunction

    for expr in parsed:
        if isinstance(expr, BooleanFunction):
            return True
        if isinstance(expr, Relational):
            lone = isinstance(expr, Equality) and isinstance(expr.lhs, Symbol) and not expr.rhs.has(Relational)
            if not (lone_variable_ok and lone):
                return True
    return False


def _is_collection(parsed: list) -> bool:
    """Whether math-verify's parse of an answer is a set, list, tuple or interval (`{19}`, `[19, 19]`)."""
    from sympy import Set, Tuple

    return any(isinstance(expr, (Set, Tuple)) for expr in parsed)


@dataclass
class RewardInfo:
    reward: float
    format_ok: bool
    correct: bool  # False when not checked (bad format with require_format, or no answer)
    timed_out: bool = False
    error: str | None = None  # why the checker failed on this row, if it did


class MathReward:
    """A TRL-style reward function: `reward(prompts, completions, ground_truth) -> list[float]`.

    reward = format_weight·[well-formed] + correct_weight·[correct], where a correct answer counts
    only if well-formed when `require_format`. Defaults: 1.0 iff well-formed and correct, else 0.
    A row whose check times out or fails scores 0 (counted in `timeouts` / `errors`)."""

    def __init__(self, format_weight: float = 0.0, correct_weight: float = 1.0, require_format: bool = True,
                 timeout_s: float = 5.0, max_parallel: int = 32, memory_budget_bytes: int = MEMORY_BUDGET_BYTES):
        if importlib.util.find_spec("math_verify") is None:
            raise MissingPackage("MathReward needs math-verify: pip install 'lmrl[math]'")
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be at least 1 (got {max_parallel})")
        self.memory_budget_bytes, self.check_memory_bytes = memory_budget_bytes, memory_budget_bytes // max_parallel
        if self.check_memory_bytes < _MIN_CHECK_MEMORY_BYTES:
            raise ValueError(f"memory_budget_bytes={memory_budget_bytes} gives each of max_parallel={max_parallel} "
                             f"checks {self.check_memory_bytes >> 20} MiB, under the {_MIN_CHECK_MEMORY_BYTES >> 20} "
                             f"MiB a check needs: raise the budget or lower max_parallel")
        self.__name__ = "math_reward"  # TRL names reward functions in its logs by __name__
        self.format_weight, self.correct_weight = format_weight, correct_weight
        self.require_format, self.timeout_s, self.max_parallel = require_format, timeout_s, max_parallel
        self.timeouts = 0  # rows whose check was stopped after timeout_s
        self.errors = 0  # rows where math-verify raised, or its process died
        self._server: tuple | None = None  # (process, connection) of the checker server
        self._lock = threading.Lock()  # one batch at a time through the server

    def __call__(self, prompts: Sequence[str], completions: Sequence, ground_truth: Sequence[str],
                 **kwargs) -> list[float]:
        return [info.reward for info in self.score(completions, ground_truth)]

    def score_one(self, completion, ground_truth: str) -> RewardInfo:
        return self.score([completion], [ground_truth])[0]

    def score(self, completions: Sequence, ground_truth: Sequence[str]) -> list[RewardInfo]:
        """A RewardInfo per completion (a string, or a TRL conversation: its last message counts)."""
        if len(completions) != len(ground_truth):
            raise ValueError(f"{len(completions)} completions but {len(ground_truth)} ground truths")
        texts = [completion_text(c) for c in completions]
        parsed = [parse_completion(t) for t in texts]
        if not self.require_format:  # no <answer> block: the last number written is the answer
            parsed = [(ok, answer if answer is not None else last_number(t)) for (ok, answer), t in zip(parsed, texts)]
        todo = {i: (answer, str(gt)) for i, ((ok, answer), gt) in enumerate(zip(parsed, ground_truth))
                if answer and len(answer) <= MAX_ANSWER_CHARS and (ok or not self.require_format)}
        checked = self._check_all(todo)
        infos = []
        for i, (ok, _) in enumerate(parsed):
            correct, timed_out, error = checked.get(i, (False, False, None))
            reward = 0.0 if timed_out or error else self.format_weight * ok + self.correct_weight * correct
            infos.append(RewardInfo(float(reward), ok, correct, timed_out, error))
        return infos

    def close(self) -> None:
        """Stop the checker server and its checks (a later call starts a new one)."""
        with self._lock:
            self._kill_server()

    def _check_all(self, todo: dict[int, tuple[str, str]]) -> dict[int, tuple[bool, bool, str | None]]:
        """(correct, timed_out, error) per row index, all rows checked side by side in the server."""
        if not todo:
            return {}
        rows = list(todo)
        with self._lock:
            _, conn = self._get_server()
            conn.send(([todo[i] for i in rows], self.timeout_s))
            waves = math.ceil(len(rows) / self.max_parallel)  # rows beyond max_parallel wait for a free slot
            try:
                outcomes = conn.recv() if conn.poll(waves * self.timeout_s + _SERVER_SLACK_S) else None
            except (EOFError, OSError):
                outcomes = None
            if outcomes is None:  # the server hung or died: no row of this batch was checked
                self._kill_server()
                outcomes = [("died", None)] * len(rows)
            results = {}
            for i, (status, value) in zip(rows, outcomes):
                if status == "bug":
                    raise RuntimeError(f"MathReward: checking an answer failed in lmrl's code: {value}")
                self.timeouts += status == "timeout"
                self.errors += status == "died" or (status == "ok" and value[1] is not None)
                if status == "ok":
                    results[i] = (value[0], False, value[1])
                else:
                    results[i] = (False, status == "timeout",
                                  None if status == "timeout" else "the checker process died")
        return results

    def _get_server(self) -> tuple:
        if self._server is None:
            ctx = multiprocessing.get_context("spawn")
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=_serve_checks, args=(theirs, self.max_parallel, self.check_memory_bytes),
                                  daemon=True, name="lmrl-math-checker")
            process.start()
            theirs.close()
            self._server = (process, ours)
            # Its start imports sympy and math-verify, so no row's timeout pays for it.
            if not ours.poll(_STARTUP_S):
                self._kill_server()
                raise RuntimeError(f"MathReward: the checker process did not start in {_STARTUP_S:.0f} s")
            ours.recv()
        return self._server

    def _kill_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            process, conn = server
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the server and the checks it forked
            except (ProcessLookupError, PermissionError):
                process.kill()
            process.join()
            conn.close()

    def __getstate__(self):  # picklable (e.g. for DDP spawn): the server and lock stay behind
        return {k: v for k, v in self.__dict__.items() if k not in ("_server", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _server=None, _lock=threading.Lock())


def _serve_checks(conn, max_parallel: int, check_memory_bytes: int) -> None:
    """The checker server: import math-verify once, then check each batch it receives in forked
    processes (`_check_forked`) and send back one (status, value) per row."""
    os.setpgid(0, 0)  # its own process group, so one killpg stops it and every check it forked
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))  # terminated: take the checks along
    _init_worker()
    _check("1", "1")  # import sympy and math-verify before the first fork
    conn.send("ready")
    while True:
        try:
            jobs, timeout_s = conn.recv()
        except EOFError:  # the reward was closed or its process ended
            return
        conn.send(_check_forked(jobs, timeout_s, max_parallel, check_memory_bytes))


def _check_forked(jobs: list[tuple[str, str]], timeout_s: float, max_parallel: int,
                  check_memory_bytes: int) -> list[tuple]:
    """(status, value) per job: ("ok", `_check`'s result), ("timeout", None) for a check killed after
    `timeout_s` of its own, ("died", None) for one that ended without a result (past its
    `check_memory_bytes` of address space, say), ("bug", message) for an exception raised by lmrl's
    own code. At most `max_parallel` checks run at once."""
    results: list = [("died", None)] * len(jobs)
    waiting, running = list(range(len(jobs))), {}  # running: read fd -> [row, pid, deadline, chunks]
    while waiting or running:
        while waiting and len(running) < max_parallel:
            row = waiting.pop(0)
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the check: compute, write the pickled result, exit without cleanup
                os.close(read_fd)
                _check_in_child(jobs[row], write_fd, check_memory_bytes)
            os.close(write_fd)
            running[read_fd] = [row, pid, time.monotonic() + timeout_s, []]
        wait = max(0.0, min(r[2] for r in running.values()) - time.monotonic())
        for fd in select.select(list(running), [], [], wait)[0]:
            data = os.read(fd, 1 << 16)
            if data:
                running[fd][3].append(data)
                continue
            row, pid, _, chunks = running.pop(fd)
            os.close(fd)
            os.waitpid(pid, 0)
            if chunks:
                results[row] = pickle.loads(b"".join(chunks))
        now = time.monotonic()
        late = [fd for fd, (_, _, deadline, _) in running.items() if now >= deadline]
        for fd in late:  # all signalled first, so they die side by side
            os.kill(running[fd][1], signal.SIGKILL)
        for fd in late:
            row, pid, _, _ = running.pop(fd)
            os.waitpid(pid, 0)
            os.close(fd)
            results[row] = ("timeout", None)
    return results


def _check_in_child(job: tuple[str, str], fd: int, memory_bytes: int) -> None:
    import resource

    try:
        os.nice(10)  # below the server, which must stay free to fork the next check and kill late ones
        with open("/proc/self/statm") as f:  # the server's size, which the check starts from
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, size + memory_bytes))
        result = ("ok", _check(*job))
    except MemoryError:
        result = ("died", None)
    except BaseException as e:  # a bug in lmrl's code: the parent raises it
        result = ("bug", f"{type(e).__name__}: {e}")
    try:
        data = pickle.dumps(result)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os._exit(0)


def completion_text(completion) -> str:
    """A completion's text: the string itself, or a TRL conversation's (a list of messages) last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")
