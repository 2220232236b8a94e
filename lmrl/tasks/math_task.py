"""Math reasoning from JSONL: a Hugging Face policy answers text prompts; math-verify checks them.

    task = MathTask("train.jsonl", "test.jsonl", tokenizer, prompt_template="{prompt} Answer in <answer> </answer>.")
    ro = task.rollout(policy, task.sample_train_ids(8, gen), temperature=1.0)
    rewards, correct, extras = task.score_rollout(ids, ro)          # extras: {"format_rate": (B,) 0/1}

Rows are `{"prompt": str, "ground_truth": str}` or `{"messages": [...], "ground_truth": str}`, checked
with math-verify, or reasoning-gym rows (`lmrl prepare-data --rg-tasks`, marked by their
`rg_config`), checked with their data set's own scorer (`lmrl.tasks.reasoning_gym`), in a JSONL or
parquet file. `common.data.prompt_row` reads other layouts into that form: verl's (`prompt` a message
list, the answer at `reward_model.ground_truth`) as they are, others through `prompt_key` /
`label_key` (OpenRLHF's --input_key / --label_key).
A plain prompt is put into `prompt_template` and, with `chat`, becomes the user message of a
conversation (after `system_prompt`, if any) rendered by the tokenizer's chat template; a
prompt that already holds the template's special tokens (e.g. `<|im_start|>`) is used as it is.
`messages` rows are always rendered with the chat template. Every prompt is rendered once, here.
A rendered prompt longer than `max_prompt_length` tokens keeps its last `max_prompt_length`
(TRL's GRPOConfig cut prompts so: its question survives, the start of a long context goes), its
BOS text kept in front; `notes` holds one line naming each such row (`path:line`) and its length.

Ids. Training rows are numbered 0..T-1 and test rows T..T+H-1, so, as for the arithmetic tasks,
a problem id says which split it belongs to: `sample_train_ids` draws from the first range only
and `heldout_ids` is the second. Without a train file (evaluation only, `lmrl eval MODEL FILE`)
T is 0.

Scoring. `MathReward` gives the reward (format and correctness weights from the config) and the
exact-match flag we report as accuracy: the answer is correct, and well-formed when the reward
requires it. A reasoning-gym row's reward is the same sum with its scorer's score (in [0, 1]) for
correctness, and it is correct at a full score. Custom rewards (`reward.funcs`, `reward.cls`) replace the reward only; accuracy stays
math-verify's. They get the row's other columns (`reward_kwargs`) and, called as TRL calls them,
a chat row's prompt and completion as message lists (`conversations`).

Sources. A row's `data_source` (verl's column: `openai/gsm8k`, `lighteval/MATH`) is its source
(`row_sources`): held-out evaluation also reports each source's accuracy and reward.
"""

from __future__ import annotations

from functools import cached_property

import torch

from ..common.data import LABEL_KEY, PROMPT_KEY, SOURCE_KEY, iter_file_rows, prompt_row, read_jsonl
from ..generation.rollout import Rollout, sample_text
from ..generation.sampling import Sampling
from . import reasoning_gym
from .math_reward import RewardInfo

CHARS_PER_TOKEN = 64  # no token is longer: a prompt is cut to this many characters per token before tokenizing


def read_rows(path: str, prompt_key: str = PROMPT_KEY, label_key: str = LABEL_KEY) -> list[dict]:
    """A math task's rows (JSONL or parquet, as `prompt_row` reads them with these keys): each with a
    ground_truth and a prompt or messages (`path:line` / `path:row N` errors)."""
    return read_jsonl(path, alternatives=[["prompt"], ["messages"]], check=_answer_problem,
                      shape=lambda row: prompt_row(row, prompt_key, label_key))


def _answer_problem(row: dict) -> str | None:
    """A math row without a ground_truth, or whose ground_truth has no text (math-verify would mark every
    completion of it wrong)."""
    if "ground_truth" not in row:
        return (f"missing key 'ground_truth' (or verl's reward_model.ground_truth) (the row has keys: "
                f"{', '.join(map(repr, row))}); set task.label_key to the key that holds the answer")
    if reasoning_gym.is_reasoning_gym_row(row) or not isinstance(row["ground_truth"], str) or row["ground_truth"].strip():
        return None
    return f"'ground_truth' is empty ({row['ground_truth']!r}): every completion would be scored wrong"


def keep_prompt_ends(texts: list[str], tokenizer, max_tokens: int) -> tuple[list[str], dict[int, int]]:
    """Each text cut to its last `max_tokens` tokens (a text that starts with the BOS text keeps it in
    front, within the count); returns the texts and {index: characters before the cut} of those cut.
    A text is cut to its last CHARS_PER_TOKEN * max_tokens characters before it is tokenized, so a
    huge prompt costs no more than one of that size."""
    bos = getattr(tokenizer, "bos_token", None) or ""
    heads = [bos if bos and text.startswith(bos) else "" for text in texts]
    tails = [text[len(head):][-CHARS_PER_TOKEN * max_tokens:] for head, text in zip(heads, texts)]
    out, cut = list(texts), {}
    for i, ids in enumerate(tokenizer(tails, add_special_tokens=False)["input_ids"]):
        keep = max_tokens - (1 if heads[i] else 0)
        if len(tails[i]) == len(texts[i]) - len(heads[i]) and len(ids) <= keep:
            continue
        if getattr(tokenizer, "is_fast", False):
            spans = tokenizer(tails[i], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            tail = tails[i][spans[-keep][0]:] if len(spans) > keep else tails[i]
        else:
            tail = tokenizer.decode(ids[-keep:])
        out[i], cut[i] = heads[i] + tail, len(texts[i])
    return out, cut


class MathTask:
    def __init__(self, train_file: str | None, test_file: str, tokenizer, *, max_new_tokens: int = 256,
                 chat: bool = True, system_prompt: str = "", prompt_template: str = "{prompt}", reward=None,
                 max_prompt_length: int = 0, prompt_key: str = PROMPT_KEY, label_key: str = LABEL_KEY):
        if "{prompt}" not in prompt_template:
            raise ValueError(f"task.prompt_template must contain {{prompt}}, got {prompt_template!r}")
        train = read_rows(train_file, prompt_key, label_key) if train_file is not None else []
        test = read_rows(test_file, prompt_key, label_key)
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.chat, self.system_prompt, self.prompt_template = chat, system_prompt, prompt_template
        self.rows = train + test
        self.n_train = len(train)
        self.prompt_texts = [self._render(row) for row in self.rows]
        self.notes = self._cut_long_prompts(max_prompt_length, train_file, test_file)
        self.ground_truths = [str(row["ground_truth"]) for row in self.rows]
        self.heldout_ids = torch.arange(len(train), len(self.rows))
        if reward is None:
            from .math_reward import MathReward

            reward = MathReward()
        self.reward = reward

    # -- prompts ---------------------------------------------------------------------------------
    def _messages(self, row: dict) -> list[dict] | None:
        """The conversation a row's prompt becomes, or None when it is used as plain text (no chat,
        or a prompt that already holds the template's special tokens)."""
        from ..models.hf import already_templated

        if "messages" in row:
            messages = list(row["messages"])
        else:
            text = self.prompt_template.format(prompt=row["prompt"])
            if not self.chat or already_templated(self.tokenizer, text):
                return None
            messages = [{"role": "user", "content": text}]
        if self.system_prompt and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def _render(self, row: dict) -> str:
        from ..models.hf import apply_chat_template

        messages = self._messages(row)
        if messages is None:
            return self.prompt_template.format(prompt=row["prompt"])
        return apply_chat_template(self.tokenizer, messages)

    def _cut_long_prompts(self, max_tokens: int, train_file: str | None, test_file: str) -> list[str]:
        """Cut `prompt_texts` to `max_tokens` tokens each (0: no limit); the one line that says which were cut."""
        if not max_tokens:
            return []
        self.prompt_texts, cut = keep_prompt_ends(self.prompt_texts, self.tokenizer, max_tokens)
        if not cut:
            return []
        places = {}
        for path, first, end in ((train_file, 0, self.n_train), (test_file, self.n_train, len(self.rows))):
            if path is not None and any(first <= i < end for i in cut):
                places.update({first + k: where for k, (where, _) in enumerate(iter_file_rows(path))})
        named = [f"{places.get(i, f'row {i}')} ({chars:,} characters)" for i, chars in sorted(cut.items())[:3]]
        more = f" and {len(cut) - 3} more" if len(cut) > 3 else ""
        return [f"task.max_prompt_length={max_tokens}: {len(cut)} of {len(self.rows)} prompts keep their last "
                f"{max_tokens} tokens (TRL's left truncation): {', '.join(named)}{more}"]

    def render_prompt(self, prompt: str) -> str:
        """A new question as the model is asked it in training (template, chat format)."""
        return self._render({"prompt": prompt})

    def prompts(self, ids: torch.Tensor) -> list[str]:
        return [self.prompt_texts[i] for i in ids.tolist()]

    def sample_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """`n` training rows drawn uniformly with replacement (never a test row)."""
        if not self.n_train:
            raise ValueError("this math task has no training rows (it was built without a train file)")
        return torch.randint(self.n_train, (n,), generator=generator)

    # -- the trainer's task protocol -------------------------------------------------------------
    def rollout(self, policy, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, repetition_penalty: float = 1.0, greedy: bool = False,
                generator: torch.Generator | None = None) -> Rollout:
        sampling = Sampling(temperature, top_k, top_p, min_p, repetition_penalty)
        return sample_text(policy, self.prompts(ids), self.max_new_tokens, sampling=sampling, greedy=greedy,
                           generator=generator)

    def completion_texts(self, rollout: Rollout) -> list[str]:
        """Each completion up to its first EOS, special tokens dropped."""
        rows = [c[m.bool()] for c, m in zip(rollout.completions.cpu(), rollout.mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def texts(self, ids: torch.Tensor, rollout: Rollout) -> tuple[list[str], list[str]]:
        return self.prompts(ids), self.completion_texts(rollout)

    def conversations(self, ids: torch.Tensor, rollout: Rollout) -> tuple[list, list]:
        """(prompts, completions) as TRL's reward functions get them: a chat row's prompt is its message
        list and its completion `[{"role": "assistant", "content": text}]`; a plain-text row keeps its texts."""
        prompts, completions = self.texts(ids, rollout)
        for k, i in enumerate(ids.tolist()):
            messages = self._messages(self.rows[i])
            if messages is not None:
                prompts[k], completions[k] = messages, [{"role": "assistant", "content": completions[k]}]
        return prompts, completions

    def reward_kwargs(self, ids: torch.Tensor) -> dict:
        """Every column of each row but its prompt (`prompt` / `messages`), as TRL passes a data set's
        columns to reward functions; `ground_truth` as text, None where a row lacks a column."""
        rows = [self.rows[i] for i in ids.tolist()]
        columns = {k: [row.get(k) for row in rows] for k in self.column_names}
        if "ground_truth" in columns:
            columns["ground_truth"] = [None if v is None else str(v) for v in columns["ground_truth"]]
        return columns

    def row_sources(self, ids: torch.Tensor) -> list[str | None] | None:
        """Each row's `data_source` as text (None for a row without one, or with an empty one), or None
        when no row of `ids` has one."""
        sources = [self.rows[i].get(SOURCE_KEY) for i in ids.tolist()]
        sources = [None if s is None or s == "" else str(s) for s in sources]
        return sources if any(s is not None for s in sources) else None

    @cached_property
    def column_names(self) -> list[str]:
        """The columns of any row but the prompt's, in the order they first appear."""
        return list(dict.fromkeys(k for row in self.rows for k in row if k not in ("prompt", "messages")))

    def score_rollout(self, ids: torch.Tensor, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Rewards (B,), correct flags (B,) and {"format_rate": (B,) well-formed flags}."""
        infos = self.check(ids.tolist(), self.completion_texts(rollout))
        require = getattr(self.reward, "require_format", True)
        rewards = torch.tensor([i.reward for i in infos], dtype=torch.float32)
        correct = torch.tensor([float(i.correct and (i.format_ok or not require)) for i in infos])
        return rewards, correct, {"format_rate": torch.tensor([float(i.format_ok) for i in infos])}

    def check(self, ids: list[int], completions: list[str]) -> list[RewardInfo]:
        """A RewardInfo per completion of rows `ids`: math-verify (`self.reward`, one batch) for math
        rows, the data set's scorer for reasoning-gym rows, with the same format and weights."""
        infos: list[RewardInfo | None] = [None] * len(ids)
        math_rows = [k for k, i in enumerate(ids) if not reasoning_gym.is_reasoning_gym_row(self.rows[i])]
        if math_rows:
            checked = self.reward.score([completions[k] for k in math_rows], [self.ground_truths[ids[k]] for k in math_rows])
            for k, info in zip(math_rows, checked):
                infos[k] = info
        weights = {name: getattr(self.reward, name) for name in ("format_weight", "correct_weight", "require_format")
                   if hasattr(self.reward, name)}
        for k, i in enumerate(ids):
            if infos[k] is None:
                infos[k] = reasoning_gym.check(completions[k], self.rows[i], **weights)
        return infos
