"""TRL's metric names, logged beside lmrl's own and computed as TRL computes them: a GRPO step's
(reward, reward_std, frac_reward_zero_std, rewards/<name>/*, num_tokens, completions/*, entropy, kl,
clip_ratio/*, loss, grad_norm, learning_rate, and what reward functions log with log_metric), a
DPO step's (loss, rewards/*, logps/*, logits/*, entropy, mean_token_accuracy, num_tokens, grad_norm,
learning_rate) and an SFT step's (loss, entropy, mean_token_accuracy, num_tokens, grad_norm,
learning_rate). Each value is checked against a hand-computed one on a small case (the token
diagnostics' values against TRL's own in tests/test_trl_parity.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmrl.algos.losses import clipped_surrogate_loss
from lmrl.log.plot import FAMILIES, is_rate
from lmrl.tasks.arithmetic import seq_len
from lmrl.train.dpo_trainer import DPOTrainer
from lmrl.train.rl_trainer import RLTrainer
from lmrl.train.sft_trainer import SFTTrainer
from tests.test_offline_trainers import _cfg, data  # noqa: F401  (the fixture: a tiny Llama and preference pairs)

GRPO_NAMES = ["reward", "reward_std", "frac_reward_zero_std", "rewards/fixed_rewards/mean",
              "rewards/fixed_rewards/std", "num_tokens", "completions/mean_length", "completions/min_length",
              "completions/max_length", "completions/clipped_ratio", "completions/mean_terminated_length",
              "completions/min_terminated_length", "completions/max_terminated_length", "entropy", "kl",
              "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max",
              "clip_ratio/region_mean", "loss", "grad_norm", "learning_rate"]
DPO_NAMES = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
             "logps/rejected", "logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy", "num_tokens",
             "grad_norm", "learning_rate"]
SFT_NAMES = ["loss", "entropy", "mean_token_accuracy", "num_tokens", "grad_norm", "learning_rate"]


def fixed_rewards(completions, log_metric, log_extra, **kwargs):
    """1, 0 | 1, 1 in groups of two, whatever the completions; logs a metric twice per call."""
    log_metric("judge/calls", len(completions))
    log_metric("judge/calls", 0)
    log_extra("verdict", ["ok"] * len(completions))
    return [1.0, 0.0, 1.0, 1.0]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_grpo_step_logs_trls_names_with_trls_numbers(tiny_config):
    cfg = tiny_config("sft.steps=0", "train.steps=2", "train.rollout_size=4", "algo.name=grpo", "algo.group_size=2",
                      "algo.kl_coef=0.05", "algo.loss_level=token", "train.eval_every=100")
    trainer = RLTrainer(cfg, reward_funcs=[fixed_rewards])
    trainer.train()
    steps = [r for r in _rows(cfg.run_dir) if "train/loss" in r]
    assert len(steps) == 2
    for k, row in enumerate(steps, start=1):
        assert all(name in row for name in GRPO_NAMES), [name for name in GRPO_NAMES if name not in row]
        # rewards 1, 0 | 1, 1: mean 0.75, sample std 0.5; one group of two has std 0
        assert row["reward"] == row["rewards/fixed_rewards/mean"] == row["train/avg_reward"] == 0.75
        assert row["reward_std"] == pytest.approx(0.5) and row["rewards/fixed_rewards/std"] == pytest.approx(0.5)
        assert row["frac_reward_zero_std"] == 0.5
        # every prompt and answer token sampled so far: 2-digit addition, 4 completions per step
        assert row["num_tokens"] == k * 4 * seq_len(cfg.task)
        answer = trainer.task.answer_len  # fixed-length answers: none is cut off
        assert [row[f"completions/{s}_length"] for s in ("mean", "min", "max")] == [answer] * 3
        assert [row[f"completions/{s}_terminated_length"] for s in ("mean", "min", "max")] == [answer] * 3
        assert row["completions/clipped_ratio"] == 0.0
        # one on-policy pass: the ratio is 1, nothing is clipped
        assert all(row[f"clip_ratio/{s}"] == 0.0 for s in ("low_mean", "low_min", "high_mean", "high_max",
                                                             "region_mean"))
        # token-level loss: TRL's token means are lmrl's aggregates
        assert row["entropy"] == pytest.approx(row["train/entropy"]) and row["kl"] == pytest.approx(row["train/kl"])
        assert (row["loss"], row["grad_norm"], row["learning_rate"]) == \
            (row["train/loss"], row["train/grad_norm"], row["train/lr"])
        assert row["judge/calls"] == 2.0  # log_metric's values averaged over the step: (4 + 0) / 2
    assert steps[0]["kl"] == 0.0  # the reference is the policy before the first update


def test_the_loss_reports_trls_clip_ratios():
    # row 0 (A < 0): ratios 0.5, 1, 1.5, 1 → one token below 1 − 0.2; row 1 (A > 0): 1.3, 0.7, 1, pad
    ratios = torch.tensor([[0.5, 1.0, 1.5, 1.0], [1.3, 0.7, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    _, stats = clipped_surrogate_loss(ratios.log(), torch.zeros(2, 4), torch.tensor([-1.0, 1.0]), mask)
    assert stats["clip_ratio/low_mean"] == pytest.approx(1 / 7)  # of the 7 valid tokens, one each way
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 7)
    assert stats["clip_ratio/region_mean"] == stats["clip_frac"] == pytest.approx(2 / 7)
    assert stats["clip_ratio/low_min"] == 0.0  # row 1 has none clipped low
    assert stats["clip_ratio/high_max"] == pytest.approx(1 / 3)  # row 1: one of its three tokens


def tokens_so_far(trainer, steps: int) -> list[int]:
    """TRL's num_tokens after each of the first `steps` steps: each pair's prompt twice (a row per side)
    and both replies, or each SFT row's tokens."""
    per_step = []
    for step in range(steps):
        pairs = [trainer.pair(row) for row in trainer.batch_rows(step)] if hasattr(trainer, "pair") else None
        per_step.append(sum(2 * len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs) if pairs else
                        sum(len(row.ids) for row in trainer.batch_rows(step)))
    return [sum(per_step[:k + 1]) for k in range(steps)]


def test_a_dpo_step_logs_trls_names(data, tmp_path):  # noqa: F811
    trainer = DPOTrainer(_cfg(data, tmp_path / "run", "dpo", "lora.r=4", "train.max_steps=2", "train.eval_every=100"))
    trainer.train()
    rows = _rows(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        assert all(name in row for name in DPO_NAMES), [name for name in DPO_NAMES if name not in row]
        assert row["loss"] == pytest.approx(row["dpo/loss"], abs=1e-6)
        assert (row["grad_norm"], row["learning_rate"]) == (row["dpo/grad_norm"], row["dpo/lr"])
        assert row["rewards/margins"] == pytest.approx(row["rewards/chosen"] - row["rewards/rejected"], abs=1e-6)
        assert 0 <= row["mean_token_accuracy"] <= 1 and 0 < row["entropy"] <= math.log(trainer.model.config.vocab_size)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy = reference at the first step
    assert [row["num_tokens"] for row in rows] == tokens_so_far(trainer, 2)
    evaluated = rows[-1]  # the last step evaluates: the same names, eval/num_tokens the training tokens so far
    assert all(f"eval/{name}" in evaluated for name in ("entropy", "logits/chosen", "logits/rejected",
                                                        "mean_token_accuracy"))
    assert evaluated["eval/num_tokens"] == evaluated["num_tokens"]


def test_an_sft_step_logs_trls_names(data, tmp_path):  # noqa: F811
    trainer = SFTTrainer(_cfg(data, tmp_path / "run", "sft", "lora.r=4", "train.max_steps=2", "train.eval_every=100"))
    trainer.train()
    rows = _rows(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        assert all(name in row for name in SFT_NAMES), [name for name in SFT_NAMES if name not in row]
        assert row["mean_token_accuracy"] == pytest.approx(row["sft/token_accuracy"])  # one micro-batch: the same
        assert 0 < row["entropy"] <= math.log(trainer.model.config.vocab_size)
    assert [row["num_tokens"] for row in rows] == tokens_so_far(trainer, 2)
    assert rows[-1]["eval/num_tokens"] == rows[-1]["num_tokens"] and "eval/entropy" in rows[-1]


def test_plots_put_trls_rates_with_the_rates_and_its_learning_rate_with_the_learning_rates():
    assert all(is_rate(k) for k in ("frac_reward_zero_std", "clip_ratio/low_mean", "completions/clipped_ratio"))
    assert not is_rate("learning_rate") and not is_rate("reward_std")
    lr = next(belongs for stem, _, _, belongs in FAMILIES if stem == "lr")
    assert lr("learning_rate") and lr("train/lr")
    assert is_rate("mean_token_accuracy") and is_rate("eval/mean_token_accuracy")
    evaluation = next(belongs for stem, _, _, belongs in FAMILIES if stem == "eval")
    assert evaluation("eval/entropy") and not evaluation("eval/num_tokens")  # a count, not a held-out value
