"""Evaluation through lmrl.trl as TRL does it, checked against TRL's own trainers run on the same tiny model:
several held-out sets (`eval_dataset={"a": ..., "b": ...}`: one log entry per set, `eval_<set>_loss`,
`metric_for_best_model` naming one set's metric) and GRPO's evaluation statistics under TRL's names."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset

from lmrl.common.errors import ConfigError
from lmrl.trl import (DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RewardConfig, RewardTrainer, SFTConfig,
                      SFTTrainer)
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-eval-sets")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


@pytest.fixture(scope="module")
def varied_model_dir(model_dir, tmp_path_factory):
    """The tiny Llama with its weights moved at random (seed 1), so its greedy completions differ from prompt to
    prompt, and its end token's (tied) embedding 1.05 times that of a token it often picks, so some completions
    end before the length limit, at different lengths."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("trl-eval-varied") / "model"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.16)
        embeddings = model.get_input_embeddings().weight
        embeddings[tokenizer.eos_token_id] = 1.05 * embeddings[31]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


SFT_A = Dataset.from_list([{"prompt": f"Q{i}?", "completion": f" answer {i}"} for i in range(8)])
SFT_B = Dataset.from_list([{"prompt": f"Tell me {w}.", "completion": f" {w} is a word"}
                           for w in ("cats", "dogs", "tea")])
PAIRS_A = Dataset.from_list([{"prompt": f"Q{i}?", "chosen": f" yes {i}", "rejected": f" no {i}"} for i in range(8)])
PAIRS_B = Dataset.from_list([{"prompt": f"Is {w} good?", "chosen": f" {w} is good", "rejected": " no"}
                             for w in ("tea", "rain", "snow")])
KINDS = {"sft": (SFTTrainer, SFTConfig, SFT_A, SFT_B), "dpo": (DPOTrainer, DPOConfig, PAIRS_A, PAIRS_B),
         "reward": (RewardTrainer, RewardConfig, PAIRS_A, PAIRS_B)}
# what transformers adds to every evaluation besides its metrics (the shim times no evaluation: no eval_*_runtime)
SPEED = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time", "epoch")


def args_for(cls, out, **kwargs):
    return cls(**{"output_dir": str(out), "per_device_train_batch_size": 4, "max_steps": 1, "logging_steps": 1,
                  "report_to": "none", "bf16": False, "use_cpu": True, "save_strategy": "no", **kwargs})


def trl_trainer(kind, model_dir, out, **kwargs):
    """TRL's own trainer of `kind` on the same rows, with eval_dataset={"a": ..., "b": ...}."""
    import trl

    _, _, a, b = KINDS[kind]
    cls = {"sft": trl.SFTTrainer, "dpo": trl.DPOTrainer, "reward": trl.RewardTrainer}[kind]
    config = {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "reward": trl.RewardConfig}[kind]
    return cls(model=str(model_dir), args=args_for(config, out, **kwargs), train_dataset=a,
               eval_dataset={"a": a, "b": b})


def evaluations(log_history) -> list[dict]:
    return [e for e in log_history if any(k.startswith("eval_") for k in e)]


# -- several held-out sets ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sft", "dpo", "reward"])
def test_each_held_out_set_is_evaluated_under_its_name_as_trls(kind, model_dir, tmp_path):
    cls, config, a, b = KINDS[kind]
    theirs = trl_trainer(kind, model_dir, tmp_path / "trl")
    trl_metrics = theirs.evaluate()  # before lmrl's args are made (TrainingArguments reset accelerate's state)
    ours = cls(model=str(model_dir), args=args_for(config, tmp_path / "lmrl"), train_dataset=a,
               eval_dataset={"a": a, "b": b})
    metrics = ours.evaluate()  # both at the starting weights
    # one log entry per set, in the dict's order, each holding every name TRL's entry holds
    trl_entries, entries = evaluations(theirs.state.log_history), evaluations(ours.state.log_history)
    assert [("eval_a_loss" in e, "eval_b_loss" in e) for e in entries] == [(True, False), (False, True)]
    assert [("eval_a_loss" in e, "eval_b_loss" in e) for e in trl_entries] == [(True, False), (False, True)]
    for trl_entry, entry in zip(trl_entries, entries):
        assert {k for k in trl_entry if not k.endswith(SPEED)} <= set(entry)
    assert {k for k in trl_metrics if not k.endswith(SPEED)} <= set(metrics)
    # each set's loss is TRL's on that set (the reward model's new score head starts at random, TRL's and lmrl's
    # differently); a metric TRL leaves without a set's name is the last set's, as in TRL
    for name in ("eval_a_loss", "eval_b_loss") if kind != "reward" else ():
        assert metrics[name] == pytest.approx(trl_metrics[name], abs=1e-5)
    per_set = [{k[7:]: v for k, v in metrics.items() if k.startswith(f"eval_{name}_")} for name in "ab"]
    assert per_set[0].keys() == per_set[1].keys() and per_set[0] != per_set[1]
    single = cls(model=str(model_dir), args=args_for(config, tmp_path / "single"), train_dataset=a, eval_dataset=b)
    alone = single.evaluate()
    assert alone["eval_loss"] == pytest.approx(metrics["eval_b_loss"], abs=1e-6)
    for key, value in alone.items():  # lmrl also names every other metric with its set: eval_b_<metric>
        assert metrics[f"eval_b_{key.removeprefix('eval_')}"] == pytest.approx(value, abs=1e-6)
        if key != "eval_loss":
            assert metrics[key] == pytest.approx(value, abs=1e-6)


def test_each_evaluation_in_training_logs_and_calls_on_evaluate_once_per_set(model_dir, tmp_path):
    from transformers import TrainerCallback

    class Seen(TrainerCallback):
        def __init__(self):
            self.evaluated = []

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            self.evaluated.append((state.global_step, sorted(k for k in metrics if k.endswith("_loss"))))

    kwargs = dict(max_steps=2, eval_strategy="steps", eval_steps=1, metric_for_best_model="eval_b_loss")
    theirs, seen_trl = trl_trainer("sft", model_dir, tmp_path / "trl", **kwargs), Seen()
    theirs.add_callback(seen_trl)
    theirs.train()
    seen = Seen()
    ours = SFTTrainer(model=str(model_dir), args=args_for(SFTConfig, tmp_path / "lmrl", **kwargs), train_dataset=SFT_A,
                      eval_dataset={"a": SFT_A, "b": SFT_B}, callbacks=[seen])
    ours.train()
    assert seen.evaluated == seen_trl.evaluated == [(1, ["eval_a_loss"]), (1, ["eval_b_loss"]), (2, ["eval_a_loss"]),
                                                    (2, ["eval_b_loss"])]
    # metric_for_best_model names one set: the best is that set's lowest loss, as in transformers
    b_losses = [e["eval_b_loss"] for e in ours.state.log_history if "eval_b_loss" in e]
    a_losses = [e["eval_a_loss"] for e in ours.state.log_history if "eval_a_loss" in e]
    assert ours.state.best_metric == min(b_losses) != min(a_losses)
    assert theirs.state.best_metric == min(e["eval_b_loss"] for e in theirs.state.log_history if "eval_b_loss" in e)


def test_a_best_metric_that_names_no_held_out_set_is_refused_in_one_line(model_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        SFTTrainer(model=str(model_dir), args=args_for(SFTConfig, tmp_path, metric_for_best_model="eval_loss"),
                   train_dataset=SFT_A, eval_dataset={"a": SFT_A, "b": SFT_B})
    assert "eval/a_loss" in str(e.value) and "eval_a_loss" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="names no held-out set"):
        SFTTrainer(model=str(model_dir), args=args_for(SFTConfig, tmp_path / "c", metric_for_best_model="eval_c_loss"),
                   train_dataset=SFT_A, eval_dataset={"a": SFT_A, "b": SFT_B})
    # a set's name with a metric the trainer does not report: its names are known, each set's listed
    with pytest.raises(ConfigError, match="metric_for_best_model='eval_a_margins'.*eval_a_margin, .*eval_b_margin"):
        RewardTrainer(model=str(model_dir), args=args_for(RewardConfig, tmp_path / "rm",
                                                          metric_for_best_model="eval_a_margins"),
                      train_dataset=PAIRS_A, eval_dataset={"a": PAIRS_A, "b": PAIRS_B})


def test_without_a_best_metric_the_first_sets_default_is_followed(model_dir, tmp_path):
    trainer = DPOTrainer(model=str(model_dir), args=args_for(DPOConfig, tmp_path), train_dataset=PAIRS_A,
                         eval_dataset={"first": PAIRS_B, "second": PAIRS_A})
    assert trainer.inner.best_metric == "eval/first_accuracy"  # DPO's own default, eval/accuracy, on the first set


def test_grpo_refuses_several_held_out_sets_in_one_line(model_dir, tmp_path):
    prompts = [{"prompt": f"Name a {w}."} for w in ("colour", "fruit", "tree", "bird")]
    with pytest.raises(ValueError) as e:
        GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(tmp_path), train_dataset=prompts,
                    eval_dataset={"a": prompts, "b": prompts})
    assert "eval_dataset={'a': ..., 'b': ...}" in str(e.value) and "\n" not in str(e.value)


# -- GRPO's evaluation statistics --------------------------------------------------------------------------------
def reward_len(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [-abs(20 - len(t)) / 20 for t in texts]


def grpo_args(out, **kwargs):
    return GRPOConfig(**{"output_dir": str(out), "num_generations": 4, "max_completion_length": 6,
                         "per_device_train_batch_size": 4, "max_steps": 1, "logging_steps": 1, "report_to": "none",
                         "bf16": False, "use_cpu": True, "save_strategy": "no", "per_device_eval_batch_size": 4,
                         **kwargs})


def test_grpo_evaluation_reports_trls_statistics_computed_as_trl(varied_model_dir, tmp_path):
    from transformers import AutoTokenizer
    from trl.trainer.utils import nanstd

    tokenizer = AutoTokenizer.from_pretrained(varied_model_dir)
    calls = {"length_reward": [], "sometimes": []}

    def length_reward(completions, completion_ids, **kwargs):
        values = reward_len(completions)
        calls["length_reward"].append(([list(ids) for ids in completion_ids], values))
        return values

    def sometimes(completions, **kwargs):  # None (not applicable) for every other completion
        values = [None if i % 2 else float(len(c)) for i, c in enumerate(completions)]
        calls["sometimes"].append((None, values))
        return values

    prompts = [{"prompt": f"Say something about {w}."} for w in ("cats", "dogs", "rain", "tea", "maps", "bread",
                                                                   "glass")]
    args = grpo_args(tmp_path, reward_weights=[1.0, 0.5], eval_strategy="steps",
                     metric_for_best_model="eval_reward_std")
    trainer = GRPOTrainer(model=str(varied_model_dir), reward_funcs=[length_reward, sometimes], train_dataset=prompts,
                          eval_dataset=prompts, args=args)
    for seen in calls.values():
        seen.clear()
    metrics = trainer.evaluate()  # 7 held-out prompts in batches of 4 and 3, each decoded once
    ids = [row for batch, _ in calls["length_reward"] for row in batch]
    assert len(ids) == 7
    # TRL's statistics (GRPOTrainer._generate_and_score_completions) of the completions the functions scored
    per_function = torch.tensor([[math.nan if v is None else v for _, values in calls[name] for v in values]
                                 for name in calls], dtype=torch.float32).T  # (7, 2), NaN where it returned None
    rewards = (per_function * torch.tensor([1.0, 0.5])).nansum(1)
    assert metrics["eval_reward"] == pytest.approx(rewards.mean().item(), abs=1e-6)
    assert metrics["eval_reward_std"] == pytest.approx(nanstd(rewards).item(), abs=1e-6)
    for j, name in enumerate(calls):
        column = per_function[:, j]
        assert metrics[f"eval_rewards/{name}/mean"] == pytest.approx(torch.nanmean(column).item(), abs=1e-6)
        assert metrics[f"eval_rewards/{name}/std"] == pytest.approx(nanstd(column).item(), abs=1e-6)
    lengths = torch.tensor([len(row) for row in ids], dtype=torch.float32)
    truncated = torch.tensor([row[-1] not in (tokenizer.eos_token_id, tokenizer.pad_token_id) for row in ids])
    # the completions differ: some end before the limit, at different lengths, and their rewards differ
    assert 0 < truncated.sum() < 6 and len(set(lengths[~truncated].tolist())) > 1 and rewards.std() > 0.1
    terminated = lengths[~truncated] if (~truncated).any() else torch.zeros(1)  # TRL's value where none ended
    expected = {"mean_length": lengths.mean(), "min_length": lengths.min(), "max_length": lengths.max(),
                "clipped_ratio": truncated.float().mean(), "mean_terminated_length": terminated.mean(),
                "min_terminated_length": terminated.min(), "max_terminated_length": terminated.max()}
    for name, value in expected.items():
        assert metrics[f"eval_completions/{name}"] == pytest.approx(value.item(), abs=1e-6), name
    assert metrics["eval_num_tokens"] == 0  # the training tokens so far, as TRL logs it: none yet
    assert {k: v for k, v in trainer.state.log_history[-1].items() if k not in ("epoch", "step")} == metrics


def test_grpo_evaluation_in_training_counts_the_training_tokens_so_far(model_dir, tmp_path):
    prompts = [{"prompt": f"Say something about {w}."} for w in ("cats", "dogs", "rain", "tea")]
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, train_dataset=prompts, eval_dataset=prompts,
                          args=grpo_args(tmp_path, eval_strategy="steps", eval_steps=1))
    trainer.train()
    train_entry = [e for e in trainer.state.log_history if "loss" in e][-1]
    eval_entry = [e for e in trainer.state.log_history if "eval_reward" in e][-1]
    assert eval_entry["eval_num_tokens"] == train_entry["num_tokens"] > 0
    assert eval_entry["eval_completions/min_length"] <= eval_entry["eval_completions/mean_length"] <= \
        eval_entry["eval_completions/max_length"]
    assert not any(math.isnan(v) for v in eval_entry.values() if isinstance(v, float))
