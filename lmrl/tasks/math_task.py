"""Math reasoning from JSONL: a Hugging Face policy answers text prompts; math-verify checks them.

    task = MathTask("train.jsonl", "test.jsonl", tokenizer, prompt_template=FORMAT_INSTRUCTION)
    ro = task.rollout(policy, task.sample_train_ids(8, gen), temperature=1.0)
    rewards, correct, extras = task.score_rollout(ids, ro)          # extras: {"format_rate": (B,) 0/1}

Rows are `{"prompt": str, "ground_truth": str}` or `{"messages": [...], "ground_truth": str}`.
A plain prompt is put into `prompt_template` and, with `chat`, becomes the user message of a
conversation (after `system_prompt`, if any) rendered by the tokenizer's chat template; a
prompt that already holds the template's special tokens (e.g. `<|im_start|>`) is used as it is.
`messages` rows are always rendered with the chat template. Every prompt is rendered once, here.

Ids. Training rows are numbered 0..T-1 and test rows T..T+H-1, so, as for the arithmetic tasks,
a problem id says which split it belongs to: `sample_train_ids` draws from the first range only
and `heldout_ids` is the second.

Scoring. `MathReward` gives the reward (format and correctness weights from the config) and the
exact-match flag we report as accuracy: the answer is correct, and well-formed when the reward
requires it. A custom reward (`reward.cls`) replaces the reward only; accuracy stays math-verify's.
"""

from __future__ import annotations

import torch

from ..data import read_jsonl
from ..rollout.local import Rollout, sample_text

FORMAT_INSTRUCTION = ("{prompt}\nThink it through inside <think> </think>, then write only the final number "
                      "inside <answer> </answer>.")


class MathTask:
    def __init__(self, train_file: str, test_file: str, tokenizer, *, max_new_tokens: int = 256, chat: bool = True,
                 system_prompt: str = "", prompt_template: str = "{prompt}", reward=None):
        if "{prompt}" not in prompt_template:
            raise ValueError(f"task.prompt_template must contain {{prompt}}, got {prompt_template!r}")
        required, alternatives = ["ground_truth"], [["prompt"], ["messages"]]
        train = read_jsonl(train_file, required, alternatives=alternatives)
        test = read_jsonl(test_file, required, alternatives=alternatives)
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.chat, self.system_prompt, self.prompt_template = chat, system_prompt, prompt_template
        self.rows = train + test
        self.prompt_texts = [self._render(row) for row in self.rows]
        self.ground_truths = [str(row["ground_truth"]) for row in self.rows]
        self.n_train = len(train)
        self.heldout_ids = torch.arange(len(train), len(self.rows))
        if reward is None:
            from .math_reward import MathReward

            reward = MathReward()
        self.reward = reward

    # -- prompts ---------------------------------------------------------------------------------
    def _render(self, row: dict) -> str:
        from ..models.hf import already_templated, apply_chat_template

        if "messages" in row:
            messages = list(row["messages"])
        else:
            text = self.prompt_template.format(prompt=row["prompt"])
            if not self.chat or already_templated(self.tokenizer, text):
                return text
            messages = [{"role": "user", "content": text}]
        if self.system_prompt and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return apply_chat_template(self.tokenizer, messages)

    def render_prompt(self, prompt: str) -> str:
        """A new question as the model is asked it in training (template, chat format)."""
        return self._render({"prompt": prompt})

    def prompts(self, ids: torch.Tensor) -> list[str]:
        return [self.prompt_texts[i] for i in ids.tolist()]

    def sample_train_ids(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """`n` training rows drawn uniformly with replacement (never a test row)."""
        return torch.randint(self.n_train, (n,), generator=generator)

    # -- the trainer's task protocol -------------------------------------------------------------
    def rollout(self, policy, ids: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, greedy: bool = False,
                generator: torch.Generator | None = None) -> Rollout:
        return sample_text(policy, self.prompts(ids), self.max_new_tokens, temperature=temperature, top_k=top_k,
                           greedy=greedy, generator=generator)

    def completion_texts(self, rollout: Rollout) -> list[str]:
        """Each completion up to its first EOS, special tokens dropped."""
        rows = [c[m.bool()] for c, m in zip(rollout.completions.cpu(), rollout.mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def texts(self, ids: torch.Tensor, rollout: Rollout) -> tuple[list[str], list[str]]:
        return self.prompts(ids), self.completion_texts(rollout)

    def reward_kwargs(self, ids: torch.Tensor) -> dict:
        """Extra columns a reward function receives, TRL-style: `ground_truth`."""
        return {"ground_truth": [self.ground_truths[i] for i in ids.tolist()]}

    def score_rollout(self, ids: torch.Tensor, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Rewards (B,), correct flags (B,) and {"format_rate": (B,) well-formed flags}."""
        infos = self.reward.score(self.completion_texts(rollout), self.reward_kwargs(ids)["ground_truth"])
        require = getattr(self.reward, "require_format", True)
        rewards = torch.tensor([i.reward for i in infos], dtype=torch.float32)
        correct = torch.tensor([float(i.correct and (i.format_ok or not require)) for i in infos])
        return rewards, correct, {"format_rate": torch.tensor([float(i.format_ok) for i in infos])}
