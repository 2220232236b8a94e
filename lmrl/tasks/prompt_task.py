"""Open prompts scored by a learned reward: RLHF's task. Rows are `{"prompt": str}` or
`{"messages": [...]}` (other columns reach reward functions, as in TRL, and are otherwise ignored);
the reward of a completion is a reward model's score of prompt + completion (`reward.model`), or a
custom reward (`reward.cls`).

    task = PromptTask("prompts/train.jsonl", "prompts/test.jsonl", tokenizer,
                      scorer=RewardModelScorer("runs/rm-smollm2/reward_model"))

Open prompts have no right answer, so `eval/accuracy` is 0 by definition: the held-out measure is
`eval/reward` (the mean score of greedy completions), which a preset names as `train.best_metric`.
Prompts are rendered like MathTask's (chat template, `prompt_template`, `system_prompt`)."""

from __future__ import annotations

import torch

from ..data import read_jsonl
from .math_task import MathTask
from .rewards import call_reward_fn


class PromptTask(MathTask):
    def __init__(self, train_file: str, test_file: str, tokenizer, *, scorer, max_new_tokens: int = 64,
                 chat: bool = True, system_prompt: str = "", prompt_template: str = "{prompt}"):
        if "{prompt}" not in prompt_template:
            raise ValueError(f"task.prompt_template must contain {{prompt}}, got {prompt_template!r}")
        alternatives = [["prompt"], ["messages"]]
        train = read_jsonl(train_file, alternatives=alternatives)
        test = read_jsonl(test_file, alternatives=alternatives)
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.chat, self.system_prompt, self.prompt_template = chat, system_prompt, prompt_template
        self.rows = train + test
        self.prompt_texts = [self._render(row) for row in self.rows]
        self.n_train = len(train)
        self.heldout_ids = torch.arange(len(train), len(self.rows))
        self.reward = scorer

    @property
    def reward_model(self) -> torch.nn.Module | None:
        """The reward model that scores completions (None for a custom `reward.cls`)."""
        return getattr(self.reward, "model", None)

    def score_rollout(self, ids: torch.Tensor, rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Rewards (B,) from the scorer, checked like any reward function's; no exact match (zeros)."""
        rewards = call_reward_fn(self.reward, *self.texts(ids, rollout), {})
        return rewards, torch.zeros(len(ids)), {}
