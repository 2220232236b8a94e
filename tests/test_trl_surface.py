"""TRL's own scripts (`trl/scripts/{grpo,rloo,dpo,sft,reward}.py` of the installed trl) run on lmrl with their
`trl` imports resolved to `lmrl.trl`, and what they leave loads back with transformers / PEFT; the
`transformers.Trainer` surface they and users touch: TrainerState, TrainerCallback events,
TrainOutput, resume, save_model, push_to_hub, quantization_config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback

from lmrl.cli import main
from lmrl.config import ConfigError
from lmrl.trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer, SFTConfig, SFTTrainer
from lmrl.train.trainers import RLOOTrainer as LmrlRLOOTrainer
from lmrl.trl.scripts import resolve_imports, run_script, script_path
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-surface")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


def write_split(directory: Path, rows: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def reward_len(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [-abs(20 - len(t)) / 20 for t in texts]


SMALL = ["--per_device_train_batch_size", "4", "--max_steps", "2", "--logging_steps", "1", "--use_cpu",
         "--bf16", "false", "--report_to", "none", "--learning_rate", "1e-3", "--seed", "3"]


def test_imports_are_resolved_and_nothing_else_changes():
    source = script_path("grpo").read_text()
    resolved = resolve_imports(source)
    assert "from trl import" not in resolved and "from trl.rewards import" not in resolved
    assert resolved.count("from lmrl.trl import") == source.count("from trl import")
    assert resolved.replace("lmrl.trl", "trl") == source


def test_trls_grpo_script_trains_and_saves_a_model_transformers_loads(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    data = write_split(tmp_path / "data", [{"prompt": [{"role": "user", "content": f"Tell me about {w}."}]}
                                           for w in ("cats", "dogs", "tea", "rain")])  # think_format_reward's kind
    out = tmp_path / "grpo"
    run_script("grpo", ["--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir", str(out),
                        "--reward_funcs", "think_format_reward", "tests.test_trl_surface.reward_len",
                        "--num_generations", "2", "--max_completion_length", "4", *SMALL])
    loaded = AutoModelForCausalLM.from_pretrained(out)
    start = AutoModelForCausalLM.from_pretrained(model_dir)
    assert any(not torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), start.state_dict().values()))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("rewards/think_format_reward/mean" in r and "rewards/reward_len/mean" in r for r in rows)


def test_trls_rloo_script_runs_through_the_cli_trains_and_saves_a_model_transformers_loads(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    data = write_split(tmp_path / "data", [{"prompt": [{"role": "user", "content": f"Tell me about {w}."}]}
                                           for w in ("cats", "dogs", "tea", "rain")])
    out = tmp_path / "rloo"
    assert main(["trl", "rloo", "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir",
                 str(out), "--reward_funcs", "think_format_reward", "tests.test_trl_surface.reward_len",
                 "--num_generations", "2", "--max_completion_length", "4", "--num_iterations", "2", "--beta", "0.1",
                 "--normalize_advantages", *SMALL]) == 0
    algo = yaml.safe_load((out / "config.yaml").read_text())["algo"]  # the run's lmrl config
    assert (algo["name"], algo["ratio_level"], algo["kl_coef"], algo["kl_estimator"], algo["ppo_epochs"],
            algo["normalize_advantages"]) == ("rloo", "sequence_sum", 0.1, "k1", 2, True)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    start = AutoModelForCausalLM.from_pretrained(model_dir)
    assert any(not torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), start.state_dict().values()))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rewards/reward_len/mean" in r]
    assert steps and all("rewards/think_format_reward/mean" in r and "clip_ratio/region_mean" in r for r in steps)


def test_trls_sft_script_with_lora_leaves_an_adapter_peft_loads(model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = write_split(tmp_path / "data", [{"messages": [{"role": "user", "content": f"Say {w}."},
                                                         {"role": "assistant", "content": w}]}
                                           for w in ("red", "green", "blue", "gold")])
    out = tmp_path / "sft"
    assert main(["trl", "sft", "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir",
                 str(out), "--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--max_length", "64", *SMALL]) == 0
    assert (out / "adapter_config.json").is_file()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out)
    assert any("lora_A" in name for name, _ in model.named_parameters())
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4


def test_trls_dpo_and_reward_scripts_train_on_preference_pairs(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    pairs = [{"prompt": f"Is {a} bigger than {b}?", "chosen": " Yes." if a > b else " No.",
              "rejected": " No." if a > b else " Yes."} for a, b in [(3, 1), (2, 5), (9, 4), (1, 7)]]
    data = write_split(tmp_path / "pairs", pairs)
    run_script("dpo", ["--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir",
                       str(tmp_path / "dpo"), "--max_length", "64", *SMALL])
    AutoModelForCausalLM.from_pretrained(tmp_path / "dpo")
    run_script("reward", ["--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir",
                          str(tmp_path / "rm"), "--max_length", "64", *SMALL])
    scorer = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert scorer.config.num_labels == 1


class Recorder(TrainerCallback):
    def __init__(self):
        self.events, self.steps, self.logs, self.order = [], [], [], []

    def on_init_end(self, args, state, control, **kw):
        self.events.append("init_end")

    def on_train_begin(self, args, state, control, **kw):
        self.events.append("train_begin")

    def on_step_end(self, args, state, control, **kw):
        self.steps.append(state.global_step)
        self.order.append(f"step_end@{state.global_step}")

    def on_evaluate(self, args, state, control, **kw):
        self.order.append(f"evaluate@{state.global_step}")

    def on_log(self, args, state, control, logs=None, **kw):
        self.logs.append(dict(logs))

    def on_save(self, args, state, control, **kw):
        self.events.append(f"save@{state.global_step}")

    def on_train_end(self, args, state, control, **kw):
        self.events.append("train_end")


def grpo_args(out, **kwargs):
    base = dict(output_dir=str(out), num_generations=2, per_device_train_batch_size=4, max_completion_length=4,
                max_steps=3, logging_steps=1, save_steps=2, learning_rate=1e-3, use_cpu=True, bf16=False,
                report_to="none", seed=5)
    return GRPOConfig(**{**base, **kwargs})


PROMPTS = [{"prompt": f"Name a {w}."} for w in ("colour", "fruit", "tree", "bird")]


def test_callbacks_state_and_train_output_are_transformers(model_dir, tmp_path):
    recorder = Recorder()
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(tmp_path / "run"),
                          train_dataset=PROMPTS, callbacks=[recorder])
    evaluate = trainer.inner.evaluate
    trainer.inner.evaluate = lambda: recorder.order.append("evaluation runs") or evaluate()
    output = trainer.train()
    assert recorder.events == ["init_end", "train_begin", "save@2", "save@3", "train_end"]
    assert recorder.steps == [1, 2, 3]
    # transformers' order: on_step_end right after the update, then the step's evaluation and on_evaluate
    assert recorder.order[-3:] == ["step_end@3", "evaluation runs", "evaluate@3"]
    state = trainer.state
    assert (state.global_step, state.max_steps, output.global_step) == (3, 3, 3)
    steps = [e for e in state.log_history if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3] and all("learning_rate" in e and "grad_norm" in e for e in steps)
    assert any("eval_reward" in e for e in state.log_history)  # the last step's evaluation, TRL's eval_ names
    assert state.log_history[-1]["train_runtime"] > 0 and output.metrics["train_loss"] == pytest.approx(
        sum(e["loss"] for e in steps) / 3)
    assert recorder.logs == state.log_history  # every entry through on_log, the run's totals last
    assert trainer.evaluate().keys() >= {"eval_reward"}


def test_a_callback_can_stop_training(model_dir, tmp_path):
    class StopAtTwo(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                control.should_training_stop = True

    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(tmp_path / "run", max_steps=5),
                          train_dataset=PROMPTS, callbacks=[StopAtTwo])
    assert trainer.train().global_step == 2


def test_resume_from_checkpoint_continues_and_a_new_run_never_overwrites(model_dir, tmp_path):
    out = tmp_path / "run"
    GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(out, max_steps=2),
                train_dataset=PROMPTS).train()
    again = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(out, max_steps=2),
                        train_dataset=PROMPTS)
    with pytest.raises(ConfigError, match="already holds a run: train\\(resume_from_checkpoint=True\\)"):
        again.train()
    longer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(out, max_steps=3),
                         train_dataset=PROMPTS)
    assert longer.train(resume_from_checkpoint=True).global_step == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
    with pytest.raises(ValueError, match="no run to continue"):
        GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(tmp_path / "fresh"),
                    train_dataset=PROMPTS).train(resume_from_checkpoint=True)


def test_rloo_trainer_has_grpo_trainers_surface(model_dir, tmp_path):
    """RLOOTrainer is GRPOTrainer's implementation with an RLOOConfig: callbacks, TRL's log names, an
    eval_dataset, save_model and resume work alike."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"

    def args(**kwargs):
        base = dict(output_dir=str(out), per_device_train_batch_size=4, max_completion_length=4, max_steps=2,
                    logging_steps=1, save_steps=2, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none",
                    seed=5, eval_strategy="steps", eval_steps=2)
        return RLOOConfig(**{**base, **kwargs})

    recorder = Recorder()
    trainer = RLOOTrainer(model=str(model_dir), reward_funcs=reward_len, args=args(), train_dataset=PROMPTS,
                          eval_dataset=PROMPTS[:2], callbacks=[recorder])
    assert isinstance(trainer.inner, LmrlRLOOTrainer)
    assert trainer.train().global_step == 2
    assert recorder.events == ["init_end", "train_begin", "save@2", "train_end"] and recorder.steps == [1, 2]
    steps = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2] and all("kl" in e and "clip_ratio/region_mean" in e for e in steps)
    assert any("eval_reward" in e for e in trainer.state.log_history)
    trainer.save_model(str(tmp_path / "model"))
    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    longer = RLOOTrainer(model=str(model_dir), reward_funcs=reward_len, args=args(max_steps=3), train_dataset=PROMPTS)
    assert longer.train(resume_from_checkpoint=True).global_step == 3
    with pytest.raises(TypeError, match="import it from lmrl.trl"):
        RLOOTrainer(model=str(model_dir), reward_funcs=reward_len, train_dataset=PROMPTS,
                    args=GRPOConfig(output_dir=str(tmp_path / "g"), use_cpu=True))


def test_processing_class_is_the_tokenizer_used_when_the_model_is_a_path(model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    chat = [{"prompt": [{"role": "user", "content": "hi"}]}] * 4
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=grpo_args(tmp_path / "run"),
                          train_dataset=chat, processing_class=tokenizer)
    assert trainer.task.prompts(torch.tensor([0]))[0].startswith("<<hi>>")
    assert trainer.processing_class is tokenizer


def test_push_to_hub_without_network_and_quantization_say_so_in_one_line(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trainer = SFTTrainer(model=str(model_dir), args=SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1,
                                                              use_cpu=True, bf16=False, report_to="none"),
                         train_dataset=[{"prompt": "a", "completion": "b"}] * 4)
    with pytest.raises(RuntimeError, match=r"push_to_hub\('sft'\) failed: .*The model stays in"):
        trainer.push_to_hub()
    with pytest.raises(ValueError, match="quantization_config= is not supported"):
        SFTTrainer(model=str(model_dir), args=SFTConfig(output_dir=str(tmp_path / "q"), use_cpu=True),
                   train_dataset=[{"prompt": "a", "completion": "b"}], quantization_config=object())


def test_trl_configs_must_come_from_lmrl(model_dir, tmp_path):
    import trl

    with pytest.raises(TypeError, match="import it from lmrl.trl"):
        GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, train_dataset=PROMPTS,
                    args=trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True))


def test_the_cli_names_trls_scripts_without_importing_trl():
    import subprocess
    import sys

    code = "import sys, lmrl.cli.commands; lmrl.cli.commands._parser(); print('trl' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]  # TRL (and transformers under it) load only when a script runs
