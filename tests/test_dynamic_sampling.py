"""algo.dynamic_sampling (DAPO): groups whose rewards tie are dropped and more batches sampled until a
batch of informative groups is kept; the rollout rows of several batches joined with their padding."""

import json
import math

import pytest
import torch

from lmrl.config import ConfigError
from lmrl.generation.agent import AgentRollout
from lmrl.generation.rollout import Rollout, cat_rollouts, select_rows
from lmrl.train.dynamic_sampling import Scored, informative, keep_informative
from lmrl.train.rl_trainer import RLTrainer

from .conftest import TINY
from lmrl.config import load_config

T = torch.tensor


def test_a_group_is_informative_when_its_scored_rewards_differ():
    rewards = T([1.0, 0.0, 1.0, 1.0, math.nan, 0.5, math.nan, math.nan, math.nan, 0.0, 0.0, 0.0])
    assert informative(rewards, 2).tolist() == [True, False, False, False, False, False]
    assert informative(rewards, 2).tolist()[2] is False  # (NaN, 0.5): one scored reward teaches nothing
    assert informative(rewards, 3).tolist() == [True, True, False, False]  # (1, NaN, 0.5): the NaN left out
    assert informative(T([0.0, 0.0, 0.0, 2.0]), 4).tolist() == [True]
    with pytest.raises(ValueError, match="one per token"):
        informative(torch.zeros(4, 3), 2)


def _rollout(prompt_len: int, lengths: list[int], start: int) -> Rollout:
    """Rows whose prompt is `prompt_len` ids (left-padded by one where the row is odd) and whose
    completion has `lengths[i]` real tokens, every id numbered from `start`."""
    n, width = len(lengths), max(lengths)
    prompts = torch.arange(start, start + n * prompt_len).view(n, prompt_len)
    prompt_mask = torch.ones(n, prompt_len, dtype=torch.long)
    prompt_mask[1::2, 0] = 0
    mask = (torch.arange(width)[None, :] < T(lengths)[:, None]).float()
    completions = (torch.arange(n * width).view(n, width) + 1000 + start) * mask.long()
    return Rollout(prompts, completions, completions.float() / 10, mask, prompt_mask=prompt_mask,
                   truncated=T([w == width for w in lengths]))


def test_rows_of_several_rollouts_join_padded_on_each_side():
    a, b = _rollout(3, [2, 1], 0), _rollout(5, [4, 3], 100)
    ro = cat_rollouts([a, b])
    assert ro.prompts.shape == (4, 5) and ro.completions.shape == (4, 4)
    assert ro.prompts[0].tolist() == [0, 0, 0, 1, 2] and ro.prompt_mask[0].tolist() == [0, 0, 1, 1, 1]  # left
    assert ro.prompt_mask[1].tolist() == [0, 0, 0, 1, 1]
    assert ro.completions[0].tolist() == a.completions[0].tolist() + [0, 0]  # right
    assert ro.mask.tolist()[0] == [1, 1, 0, 0] and ro.mask[2:].tolist() == b.mask.tolist()
    assert ro.logprobs[1].tolist() == a.logprobs[1].tolist() + [0.0, 0.0]
    assert ro.truncated.tolist() == [True, False, True, False]
    # the joined rows are the parts' rows: the same real tokens in the same places of their sequences
    for i, (part, j) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1)]):
        keep = ro.attention_mask[i].bool()
        assert ro.sequences[i][keep].tolist() == part.sequences[j][part.attention_mask[j].bool()].tolist() + \
            [0] * (keep.sum().item() - part.attention_mask[j].sum().item())
    picked = select_rows(ro, [3, 0])
    assert picked.prompts.tolist() == [ro.prompts[3].tolist(), ro.prompts[0].tolist()]
    assert picked.truncated.tolist() == [False, True] and picked.staleness == ro.staleness


def test_an_agent_rollouts_per_episode_records_join_too():
    def episodes(name: str) -> AgentRollout:
        base = _rollout(2, [2, 2], 0)
        return AgentRollout(base.prompts, base.completions, base.logprobs, base.mask, prompt_mask=base.prompt_mask,
                            rewards=T([1.0, 0.0]), infos=[{"turns": 1, "id": f"{name}0"}, {"turns": 2, "id": f"{name}1"}],
                            transcripts=[[], []], failed=T([False, True]), openings=[1, 2], final_rewards=[None, 1.0])

    ro = cat_rollouts([episodes("a"), select_rows(episodes("b"), [1])])
    assert isinstance(ro, AgentRollout) and [i["id"] for i in ro.infos] == ["a0", "a1", "b1"]
    assert ro.rewards.tolist() == [1.0, 0.0, 0.0] and ro.failed.tolist() == [False, True, True]
    assert ro.openings == [1, 2, 2] and ro.final_rewards == [None, 1.0, 1.0]


def _scored(rewards: list[float], start: int) -> Scored:
    n = len(rewards)
    return Scored(torch.arange(start, start + n), _rollout(2, [1] * n, start), T(rewards), T(rewards),
                  {"format_rate": torch.ones(n)} if start else {}, {"judge": [f"{start + i}" for i in range(n)]})


def test_informative_groups_are_kept_in_sampling_order_then_tied_ones_fill_the_batch():
    first = _scored([1, 1, 0, 1, 0, 0], 0)  # groups of 2: tied, informative, tied
    second = _scored([0, 1, 1, 1, 1, 0], 10)  # informative, tied, informative
    batch, stats = keep_informative([first, second], 3, 2)
    assert batch.ids.tolist() == [2, 3, 10, 11, 14, 15]
    assert stats == {"rollout/sample_batches": 2.0, "rollout/informative_frac": 0.5}
    assert batch.columns == {"judge": ["2", "3", "10", "11", "14", "15"]}
    assert batch.extras["format_rate"][:2].isnan().all() and batch.extras["format_rate"][2:].tolist() == [1.0] * 4
    short, stats = keep_informative([first], 2, 2)  # out of batches: a tied group fills the batch
    assert short.ids.tolist() == [0, 1, 2, 3] and stats["rollout/informative_frac"] == pytest.approx(1 / 3)


def _rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "rollout/sample_batches" in r]


def test_grpo_samples_until_its_batch_holds_groups_that_differ(tiny_config):
    calls = []

    def coin(prompts, completions, **kwargs):  # tied groups half the time: a group of 2 differs with p = 1/2
        calls.append(len(completions))
        return [float(torch.rand(()).item() < 0.5) for _ in completions]

    torch.manual_seed(0)
    cfg = tiny_config("algo.name=grpo", "algo.group_size=2", "algo.dynamic_sampling=true", "algo.max_sample_batches=50",
                      "train.steps=2", "train.eval_every=2", "sft.steps=0")
    RLTrainer(cfg, reward_funcs=coin).train()
    rows = _rows(cfg.run_dir)
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/sample_batches"] >= 2 and row["frac_reward_zero_std"] == 0.0  # only groups that differ
    assert sum(calls) == 16 * sum(r["rollout/sample_batches"] for r in rows)  # every sampled batch was scored

    capped = tiny_config("algo.name=grpo", "algo.group_size=2", "algo.dynamic_sampling=true",
                         "algo.max_sample_batches=1", "train.steps=1", "train.eval_every=1", "sft.steps=0",
                         dir=cfg.run_dir.parent / "capped")
    RLTrainer(capped, reward_funcs=lambda prompts, completions, **kw: [1.0] * len(completions)).train()
    row, = _rows(capped.run_dir)  # every group ties: one batch, trained as it is
    assert row["rollout/sample_batches"] == 1.0 and row["rollout/informative_frac"] == 0.0
    assert row["frac_reward_zero_std"] == 1.0


@pytest.mark.parametrize("overrides, message", [
    (["algo.dynamic_sampling=true"], "algo.dynamic_sampling keeps the groups whose rewards differ: it needs "
                                     "algo.group_size > 1, got 1"),
    (["algo.name=grpo", "algo.group_size=2", "algo.dynamic_sampling=true", "rollout.overlap=true"],
     "algo.dynamic_sampling samples more batches within a step; rollout.overlap"),
    (["algo.max_sample_batches=0"], "algo.max_sample_batches"),
])
def test_dynamic_sampling_settings_that_cannot_work_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("adder", TINY + overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
