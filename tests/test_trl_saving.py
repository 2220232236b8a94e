"""What lmrl.trl's save_model writes and when callbacks hear on_save, checked against TRL's own trainers run on
the same tiny model: a LoRA model saved as its PEFT adapter (the same files and tensor names as TRL's, loading
back to the trained model's outputs), and on_save at each checkpoint transformers would save."""

from __future__ import annotations

import json
import os

import peft
import pytest
import torch
from datasets import Dataset
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, TrainerCallback

from lmrl.models.reward_model import load_reward_model
from lmrl.trl import (DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RewardConfig, RewardTrainer, SFTConfig,
                      SFTTrainer)
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-saving")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


SFT_ROWS = Dataset.from_list([{"prompt": f"Q{i}?", "completion": f" answer {i}"} for i in range(8)])
PAIRS = Dataset.from_list([{"prompt": f"Q{i}?", "chosen": f" yes {i}", "rejected": f" no {i}"} for i in range(8)])
PROMPTS = [{"prompt": f"Name a {w}."} for w in ("colour", "fruit", "tree", "bird")]
# what transformers' Trainer._save writes beside the model: the tokenizer, the training arguments; peft its card
BESIDE = {"README.md", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "training_args.bin"}


def args_for(cls, out, **kwargs):
    return cls(**{"output_dir": str(out), "per_device_train_batch_size": 4, "max_steps": 1, "logging_steps": 1,
                  "report_to": "none", "bf16": False, "use_cpu": True, "save_strategy": "no",
                  "learning_rate": 1e-2, **kwargs})


def reward_len(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [-abs(20 - len(t)) / 20 for t in texts]


def adapter_tensors(directory) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "adapter_model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


@pytest.fixture(scope="module")
def trl_saved(model_dir, tmp_path_factory):
    """What TRL's own RewardTrainer and SFTTrainer write with save_model after a step with LoRA: {kind: dir}."""
    import trl

    root = tmp_path_factory.mktemp("trl-saved")
    out = {}
    for kind, cls, config, rows, lora in (
            ("reward", trl.RewardTrainer, trl.RewardConfig, PAIRS, peft.LoraConfig(r=4, task_type="SEQ_CLS")),
            ("sft", trl.SFTTrainer, trl.SFTConfig, SFT_ROWS, peft.LoraConfig(r=4))):
        trainer = cls(model=str(model_dir), args=args_for(config, root / kind), train_dataset=rows, peft_config=lora)
        trainer.train()
        trainer.save_model(str(root / kind / "saved"))
        out[kind] = root / kind / "saved"
    return out


# -- save_model with LoRA ----------------------------------------------------------------------------------------
def test_a_lora_reward_model_is_saved_as_its_peft_adapter_as_trls(model_dir, trl_saved, tmp_path):
    trainer = RewardTrainer(model=str(model_dir), args=args_for(RewardConfig, tmp_path / "run"), train_dataset=PAIRS,
                            peft_config=peft.LoraConfig(r=4, task_type="SEQ_CLS"))
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    # TRL's files (adapter_config.json, adapter_model.safetensors, the tokenizer, ...) and no whole model
    assert set(os.listdir(out)) == set(os.listdir(trl_saved["reward"]))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out))
    ours, theirs = adapter_tensors(out), adapter_tensors(trl_saved["reward"])
    assert ours.keys() == theirs.keys()  # the LoRA matrices and the trained score head, under PEFT's names
    assert all(ours[k].shape == theirs[k].shape for k in ours)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["base_model_name_or_path"] == str(model_dir)
    # it loads back, as TRL's does, to the trained model's scores
    ids = torch.tensor([[1, 5, 9, 13, 17, 21], [1, 7, 8, 9, 2, 3]])
    with torch.no_grad():
        trained = trainer.inner.model.model.eval()(input_ids=ids).logits
        loaded = AutoModelForSequenceClassification.from_pretrained(out, num_labels=1).eval()(input_ids=ids).logits
    torch.testing.assert_close(loaded, trained, rtol=0, atol=1e-5)
    assert not torch.allclose(trained, AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1)(input_ids=ids).logits, atol=1e-3)  # the adapter and head are the trained ones
    # lmrl's reward.model (PPO's reward, `lmrl train ... reward.model=DIR`) loads the adapter directory too
    rm, _ = load_reward_model(out)
    with torch.no_grad():
        torch.testing.assert_close(rm.model(input_ids=ids).logits, trained, rtol=0, atol=1e-5)


def test_the_saved_reward_adapter_scores_grpo_completions_as_trls_reward_funcs_path(model_dir, tmp_path):
    trainer = RewardTrainer(model=str(model_dir), args=args_for(RewardConfig, tmp_path / "rm"), train_dataset=PAIRS,
                            peft_config=peft.LoraConfig(r=4, task_type="SEQ_CLS"))
    trainer.train()
    trainer.save_model(str(tmp_path / "my-rm"))
    grpo = GRPOTrainer(model=str(model_dir), reward_funcs=[str(tmp_path / "my-rm")], train_dataset=PROMPTS,
                       args=GRPOConfig(output_dir=str(tmp_path / "grpo"), num_generations=2, max_completion_length=4,
                                       per_device_train_batch_size=4, max_steps=1, use_cpu=True, bf16=False,
                                       report_to="none", save_strategy="no"))
    scorer = grpo.task.reward.funcs[0]
    # TRL loads a reward_funcs path with AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "my-rm", num_labels=1).eval()
    tokenizer = trainer.processing_class
    ids = tokenizer("Name a tree. oak", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        expected = loaded(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert scorer(prompts=["Name a tree."], completions=[" oak"]) == pytest.approx([expected], abs=1e-5)


@pytest.mark.parametrize("kind", ["sft", "dpo", "grpo"])
def test_a_lora_policy_is_saved_as_its_peft_adapter_as_trls(kind, model_dir, trl_saved, tmp_path):
    lora = peft.LoraConfig(r=4)
    if kind == "grpo":
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, train_dataset=PROMPTS, peft_config=lora,
                              args=args_for(GRPOConfig, tmp_path / "run", num_generations=2, max_completion_length=4))
    else:
        cls, config, rows = {"sft": (SFTTrainer, SFTConfig, SFT_ROWS), "dpo": (DPOTrainer, DPOConfig, PAIRS)}[kind]
        trainer = cls(model=str(model_dir), args=args_for(config, tmp_path / "run"), train_dataset=rows,
                      peft_config=lora)
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    assert set(os.listdir(out)) == set(os.listdir(trl_saved["sft"]))
    assert adapter_tensors(out).keys() == adapter_tensors(trl_saved["sft"]).keys()
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        trained = trainer.model.eval()(input_ids=ids).logits
        loaded = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits  # base + adapter, as TRL's
    torch.testing.assert_close(loaded, trained, rtol=0, atol=1e-5)
    assert torch.load(out / "training_args.bin", weights_only=False).output_dir == str(tmp_path / "run")


def test_a_reward_model_without_lora_is_saved_whole_as_trls(model_dir, tmp_path):
    trainer = RewardTrainer(model=str(model_dir), args=args_for(RewardConfig, tmp_path / "run"), train_dataset=PAIRS)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "saved"))
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        trained = trainer.inner.model.model.eval()(input_ids=ids).logits
        loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved").eval()(input_ids=ids).logits
    torch.testing.assert_close(loaded, trained, rtol=0, atol=1e-6)


# -- on_save -----------------------------------------------------------------------------------------------------
class Saves(TrainerCallback):
    """The steps at which on_save is called; stops training at `stop_at`."""

    def __init__(self, stop_at: int = 0):
        self.saved, self.stop_at = [], stop_at

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_save(self, args, state, control, **kw):
        self.saved.append(state.global_step)


CASES = {  # save settings, the step a callback stops training at (0: none)
    "no": ({"save_strategy": "no"}, 0),
    "steps": ({"save_strategy": "steps", "save_steps": 2}, 0),
    "steps, every step's multiple": ({"save_strategy": "steps", "save_steps": 1}, 0),
    "steps, stopped between saves": ({"save_strategy": "steps", "save_steps": 2}, 3),
    "no, stopped": ({"save_strategy": "no"}, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_on_save_is_called_when_transformers_saves(case, model_dir, tmp_path):
    import trl

    settings, stop_at = CASES[case]
    theirs = Saves(stop_at)
    trl.SFTTrainer(model=str(model_dir), args=args_for(trl.SFTConfig, tmp_path / "trl", max_steps=5, **settings),
                   train_dataset=SFT_ROWS, callbacks=[theirs]).train()
    ours = Saves(stop_at)
    SFTTrainer(model=str(model_dir), args=args_for(SFTConfig, tmp_path / "lmrl", max_steps=5, **settings),
               train_dataset=SFT_ROWS, callbacks=[ours]).train()
    assert ours.saved == theirs.saved
    expected = {"no": [], "steps": [2, 4, 5], "steps, every step's multiple": [1, 2, 3, 4, 5],
                "steps, stopped between saves": [2], "no, stopped": []}[case]
    assert theirs.saved == expected  # transformers' rule, as this test reads it


def test_a_save_a_callback_asks_for_is_heard_with_save_strategy_no(model_dir, tmp_path):
    import trl

    class SaveAtTwo(Saves):
        def on_step_end(self, args, state, control, **kw):
            control.should_save = state.global_step == 2

    theirs = SaveAtTwo()
    trl.SFTTrainer(model=str(model_dir), args=args_for(trl.SFTConfig, tmp_path / "trl", max_steps=3),
                   train_dataset=SFT_ROWS, callbacks=[theirs]).train()
    ours = SaveAtTwo()
    SFTTrainer(model=str(model_dir), args=args_for(SFTConfig, tmp_path / "lmrl", max_steps=3), train_dataset=SFT_ROWS,
               callbacks=[ours]).train()
    assert ours.saved == theirs.saved == [2]
    # lmrl also keeps its last step's checkpoint (what a resume continues from), which no callback hears of
    assert [p.name for p in sorted((tmp_path / "lmrl" / "checkpoints").glob("step_*"))] == ["step_2", "step_3"]
