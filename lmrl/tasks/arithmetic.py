"""Addition and multiplication of `ndigit`-digit numbers, as text.

Encoding. Operands are zero-padded to `ndigit` digits, so every prompt has the same length
(`012+345=` with `use_format`, `012345` without). The answer is zero-padded to its widest value
(ndigit+1 digits for a sum, 2·ndigit for a product) and, with `reverse_answer` (the default),
written least-significant digit first: 12+345=357 becomes `012+345=7530`. Reversed, each digit
depends only on digits the model has already read or written, in the order carries propagate,
which is what makes the task learnable for a small left-to-right model (minGPT's adder makes the
same choice).

Scratchpad (multiplication, `scratchpad=True`). A product is not one carry chain: every answer
digit mixes many operand digits, and a small model trained on the few thousand 2-digit problems
memorises them rather than learning the rule. With a scratchpad the answer first writes the partial
products a·b_i (one per digit of b, least-significant first, each `ndigit+1` digits, reversed),
then the product, separated by `|`: 12*34 = 48 + 360 is written `12*34=840|630|8040`. Each partial
product is a one-digit multiplication with its own carry chain and the product is their shifted
sum, so every step is a small, reusable rule (Nye et al., 2021, "Show your work"). Exact match
is on the whole answer, scratchpad included; `decode_answer` returns the product.

Split. Problems are numbered `a·10^ndigit + b`. A fixed-seed draw of `heldout_size` of them is the
held-out set; training draws from everything else, so the two never overlap, whatever the run seed.

Reward. `score` is a verifier: it reads the operands back from the prompt text and checks the
completion against the true result. RL never needs a label, only the prompt. Four kinds:
`exact` (1 if the whole answer is right, else 0), `digits` (the fraction of answer digits in the
right place, one number per answer), `per_digit` (the same credit given token by token: each
answer digit is rewarded 1 or 0 on its own token, so REINFORCE credits each digit with its own
outcome instead of the whole answer's; reversed answers make each digit's correctness depend
only on that token) and, with a scratchpad, `per_step`: `per_digit` where each step is checked
against what it follows from. The partial products are checked against the operands, and the
product against the sum of the partial products the completion wrote, so a correct sum of a
wrong partial product earns its digits instead of being marked wrong with it (per_digit would
push such a completion away from adding correctly). Exact match is always against the true answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.gpt import CharTokenizer
from ..generation.rollout import Rollout, sample
from ..generation.sampling import Sampling

HELDOUT_SEED = 20240607  # fixed so every run, whatever its seed, evaluates the same problems
OPS = {"addition": "+", "multiplication": "*"}
REWARDS = ("exact", "digits", "per_digit", "per_step")


@dataclass(frozen=True)
class Batch:
    """Problems as operand tensors plus their tokenized prompts (B, prompt_len)."""

    a: torch.Tensor
    b: torch.Tensor
    prompts: torch.Tensor


def answer_length(name: str, ndigit: int, scratchpad: bool = False) -> int:
    """Characters in every answer: ndigit+1 for a sum, 2·ndigit for a product, plus the scratchpad's
    ndigit partial products of ndigit+1 digits and their separators."""
    if name == "addition":
        return ndigit + 1
    return 2 * ndigit + (ndigit * (ndigit + 2) if scratchpad else 0)


class ArithmeticTask:
    def __init__(self, name: str = "addition", ndigit: int = 3, use_format: bool = True,
                 reverse_answer: bool = True, reward: str = "exact", heldout_size: int = 1000,
                 scratchpad: bool = False):
        if name not in OPS:
            raise ValueError(f"task.name must be one of {sorted(OPS)}, got {name!r}")
        if reward not in REWARDS:
            raise ValueError(f"task.reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        self.name, self.ndigit, self.use_format = name, ndigit, use_format
        if scratchpad and name != "multiplication":
            raise ValueError("task.scratchpad is for multiplication only")
        if reward == "per_step" and not scratchpad:
            raise ValueError("task.reward=per_step checks scratchpad steps: it needs task.scratchpad=true")
        self.reverse_answer, self.reward, self.scratchpad = reverse_answer, reward, scratchpad
        self.op = OPS[name]
        self.tokenizer = CharTokenizer("0123456789" + self.op + "=" + ("|" if scratchpad else ""))
        self.prompt_len = 2 * ndigit + (2 if use_format else 0)
        self.answer_len = answer_length(name, ndigit, scratchpad)
        self.space = 10 ** (2 * ndigit)  # number of distinct problems
        if heldout_size >= self.space:
            raise ValueError(f"task.heldout_size={heldout_size} leaves no training problems out of {self.space}")
        g = torch.Generator().manual_seed(HELDOUT_SEED)
        ids = torch.randint(self.space, (heldout_size * 2,), generator=g).unique()  # unique() sorts: reshuffle
        ids = ids[torch.randperm(len(ids), generator=g)][:heldout_size]
        self.heldout_ids = ids.sort().values
        assert len(self.heldout_ids) == heldout_size, "held-out draw produced too few unique problems"

    # -- text ------------------------------------------------------------------------------------
    def prompt_text(self, a: int, b: int) -> str:
        x, y = f"{a:0{self.ndigit}d}", f"{b:0{self.ndigit}d}"
        return f"{x}{self.op}{y}=" if self.use_format else x + y

    def operands(self, prompt: str) -> tuple[int, int]:
        """Reads (a, b) back from a prompt: the verifier's only input besides the completion."""
        digits = prompt.replace(self.op, "").replace("=", "")
        return int(digits[: self.ndigit]), int(digits[self.ndigit :])

    def result(self, a: int, b: int) -> int:
        return a + b if self.op == "+" else a * b

    def _number(self, value: int, width: int) -> str:
        s = f"{value:0{width}d}"
        return s[::-1] if self.reverse_answer else s

    def target(self, a: int, b: int) -> str:
        """The labeled answer string (what SFT trains on and the verifier expects)."""
        result = self._number(self.result(a, b), 2 * self.ndigit if self.op == "*" else self.ndigit + 1)
        if not self.scratchpad:
            return result
        b_digits = [int(d) for d in reversed(f"{b:0{self.ndigit}d}")]  # least-significant first
        return "|".join([self._number(a * d, self.ndigit + 1) for d in b_digits] + [result])

    def step_target(self, a: int, b: int, completion: str) -> str:
        """What `per_step` checks `completion` against: the true partial products, then the sum of
        the partial products the completion wrote (the true product when they do not parse or their
        sum does not fit the product's width)."""
        expected = self.target(a, b)
        parts = completion.split("|")
        n = self.ndigit
        if len(parts) != n + 1 or not all(len(p) == n + 1 and p.isdigit() for p in parts[:n]):
            return expected
        numbers = [int(p[::-1] if self.reverse_answer else p) for p in parts[:n]]
        total = sum(x * 10**i for i, x in enumerate(numbers))
        if total >= 10 ** (2 * n):
            return expected
        return expected.rsplit("|", 1)[0] + "|" + self._number(total, 2 * n)

    def decode_answer(self, completion: str) -> str:
        """The completion as the number a person reads (undoes the reversal, drops the scratchpad)."""
        result = completion.rsplit("|", 1)[-1]
        return result[::-1] if self.reverse_answer else result

    # -- sampling --------------------------------------------------------------------------------
    def _split(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base = 10**self.ndigit
        return ids // base, ids % base

    def sample_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """`n` problem ids drawn uniformly from the training split (never a held-out problem)."""
        out = torch.empty(0, dtype=torch.long)
        while len(out) < n:
            ids = torch.randint(self.space, (2 * (n - len(out)) + 8,), generator=generator)
            out = torch.cat([out, ids[~torch.isin(ids, self.heldout_ids)]])
        return out[:n]

    def sample_distinct_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """`n` different training problems in random order: a label budget of exactly n."""
        available = self.space - len(self.heldout_ids)
        if n > available:
            raise ValueError(f"asked for {n} distinct training problems but only {available} exist "
                             f"(ndigit={self.ndigit}, heldout_size={len(self.heldout_ids)})")
        out = torch.empty(0, dtype=torch.long)
        while len(out) < n:
            drawn = torch.cat([out, self.sample_train_ids(2 * (n - len(out)) + 8, generator)])
            uniq, inverse = drawn.unique(return_inverse=True)
            first = torch.full((len(uniq),), len(drawn)).scatter_reduce(0, inverse, torch.arange(len(drawn)), "amin")
            out = drawn[first.sort().values]  # each problem once, in the order first drawn
        return out[:n]

    def batch(self, ids: torch.Tensor) -> Batch:
        a, b = self._split(ids)
        prompts = [self.prompt_text(x, y) for x, y in zip(a.tolist(), b.tolist())]
        return Batch(a, b, torch.tensor([self.tokenizer.encode(p) for p in prompts]))

    def labeled(self, ids: torch.Tensor) -> torch.Tensor:
        """Full prompt+answer token rows (B, seq_len) for supervised training."""
        a, b = self._split(ids)
        rows = [self.prompt_text(x, y) + self.target(x, y) for x, y in zip(a.tolist(), b.tolist())]
        return torch.tensor([self.tokenizer.encode(r) for r in rows])

    # -- the trainer's task protocol (shared with text tasks such as MathTask) -------------------
    @property
    def max_new_tokens(self) -> int:
        return self.answer_len

    def rollout(self, model, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, repetition_penalty: float = 1.0, greedy: bool = False,
                generator: torch.Generator | None = None) -> Rollout:
        """Completions for problems `ids`, sampled (or greedy) with the model's KV cache."""
        prompts = self.batch(ids).prompts.to(next(model.parameters()).device)
        sampling = Sampling(temperature, top_k, top_p, min_p, repetition_penalty)
        return sample(model, prompts, self.answer_len, sampling=sampling, greedy=greedy, generator=generator)

    def score_rollout(self, ids: torch.Tensor, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Rewards ((B,) or (B, N) per digit), exact-match flags (B,), no extra metrics."""
        return (*self.score_batch(rollout.prompts.cpu(), rollout.completions.cpu()), {})

    def texts(self, ids: torch.Tensor, rollout: Rollout) -> tuple[list[str], list[str]]:
        return ([self.tokenizer.decode(p) for p in rollout.prompts.cpu()],
                [self.tokenizer.decode(c) for c in rollout.completions.cpu()])

    def reward_kwargs(self, ids: torch.Tensor) -> dict:
        return {}  # a reward function gets the texts only: the verifier reads the operands from the prompt

    # -- reward ----------------------------------------------------------------------------------
    def score(self, prompt: str, completion: str) -> float:
        """1.0 for an exact answer, else 0.0; with reward='digits' or 'per_digit', the fraction of
        answer digits in the right place (partial credit); with 'per_step', the fraction of steps'
        digits right (see `step_target`)."""
        a, b = self.operands(prompt)
        expected = self.target(a, b)
        if self.reward == "exact":
            return float(completion == expected)
        if self.reward == "per_step":
            expected = self.step_target(a, b, completion)
        return sum(c == e for c, e in zip(completion, expected)) / len(expected)

    def score_batch(self, prompts: torch.Tensor, completions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards and exact-match flags (B,) for token tensors. Rewards are (B,), or (B, answer_len)
        with reward='per_digit' or 'per_step' (1 where that digit is right)."""
        problems = [self.operands(self.tokenizer.decode(p)) for p in prompts]
        expected = torch.tensor([self.tokenizer.encode(self.target(a, b)) for a, b in problems]).view(len(prompts), -1)
        right = completions == expected  # (B, N): which digits are right
        exact = right.all(1).float()
        if self.reward == "exact":
            return exact, exact
        if self.reward == "digits":
            return right.float().mean(1), exact
        if self.reward == "per_step":
            steps = [self.step_target(a, b, self.tokenizer.decode(c)) for (a, b), c in zip(problems, completions)]
            right = completions == torch.tensor([self.tokenizer.encode(s) for s in steps]).view(len(prompts), -1)
        return right.float(), exact


def seq_len(task_cfg) -> int:
    """Positions a problem of the `task` config section needs: prompt + answer."""
    prompt = 2 * task_cfg.ndigit + (2 if task_cfg.use_format else 0)
    return prompt + answer_length(task_cfg.name, task_cfg.ndigit, task_cfg.scratchpad)


def config_problems(config) -> list[str]:
    """What an arithmetic task needs of the config: the problem must fit the model, the budget the task."""
    m, t = config.model, config.task
    space = 10 ** (2 * t.ndigit)  # distinct problems
    need = seq_len(t)
    return [msg for ok, msg in [
        (config.eval.size <= t.heldout_size,
         f"eval.size={config.eval.size} must be between 1 and task.heldout_size={t.heldout_size}"),
        (t.heldout_size < space, f"task.heldout_size={t.heldout_size} leaves no training problems for "
                                 f"ndigit={t.ndigit}"),
        (config.sft.examples <= space - t.heldout_size,
         f"sft.examples={config.sft.examples} is more than the {max(space - t.heldout_size, 0)} training "
         f"problems of ndigit={t.ndigit} with task.heldout_size={t.heldout_size}"),
        (need <= m.n_position, f"task.ndigit={t.ndigit} needs {need} positions but model.n_position is {m.n_position}"),
        (not config.algo.mask_truncated_completions, f"algo.mask_truncated_completions: task.name={t.name} writes "
                                                     f"fixed-length answers, which are never cut off; leave it false"),
    ] if not ok]
