"""TRL behaviours lmrl.trl keeps, each checked against TRL's own rule or result: reward
models in GRPO's reward_funcs, streaming data sets, the user's LoraConfig carried whole, TRL's metric
names (and metric_for_best_model with them), GRPO's epoch counted in prompts, TRL's other exports, the
trainer surface scripts call, and TRL's checkpoint idioms answered in one line."""

from __future__ import annotations

import json

import peft
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lmrl.common.errors import ConfigError
from lmrl.trl import GRPOConfig, GRPOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer
from lmrl.trl import DPOConfig, DPOTrainer
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-compat")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


@pytest.fixture(scope="module")
def rm_dir(model_dir, tmp_path_factory):
    """A one-label sequence classifier on the tiny Llama, saved with its tokenizer (what TRL's RewardTrainer
    leaves), in a directory named "my-rm"."""
    out = tmp_path_factory.mktemp("rm") / "my-rm"
    torch.manual_seed(1)
    rm = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    rm.config.pad_token_id = 0
    rm.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def reward_len(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [-abs(20 - len(t)) / 20 for t in texts]


PROMPTS = Dataset.from_list([{"prompt": f"Say something about {w}."} for w in
                             ("cats", "dogs", "rain", "tea", "maps", "bread", "glass", "snow")])
PAIRS = Dataset.from_list([{"prompt": f"Q{i}?", "chosen": f" yes {i}", "rejected": f" no {i}"} for i in range(8)])
SFT_ROWS = Dataset.from_list([{"prompt": f"Q{i}?", "completion": f" answer {i}"} for i in range(8)])


def grpo_args(out, **kwargs):
    return GRPOConfig(**{"output_dir": str(out), "num_generations": 4, "max_completion_length": 4,
                         "per_device_train_batch_size": 4, "max_steps": 1, "logging_steps": 1, "report_to": "none",
                         "bf16": False, "use_cpu": True, "save_strategy": "no", **kwargs})


def offline_args(cls, out, **kwargs):
    return cls(**{"output_dir": str(out), "per_device_train_batch_size": 4, "max_steps": 1, "logging_steps": 1,
                  "report_to": "none", "bf16": False, "use_cpu": True, "save_strategy": "no", **kwargs})


# -- 1. reward models in reward_funcs ----------------------------------------------------------------------
def test_grpo_scores_with_a_reward_model_path_beside_a_function(model_dir, rm_dir, tmp_path):
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward_len, str(rm_dir)], args=grpo_args(tmp_path),
                          train_dataset=PROMPTS)
    trainer.train()
    logged = [e for e in trainer.state.log_history if "loss" in e][-1]
    # named after the model's directory, as TRL names it; the reward is the sum of both
    assert set(logged) >= {"rewards/reward_len/mean", "rewards/my-rm/mean", "rewards/my-rm/std"}
    assert logged["reward"] == pytest.approx(logged["rewards/reward_len/mean"] + logged["rewards/my-rm/mean"],
                                             abs=1e-5)


def test_a_loaded_reward_model_scores_prompt_and_completion_with_its_tokenizer(model_dir, rm_dir):
    from lmrl.trl.trainers import _reward_models
    from lmrl.trl.configs import GRPOConfig as _Args

    loaded = AutoModelForSequenceClassification.from_pretrained(rm_dir)
    config = _Args(output_dir="unused", num_generations=4, per_device_train_batch_size=4, use_cpu=True,
                   bf16=False).to_config(model_path=str(model_dir), train_rows=8)
    funcs, scorers = _reward_models([reward_len, loaded], PROMPTS, config)
    assert funcs[0] is reward_len and funcs[1] is scorers[0] and scorers[0].__name__ == "my-rm"
    prompts, completions = ["Say hi.", "Count: one"], [" hi", " two three"]
    # TRL's scoring of a text prompt: prompt + completion through the reward model's tokenizer (lmrl ends the
    # completion with the end token, as reward-model training encodes it)
    tok = AutoTokenizer.from_pretrained(rm_dir)
    expected = []
    for p, c in zip(prompts, completions):
        ids = torch.tensor([tok(p + c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]])
        with torch.no_grad():
            expected.append(loaded(input_ids=ids).logits[0, 0].item())
    assert scorers[0](prompts=prompts, completions=completions) == pytest.approx(expected, abs=1e-5)


# -- 2. streaming data sets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sft", "dpo", "reward"])
def test_streaming_datasets_train_with_max_steps(kind, model_dir, tmp_path):
    cls, args_cls, rows = {"sft": (SFTTrainer, SFTConfig, SFT_ROWS), "dpo": (DPOTrainer, DPOConfig, PAIRS),
                           "reward": (RewardTrainer, RewardConfig, PAIRS)}[kind]
    trainer = cls(model=str(model_dir), args=offline_args(args_cls, tmp_path), train_dataset=rows.to_iterable_dataset())
    assert trainer.train().global_step == 1


def test_a_streaming_dataset_without_max_steps_is_refused_in_one_line(model_dir, tmp_path):
    with pytest.raises(ValueError, match="set max_steps") as e:
        SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path, max_steps=-1, num_train_epochs=1),
                   train_dataset=SFT_ROWS.to_iterable_dataset())
    assert "\n" not in str(e.value)


# -- 3. the user's LoraConfig ---------------------------------------------------------------------------------
def test_lora_target_modules_none_is_peft_default_as_in_trl(model_dir, tmp_path):
    trainer = SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path), train_dataset=SFT_ROWS,
                         peft_config=peft.LoraConfig(r=4))
    # what peft itself builds for this LoraConfig on the same model
    from transformers import AutoModelForCausalLM

    reference = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), peft.LoraConfig(r=4))
    ours = trainer.model.peft_config["default"]
    assert set(ours.target_modules) == set(reference.peft_config["default"].target_modules) == {"q_proj", "v_proj"}
    assert trainer.config.lora.target_modules == ["q_proj", "v_proj"]


def test_lora_settings_beyond_rank_reach_the_adapter_and_the_config(model_dir, tmp_path):
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True, use_dora=True,
                           modules_to_save=["lm_head"], rank_pattern={"v_proj": 2}, bias="lora_only")
    trainer = SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path), train_dataset=SFT_ROWS,
                         peft_config=lora)
    built = trainer.model.peft_config["default"]
    assert (built.use_rslora, built.use_dora, built.bias, built.rank_pattern) == (True, True, "lora_only",
                                                                                  {"v_proj": 2})
    assert set(built.modules_to_save) == {"lm_head"}
    # rsLoRA's scaling alpha / sqrt(r), with v_proj's rank from rank_pattern
    layer = trainer.model.base_model.model.model.layers[0].self_attn
    assert layer.q_proj.scaling["default"] == pytest.approx(8 / 4 ** 0.5)
    assert layer.v_proj.r["default"] == 2
    # recorded, so config.yaml says it and a resume rebuilds it
    assert trainer.config.lora.peft == {"use_rslora": True, "use_dora": True, "modules_to_save": ["lm_head"],
                                        "rank_pattern": {"v_proj": 2}, "bias": "lora_only"}
    trainer.train()
    import yaml

    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["lora"]
    assert recorded["peft"]["use_rslora"] is True and recorded["target_modules"] == ["q_proj", "v_proj"]


def test_lora_settings_lmrl_cannot_carry_are_refused_in_one_line(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="init_lora_weights='eva'"):
        SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path), train_dataset=SFT_ROWS,
                   peft_config=peft.LoraConfig(r=4, init_lora_weights="eva"))


def test_a_loaded_model_gets_the_users_lora_config(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=offline_args(SFTConfig, tmp_path),
                         train_dataset=SFT_ROWS, processing_class=AutoTokenizer.from_pretrained(model_dir),
                         peft_config=peft.LoraConfig(r=4, use_rslora=True))
    built = trainer.model.peft_config["default"]
    assert built.use_rslora and set(built.target_modules) == {"q_proj", "v_proj"}


def test_reward_model_lora_carries_the_users_settings(model_dir, tmp_path):
    trainer = RewardTrainer(model=str(model_dir), args=offline_args(RewardConfig, tmp_path), train_dataset=PAIRS,
                            peft_config=peft.LoraConfig(r=4, use_rslora=True, task_type="SEQ_CLS"))
    built = trainer.inner.model.model.peft_config["default"]
    assert built.use_rslora and set(built.target_modules) == {"q_proj", "v_proj"}


# -- 4. metric names ---------------------------------------------------------------------------------------------
def test_reward_trainer_logs_trls_names_and_takes_them_as_best_metric(model_dir, tmp_path):
    args = offline_args(RewardConfig, tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1,
                        metric_for_best_model="eval_margin")
    trainer = RewardTrainer(model=str(model_dir), args=args, train_dataset=PAIRS, eval_dataset=PAIRS)
    trainer.train()
    train_logs = [e for e in trainer.state.log_history if "loss" in e][-1]
    evals = [e for e in trainer.state.log_history if "eval_loss" in e][-1]
    assert {"margin", "mean_reward", "min_reward", "max_reward", "accuracy"} <= set(train_logs)
    assert train_logs["min_reward"] <= train_logs["mean_reward"] <= train_logs["max_reward"]
    assert {"eval_margin", "eval_mean_reward", "eval_min_reward", "eval_max_reward"} <= set(evals)
    assert trainer.state.best_metric == max(e["eval_margin"] for e in trainer.state.log_history if "eval_margin" in e)


def test_an_unknown_best_metric_is_refused_before_training(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="metric_for_best_model='eval_margins'.*eval_margin"):
        RewardTrainer(model=str(model_dir), args=offline_args(RewardConfig, tmp_path, metric_for_best_model="eval_margins"),
                      train_dataset=PAIRS)
    with pytest.raises(ConfigError, match="eval_rewards/reward_len/mean"):
        GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, train_dataset=PROMPTS,
                    args=grpo_args(tmp_path / "g", metric_for_best_model="eval_rewards/reward_lenn/mean"))


def test_grpo_evaluation_logs_each_reward_functions_mean(model_dir, tmp_path):
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward_len], train_dataset=PROMPTS,
                          args=grpo_args(tmp_path, metric_for_best_model="eval_rewards/reward_len/mean"))
    metrics = trainer.evaluate()
    assert metrics["eval_rewards/reward_len/mean"] == pytest.approx(metrics["eval_reward"])


# -- 5. GRPO's epoch counts prompts --------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, steps, epoch", [({"max_steps": 3}, 3, 3 / 8),
                                                 ({"max_steps": -1, "num_train_epochs": 1}, 8, 1.0),
                                                 ({"max_steps": -1, "num_train_epochs": 1, "num_iterations": 2},
                                                  8, 1.0)])
def test_grpo_epoch_counts_prompts_as_trls(model_dir, tmp_path, extra, steps, epoch):
    # 4 completions per step in groups of 4: one prompt per generation; 8 prompts are an epoch (TRL: 3 steps
    # end at epoch 0.375, num_train_epochs=1 at 1.0)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, train_dataset=PROMPTS,
                          args=grpo_args(tmp_path, **extra))
    out = trainer.train()
    assert (out.global_step, trainer.state.epoch, out.metrics["epoch"]) == (steps, pytest.approx(epoch),
                                                                           pytest.approx(epoch))
    assert trainer.state.num_train_epochs == 1


# -- 6. TRL's other exports ----------------------------------------------------------------------------------------
def test_everything_else_trl_exports_is_trls_own():
    import trl

    import lmrl.trl as ours

    for name in ("apply_chat_template", "maybe_apply_chat_template", "extract_prompt", "maybe_extract_prompt",
                 "clone_chat_template", "is_conversational", "unpair_preference_dataset", "pack_dataset",
                 "RichProgressCallback", "LogCompletionsCallback", "BEMACallback", "__version__"):
        assert getattr(ours, name) is getattr(trl, name)
    for name in ("GRPOTrainer", "RLOOTrainer", "RLOOConfig"):  # lmrl's, under TRL's names
        assert getattr(ours, name) is not getattr(trl, name) and getattr(ours, name).__module__.startswith("lmrl.trl")
    assert issubclass(ours.RLOOConfig, trl.RLOOConfig) and {"RLOOConfig", "RLOOTrainer"} <= set(ours.__all__)
    from lmrl.trl import rewards, scripts  # lmrl's own modules, not TRL's of the same name

    assert (rewards.__name__, scripts.__name__) == ("lmrl.trl.rewards", "lmrl.trl.scripts")


@pytest.mark.parametrize("name, says", [("KTOConfig", "DPOTrainer"), ("KTOTrainer", "DPOTrainer"),
                                        ("DistillationConfig", "SFTTrainer"), ("DistillationTrainer", "SFTTrainer")])
def test_trainers_lmrl_does_not_run_are_refused_with_what_to_use(name, says):
    with pytest.raises(ImportError, match=says) as e:
        exec(f"from lmrl.trl import {name}")
    assert "\n" not in str(e.value)


# -- 7. the trainer surface of common scripts ------------------------------------------------------------------
def test_the_end_of_an_open_r1_script_runs_as_with_transformers(model_dir, tmp_path, capsys):
    from transformers import EarlyStoppingCallback, PrinterCallback

    trainer = SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path), train_dataset=SFT_ROWS,
                         eval_dataset=SFT_ROWS, callbacks=[PrinterCallback])
    assert trainer.train_dataset is SFT_ROWS and trainer.eval_dataset is SFT_ROWS
    assert trainer.is_local_process_zero() and trainer.is_world_process_zero()
    assert trainer.tokenizer is trainer.processing_class
    printer = trainer.pop_callback(PrinterCallback)
    assert isinstance(printer, PrinterCallback) and trainer.callbacks == []
    trainer.add_callback(printer)
    trainer.remove_callback(printer)
    assert trainer.callbacks == [] and trainer.pop_callback(EarlyStoppingCallback) is None
    metrics = trainer.train().metrics
    capsys.readouterr()
    trainer.log_metrics("train", metrics)
    assert "***** train metrics *****" in capsys.readouterr().out
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    trainer.accelerator.wait_for_everyone()
    trainer.create_model_card(dataset_name="toy", tags=["demo"])
    assert json.loads((tmp_path / "train_results.json").read_text()) == json.loads(
        (tmp_path / "all_results.json").read_text()) == json.loads(json.dumps(metrics))
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 1
    assert "toy" in (tmp_path / "README.md").read_text()
    with pytest.raises(NotImplementedError, match="get_train_dataloader"):
        trainer.get_train_dataloader()
    with pytest.raises(NotImplementedError, match="predict"):
        trainer.predict(SFT_ROWS)
    with pytest.raises(AttributeError, match="compute_loss is not supported"):  # never lmrl's compute_loss(batch)
        trainer.compute_loss


# -- 8. TRL's checkpoint idioms ----------------------------------------------------------------------------------
def test_trls_checkpoint_names_and_reruns_say_what_to_do(model_dir, tmp_path):
    args = offline_args(SFTConfig, tmp_path, save_strategy="steps", save_steps=1)
    SFTTrainer(model=str(model_dir), args=args, train_dataset=SFT_ROWS).train()
    ours = tmp_path / "checkpoints" / "step_1"
    assert ours.is_dir()
    # transformers' checkpoint-N of a step lmrl has not saved: refused as the trainer is built, naming the newest
    with pytest.raises(ConfigError, match=f"nor does lmrl's checkpoint of that step.*newest is {ours}"):
        SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path,
                                                           resume_from_checkpoint=str(tmp_path / "checkpoint-7")),
                   train_dataset=SFT_ROWS)
    # the same command again: the error names the flag and checkpoint that continue it
    with pytest.raises(ConfigError, match=f"--resume_from_checkpoint {tmp_path}/checkpoints/step_1"):
        SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path), train_dataset=SFT_ROWS).train()
    resumed = SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path, max_steps=2),
                         train_dataset=SFT_ROWS)
    assert resumed.train(resume_from_checkpoint=str(ours)).global_step == 2


def test_transformers_checkpoint_names_resume_from_lmrls_checkpoint_of_that_step(model_dir, tmp_path):
    args = offline_args(SFTConfig, tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
    SFTTrainer(model=str(model_dir), args=args, train_dataset=SFT_ROWS).train()
    assert (tmp_path / "checkpoints" / "step_1").is_dir() and not (tmp_path / "checkpoint-1").exists()
    # as a TRL script passes it (--resume_from_checkpoint output_dir/checkpoint-1): the run goes on from step 1
    resumed = SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path, max_steps=3,
                                                                 resume_from_checkpoint=str(tmp_path / "checkpoint-1")),
                         train_dataset=SFT_ROWS)
    assert resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1")).global_step == 3
    assert f"resumed from {tmp_path / 'checkpoints' / 'step_1'} (step 1)" in (tmp_path / "train.log").read_text()


# -- eval_strategy ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy, evaluated", [("no", False), ("steps", True)])
def test_an_offline_trainer_evaluates_by_itself_only_with_an_eval_strategy(strategy, evaluated, model_dir, tmp_path):
    trainer = SFTTrainer(model=str(model_dir), args=offline_args(SFTConfig, tmp_path, max_steps=2, eval_steps=1,
                                                                 eval_strategy=strategy),
                         train_dataset=SFT_ROWS, eval_dataset=SFT_ROWS)
    trainer.train()
    assert any("eval_loss" in entry for entry in trainer.state.log_history) == evaluated
    assert "eval_loss" in trainer.evaluate()  # asked for: evaluated either way, as TRL's
