"""Open prompts scored by a learned reward (RLHF's task) or by reward functions (TRL's GRPO on a
prompt data set). Rows are `{"prompt": str}` or `{"messages": [...]}` in a JSONL or parquet file, or
other layouts as `common.data.prompt_row` reads them (verl's message-list `prompt` and
`reward_model.ground_truth`; `prompt_key` / `label_key`); other columns reach reward functions, as
in TRL, and are otherwise ignored. The reward of a completion is a reward model's
score of prompt + completion (`reward.model`), a custom reward (`reward.cls`: an instance that is a
reward function, called as `reward.funcs` entries are in whichever style its signature shows, TRL's,
lmrl's positional, verl's compute_score or OpenRLHF's reward_func, its extra values logged alike), or
the weighted sum of the trainer's reward functions (`score_with`, for training and held-out prompts
alike).

    task = PromptTask("prompts/train.jsonl", "prompts/test.jsonl", tokenizer,
                      scorer=RewardModelScorer("runs/rm-smollm2/reward_model"))

Open prompts have no right answer, so `eval/accuracy` is 0 by definition: the held-out measure is
`eval/reward` (the mean score of greedy completions), which a preset names as `train.best_metric`.
Prompts are rendered and cut to `max_prompt_length` like MathTask's (chat template, `prompt_template`,
`system_prompt`), and a row's `data_source` is its source (`row_sources`), as there."""

from __future__ import annotations

import torch

from ..common.data import LABEL_KEY, PROMPT_KEY, DataError, prompt_row, read_jsonl
from .math_task import MathTask
from .preference_data import iter_rows
from .rewards import RewardFunctions, RewardModelScorer, TrainerState, call_reward_fn


class PromptTask(MathTask):
    def __init__(self, train_file: str, test_file: str, tokenizer, *, scorer, max_new_tokens: int = 64,
                 chat: bool = True, system_prompt: str = "", prompt_template: str = "{prompt}",
                 max_prompt_length: int = 0, prompt_key: str = PROMPT_KEY, label_key: str = LABEL_KEY):
        if "{prompt}" not in prompt_template:
            raise ValueError(f"task.prompt_template must contain {{prompt}}, got {prompt_template!r}")
        alternatives, shape = [["prompt"], ["messages"]], lambda row: prompt_row(row, prompt_key, label_key)
        train = read_jsonl(train_file, alternatives=alternatives, shape=shape)
        test = read_jsonl(test_file, alternatives=alternatives, shape=shape)
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.chat, self.system_prompt, self.prompt_template = chat, system_prompt, prompt_template
        self.rows = train + test
        self.n_train = len(train)
        self.prompt_texts = [self._render(row) for row in self.rows]
        self.notes = self._cut_long_prompts(max_prompt_length, train_file, test_file)
        self.heldout_ids = torch.arange(len(train), len(self.rows))
        # any scorer but a reward model is a reward function (reward.cls), called as reward.funcs are
        self.reward = scorer if scorer is None or isinstance(scorer, RewardModelScorer) else RewardFunctions.of(scorer)

    @property
    def reward_model(self) -> torch.nn.Module | None:
        """The reward model that scores completions (None for reward functions or a custom `reward.cls`)."""
        return getattr(self.reward, "model", None)

    def score_with(self, reward_fn) -> None:
        """Score completions with `reward_fn` (reward functions as `lmrl.tasks.rewards` calls them) when
        no reward model or class was given."""
        self.reward = RewardFunctions.of(reward_fn)

    def score_rollout(self, ids: torch.Tensor, rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Rewards (B,) from the scorer, checked like any reward function's; no exact match (zeros); extras:
        with reward functions (or `reward.cls`), each one's rewards as "rewards/<name>/mean" and the values a
        verl or OpenRLHF one returned beside them as "rewards/<name>/<key>" (evaluation's eval/rewards/...)."""
        if self.reward is None:
            raise RuntimeError("PromptTask has no reward: give it a scorer, or reward functions with score_with")
        if isinstance(self.reward, RewardFunctions):
            rewards, per_function = self.reward.score(self, ids, rollout, TrainerState(0, 0))
            return rewards, torch.zeros(len(ids)), per_function
        rewards = call_reward_fn(self.reward, *self.texts(ids, rollout), {})
        return rewards, torch.zeros(len(ids)), {}


def prompt_rows(source) -> list[dict]:
    """Rows of a prompt data set as TRL's GRPO takes them (a `datasets.Dataset`, a list of dicts or a
    JSONL path) in the form the text tasks read (`prompt_row`, the rule task files are read by): a
    conversational `prompt` (a message list) becomes `messages`, rendered with the chat template; a
    text `prompt` is used as it is; verl's `reward_model.ground_truth` becomes `ground_truth`; every
    other column is kept for the reward functions. Errors name the row and the field."""
    rows = []
    for where, row in iter_rows(source):
        prompt = row.get("prompt", row.get("messages"))
        if not isinstance(prompt, (str, list)):
            got = "no 'prompt' column" if prompt is None else f"'prompt' is a {type(prompt).__name__}"
            raise DataError(f"{where}: a prompt data set needs a 'prompt' (text or a message list), {got} "
                            f"(the row has keys: {', '.join(map(repr, row))})")
        try:
            rows.append(prompt_row(row))
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
    return rows
