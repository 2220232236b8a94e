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

Hedging. Every value the answer names must be right (`answer_candidates`): each `\boxed{…}`,
`$…$`, `\(…\)` or `\[…\]` group is a candidate, and so is the text around them if it holds a
digit; without groups the whole answer is one. `\boxed{3} or \boxed{4}` and `$3$, no, $4$` are
wrong against 4, and so is `3 or 4`, which math-verify reads as the set {3, 4}: a set equals only
a ground truth that is the same set.

Time. Sympy can take minutes on a hostile answer (`10^{10^{10}}`), and math-verify's own
timeouts use signal.alarm, which only works in the main thread. So they are off, and each check
runs in a worker process (spawned once, about 2 s, then reused) that is killed after `timeout_s`:
the row scores 0, `timeouts` counts it, and a fresh worker serves the next row. This works from
any thread. Scripts that use MathReward need the usual `if __name__ == "__main__":` guard (spawned
workers import the main script).
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import multiprocessing
import re
import threading
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Sequence

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_FORMAT = re.compile(r"\s*<think>.*</think>\s*<answer>.*</answer>\s*", re.DOTALL)
_MATH_GROUP = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_STARTUP_S = 300.0  # a worker's start (imports torch via lmrl.tasks, sympy) is not counted in timeout_s


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
    groups, rest = _take_boxed(answer)
    for m in _MATH_GROUP.finditer(rest):
        groups.append(next(g for g in m.groups() if g is not None))
    rest = _MATH_GROUP.sub(" ", rest)
    groups = [g.strip() for g in groups if g.strip()]
    if not groups:
        return [answer.strip()]
    return groups + [rest.strip()] if re.search(r"\d", rest) else groups


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

    # It warns that its own timeouts are off; the worker's deadline replaces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _check(answer: str, ground_truth: str) -> tuple[bool, str | None]:
    """(correct, error) for one answer; runs in a worker process."""
    from math_verify import parse, verify

    candidates = [_as_latex(c) for c in answer_candidates(answer)]
    try:
        gold = parse(_as_latex(ground_truth), parsing_timeout=None)
        if not gold:
            return False, f"the ground truth {ground_truth!r} does not parse as math"
        preds = [parse(c, parsing_timeout=None) for c in candidates]
        return all(p and verify(gold, p, timeout_seconds=None) for p in preds), None
    except Exception as e:  # math-verify failing on this row: the row scores 0, the batch goes on
        return False, f"math-verify raised {type(e).__name__}: {e}"


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
                 timeout_s: float = 5.0, workers: int = 1):
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError("MathReward needs math-verify: pip install 'lmrl[math]'")
        self.__name__ = "math_reward"  # TRL names reward functions in its logs by __name__
        self.format_weight, self.correct_weight = format_weight, correct_weight
        self.require_format, self.timeout_s, self.workers = require_format, timeout_s, workers
        self.timeouts = 0  # rows whose check was stopped after timeout_s
        self.errors = 0  # rows where math-verify raised, or its worker died
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # one batch at a time: a timeout replaces the shared pool

    def __call__(self, prompts: Sequence[str], completions: Sequence, ground_truth: Sequence[str],
                 **kwargs) -> list[float]:
        return [info.reward for info in self.score(completions, ground_truth)]

    def score_one(self, completion, ground_truth: str) -> RewardInfo:
        return self.score([completion], [ground_truth])[0]

    def score(self, completions: Sequence, ground_truth: Sequence[str]) -> list[RewardInfo]:
        """A RewardInfo per completion (a string, or a TRL conversation: its last message counts)."""
        if len(completions) != len(ground_truth):
            raise ValueError(f"{len(completions)} completions but {len(ground_truth)} ground truths")
        texts = [_completion_text(c) for c in completions]
        parsed = [parse_completion(t) for t in texts]
        if not self.require_format:  # no <answer> block: the last number written is the answer
            parsed = [(ok, answer if answer is not None else last_number(t)) for (ok, answer), t in zip(parsed, texts)]
        todo = {i: (answer, str(gt)) for i, ((ok, answer), gt) in enumerate(zip(parsed, ground_truth))
                if answer and (ok or not self.require_format)}
        checked = self._check_all(todo)
        infos = []
        for i, (ok, _) in enumerate(parsed):
            correct, timed_out, error = checked.get(i, (False, False, None))
            reward = 0.0 if timed_out or error else self.format_weight * ok + self.correct_weight * correct
            infos.append(RewardInfo(float(reward), ok, correct, timed_out, error))
        return infos

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        with self._lock:
            self._kill_pool()

    def _check_all(self, todo: dict[int, tuple[str, str]]) -> dict[int, tuple[bool, bool, str | None]]:
        """(correct, timed_out, error) per row index. A timeout kills the pool; the rows that were
        queued or running beside it are checked again in a fresh one."""
        results, pending = {}, list(todo)
        with self._lock:
            while pending:
                pool = self._get_pool()
                futures = [(i, pool.submit(_check, *todo[i])) for i in pending]
                pending, killed = [], False
                for i, fut in futures:
                    if killed and (fut.cancelled() or not fut.done() or fut.exception() is not None):
                        pending.append(i)
                        continue
                    try:
                        correct, error = fut.result(timeout=self.timeout_s)
                    except (cf.TimeoutError, BrokenProcessPool) as e:
                        timed_out = isinstance(e, cf.TimeoutError)
                        self.timeouts += timed_out
                        self.errors += not timed_out  # the worker died on this row (e.g. out of memory)
                        results[i] = (False, timed_out, None if timed_out else "the checker process died")
                        self._kill_pool()
                        killed = True
                        continue
                    self.errors += error is not None
                    results[i] = (correct, False, error)
        return results

    def _get_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                          initializer=_init_worker)
            # Import sympy and math-verify in every worker now, so no row's timeout pays for it.
            warm = [pool.submit(_check, "1", "1") for _ in range(self.workers)]
            if cf.wait(warm, timeout=_STARTUP_S).not_done:
                _kill(pool)
                raise RuntimeError(f"MathReward: the checker processes did not start in {_STARTUP_S:.0f} s")
            for fut in warm:
                fut.result()
            self._pool = pool
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            _kill(pool)

    def __getstate__(self):  # picklable (e.g. for DDP spawn): the pool and lock stay behind
        return {k: v for k, v in self.__dict__.items() if k not in ("_pool", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _pool=None, _lock=threading.Lock())


def _kill(pool: cf.ProcessPoolExecutor) -> None:
    for proc in list((pool._processes or {}).values()):  # no public way to kill before Python 3.14
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _completion_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")
