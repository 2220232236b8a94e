"""The RL trainer on a Hugging Face policy: a tiny Llama built here answers math questions from
JSONL through the same loop, algorithms and checkpoints as the built-in GPT, with a LoRA adapter
whose disabled state is the KL reference. No hub, no network."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lmrl.config import ConfigError, load_config
from lmrl.models.reference import is_reference_view
from lmrl.tasks.word_problems import write_addition_chat
from lmrl.train.inspect import export_run, load_run
from lmrl.train.rl_trainer import RLTrainer
from lmrl.tasks.rewards import RewardError
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A 2-layer, 32-dim Llama and its tokenizer saved as a model dir, plus a small addition-chat data set."""
    root = tmp_path_factory.mktemp("hf-train")
    save_tiny_llama(root / "model", max_positions=256)
    write_addition_chat(root / "data", n_train=40, n_test=8, seed=0)
    return root


def _config(root, run_dir, *overrides):
    return load_config("math-grpo-smollm2", [
        f"model.path={root / 'model'}", f"task.train_file={root / 'data' / 'train.jsonl'}",
        f"task.test_file={root / 'data' / 'test.jsonl'}", f"run.dir={run_dir}",
        "lora.r=4", "lora.target_modules=[all-linear]", "task.max_new_tokens=6", "train.steps=3",
        "train.rollout_size=8", "algo.group_size=4", "algo.kl_coef=0.05", "train.eval_every=2",
        "train.ckpt_every=1", "eval.size=4", "eval.batch_size=4", "run.progress=false", "run.tensorboard=false",
        "run.threads=1", "optim.lr=1e-2",
        # a random tiny model never answers right: reward length, so advantages (and updates) are not zero
        "reward.cls=tests.test_hf_training:LengthReward", *overrides])


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_with_lora_trains_only_the_adapter_and_writes_the_math_metrics(tiny_hf, tmp_path):
    trainer = RLTrainer(_config(tiny_hf, tmp_path / "run"))
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    summary = trainer.train()

    assert is_reference_view(trainer.reference)  # KL to the adapter-less base, no second copy
    assert not any(p.requires_grad for p in base.values())
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and "lora_B" in n and p.abs().sum() > 0]
    assert moved, "the adapter did not train"
    for n, p in trainer.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), f"frozen base weight {n} changed"
    rows = _metrics(tmp_path / "run")
    keys = set().union(*rows)
    for key in ("eval/accuracy", "eval/format_rate", "eval/length_mean", "rollout/length_mean",
                "rollout/format_rate", "train/kl", "train/policy_loss"):
        assert key in keys, key
    assert summary["final_accuracy"] is not None and summary["rl_steps"] == 3

    step = tmp_path / "run" / "checkpoints" / "step_3"
    saved = load_file(str(step / "adapter_model.safetensors"))  # PEFT's layout, beside adapter_config.json
    assert saved and all("lora_" in k for k in saved), "a LoRA checkpoint holds the adapter only"
    assert (step / "adapter_config.json").is_file() and not (step / "model.safetensors").exists()
    assert not (tmp_path / "run" / "checkpoints" / "step_3" / "reference.safetensors").exists()


def test_resumed_lora_run_writes_the_same_metrics_as_an_uninterrupted_one(tiny_hf, tmp_path):
    RLTrainer(_config(tiny_hf, tmp_path / "full")).train()
    RLTrainer(_config(tiny_hf, tmp_path / "part", "train.steps=3")).train()
    # cut the second run back to its step-2 checkpoint, then resume it
    ckpts = tmp_path / "part" / "checkpoints"
    import shutil

    shutil.rmtree(ckpts / "step_3")
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "part" / "metrics.jsonl").write_text("\n".join(l for l in lines if json.loads(l)["step"] <= 2) + "\n")
    RLTrainer(_config(tiny_hf, tmp_path / "part", "run.resume=auto")).train()

    def comparable(run):
        return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/"))} for r in _metrics(run)]

    assert comparable(tmp_path / "part") == comparable(tmp_path / "full")


def test_export_writes_a_merged_model_plain_transformers_loads(tiny_hf, tmp_path):
    RLTrainer(_config(tiny_hf, tmp_path / "run", "train.steps=2")).train()
    out = export_run(tmp_path / "run", tmp_path / "export")
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    run = load_run(tmp_path / "run")
    [(question, completion, answer)] = list(run.generate(["What is 12 + 35?"]))  # lmrl generate RUN_DIR ...
    assert question == "What is 12 + 35?" and isinstance(completion, str)
    ids, mask = run.model.encode(["What is 12 + 35?"])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids, attention_mask=mask).logits, run.model(ids, attention_mask=mask),
                              atol=1e-4)
    # and the adapter changed the model: the merged weights differ from the base
    base = AutoModelForCausalLM.from_pretrained(tiny_hf / "model").eval()
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4)


class LengthReward:
    """A custom reward class for `reward.cls`: every completion scores its length in characters."""

    def __call__(self, prompts, completions, ground_truth, **kwargs):
        assert len(ground_truth) == len(completions)
        return [float(len(c)) for c in completions]


class BrokenReward:
    def __call__(self, prompts, completions, **kwargs):
        raise KeyError("boom")


def test_custom_reward_class_named_in_the_config_gives_the_reward(tiny_hf, tmp_path):
    RLTrainer(_config(tiny_hf, tmp_path / "run", "train.steps=1")).train()
    row = next(r for r in _metrics(tmp_path / "run") if "rollout/reward_mean" in r)
    assert row["rollout/reward_mean"] > 1.0  # lengths, not the 0..1.2 of the math reward
    assert row["train/accuracy"] == 0.0  # accuracy stays math-verify's


def test_a_reward_class_that_raises_stops_with_its_name_and_the_sample(tiny_hf, tmp_path):
    with pytest.raises(RewardError, match="BrokenReward.*KeyError"):
        RLTrainer(_config(tiny_hf, tmp_path / "run", "reward.cls=tests.test_hf_training:BrokenReward",
                          "train.steps=1")).train()


@pytest.mark.parametrize("overrides, message", [
    (["task.name=addition"], "task.name=addition needs the built-in GPT"),
    (["model.path="], "needs model.path"),
    (["sft.steps=5"], "sft.steps"),
    (["reward.cls=no_colon"], "package.module:ClassName"),
    (["task.prompt_template=no placeholder"], "{prompt}"),
])
def test_bad_hf_config_is_one_line_naming_the_key(tiny_hf, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")):
        _config(tiny_hf, tmp_path / "run", *overrides)


def test_a_text_task_without_its_files_is_one_line_from_the_trainer_before_the_model_loads(tiny_hf, tmp_path):
    cfg = _config(tiny_hf, tmp_path / "run", "task.test_file=", "model.path=/nonexistent")  # no model is loaded
    with pytest.raises(ConfigError, match=r"set task\.train_file and task\.test_file .*or pass train_dataset="):
        RLTrainer(cfg)


def test_missing_data_file_names_it_and_the_command_that_writes_one(tiny_hf, tmp_path):
    cfg = _config(tiny_hf, tmp_path / "run", f"task.train_file={tmp_path / 'nope' / 'train.jsonl'}", "task.generate=")
    with pytest.raises(FileNotFoundError, match=r"nope/train\.jsonl.*lmrl data"):
        RLTrainer(cfg)


def test_task_generate_writes_the_missing_data_set(tiny_hf, tmp_path):
    data = tmp_path / "gen"
    cfg = _config(tiny_hf, tmp_path / "run", f"task.train_file={data / 'train.jsonl'}",
                  f"task.test_file={data / 'test.jsonl'}", "task.generate=addition-chat")
    trainer = RLTrainer(cfg)
    assert (data / "train.jsonl").exists() and len(trainer.task.heldout_ids) == 200
    train_prompts = set(trainer.task.prompt_texts[: trainer.task.n_train])
    assert not train_prompts & set(trainer.task.prompts(trainer.task.heldout_ids))
