"""TRL users' scripts run on lmrl with one changed import (`from lmrl.trl import ...`): GRPO and RLOO
with a reward function on a prompt data set, DPO on preference pairs, with TRL's argument names and
defaults; the RL trainer's own `train_dataset=`; and what the translation refuses."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from lmrl.config import ConfigError, load_config
from lmrl.trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from lmrl.train.rl_trainer import RLTrainer
from tests.test_hf import save_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-scripts")
    save_tiny_llama(root / "model", max_positions=256)
    return root / "model"


def reward_len(completions, **kwargs):
    """TRL's quick-start reward: completions near 20 characters."""
    return [-abs(20 - len(completion)) for completion in completions]


PROMPTS = Dataset.from_list([{"prompt": f"Say something about {w}.", "topic": w} for w in
                             ("cats", "dogs", "rain", "tea", "maps", "bread", "glass", "snow")])


def grpo_script(GRPOConfig, GRPOTrainer, model, dataset, out):  # noqa: N803  (TRL's class names as arguments)
    """A TRL GRPO script, as TRL's quick start writes it (smaller)."""
    training_args = GRPOConfig(output_dir=str(out), learning_rate=1e-2, num_generations=4, max_completion_length=6,
                               per_device_train_batch_size=8, max_steps=2, logging_steps=1, report_to="none",
                               bf16=False)  # TRL on a CPU needs it
    trainer = GRPOTrainer(model=str(model), reward_funcs=reward_len, args=training_args, train_dataset=dataset)
    trainer.train()
    return trainer


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_trl_grpo_script_trains_with_lmrls_trainer(model_dir, tmp_path):
    trainer = grpo_script(GRPOConfig, GRPOTrainer, model_dir, PROMPTS, tmp_path / "grpo")
    cfg = trainer.config
    # TRL's names and defaults, mapped: 8 completions per step in groups of 4, beta 0, dapo's token-level loss
    assert (cfg.algo.name, cfg.algo.group_size, cfg.train.rollout_size, cfg.train.steps) == ("grpo", 4, 8, 2)
    assert (cfg.algo.kl_coef, cfg.algo.loss_level, cfg.algo.scale_rewards) == (0.0, "token", "group")
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.betas, cfg.run.seed) == (1e-2, 0.0, [0.9, 0.999], 42)
    assert (cfg.schedule.name, cfg.schedule.min_lr_ratio, cfg.task.max_new_tokens) == ("linear", 0.0, 6)
    assert cfg.task.max_prompt_length == 0  # TRL 1.16 cuts no prompt
    assert cfg.eval.size == 8  # eval_strategy="no": start and end only, per_device_eval_batch_size prompts
    assert not cfg.run.tensorboard and not cfg.run.wandb
    steps = [r for r in read_metrics(tmp_path / "grpo") if "train/avg_reward" in r]
    assert len(steps) == 2
    # the logged reward is reward_len's mean over the completions sampled
    assert all(r["rewards/reward_len/mean"] == r["train/avg_reward"] <= 0 for r in steps)
    # text prompts are used as they are (TRL applies no chat template to a text prompt)
    assert trainer.task.prompts(torch.tensor([0])) == ["Say something about cats."]
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "data" / "train.jsonl").read_text().splitlines()]
    assert rows[0] == {"prompt": "Say something about cats.", "topic": "cats"}
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["steps_done"] == 2 and summary["final_eval"]["eval/reward"] <= 0  # held out: scored by reward_len


def test_grpo_without_max_steps_runs_num_train_epochs_over_the_prompts(model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      gradient_accumulation_steps=2, num_train_epochs=2)
    cfg = args.to_config(model_path=str(model_dir), train_rows=len(PROMPTS))
    # 16 completions = 4 prompts per step; 2 epochs x 8 prompts = 4 steps, in 2 micro-batches each
    assert (cfg.train.rollout_size, cfg.train.ga_steps, cfg.train.steps) == (16, 2, 4)


def test_bf16_is_mixed_precision_over_the_models_own_weights(model_dir, tmp_path):
    cfg = GRPOConfig(output_dir=str(tmp_path), bf16=True, use_cpu=True).to_config(model_path=str(model_dir),
                                                                                 train_rows=8)
    assert (cfg.run.mixed_precision, cfg.model.dtype, cfg.run.device) == ("bf16", "fp32", "cpu")
    cfg = GRPOConfig(output_dir=str(tmp_path), bf16=False).to_config(model_path=str(model_dir), train_rows=8)
    assert cfg.run.mixed_precision == ""


def test_bf16_left_unset_is_on_where_the_hardware_has_it_as_in_trl(tmp_path, monkeypatch):
    import lmrl.trl.configs as configs

    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True).bf16  # TRL: bf16 unless fp16; a CPU run may
    monkeypatch.setattr(configs, "_bf16_hardware", lambda: False)
    args = GRPOConfig(output_dir=str(tmp_path))  # TRL itself refuses to start here; lmrl trains in fp32 and says so
    assert args.bf16 is False and any("bf16 is off" in note for note in args.notes)


def test_dtype_from_the_scripts_model_arguments_reaches_the_model(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), model_init_kwargs={"dtype": "bfloat16", "revision": None})
    assert args.to_config(model_path="m", train_rows=8).model.dtype == "bf16"
    with pytest.raises(ConfigError, match="float16"):
        GRPOConfig(output_dir=str(tmp_path), model_init_kwargs={"dtype": "float16"}).to_config(model_path="m",
                                                                                               train_rows=8)


def test_grpo_keeps_dropout_on_unless_disable_dropout_as_trl_does(model_dir, tmp_path):
    assert not GRPOConfig(output_dir=str(tmp_path)).to_config(model_path=str(model_dir),
                                                               train_rows=8).train.disable_dropout
    assert GRPOConfig(output_dir=str(tmp_path), disable_dropout=True).to_config(model_path=str(model_dir),
                                                                                train_rows=8).train.disable_dropout


def test_conversational_prompts_and_columns_reach_the_reward_functions(model_dir, tmp_path):
    calls = []

    def spy(prompts, completions, topic, **kwargs):
        calls.append(dict(prompts=prompts, completions=completions, topic=topic))
        return [0.0] * len(completions)

    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Tell me about {w}."}], "topic": w}
                              for w in ("cats", "dogs")])
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, max_steps=1,
                      max_completion_length=4)
    GRPOTrainer(model=str(model_dir), reward_funcs=[spy, reward_len], args=args, train_dataset=chat).train()
    # evaluation at the start (2 held-out prompts), one step of 2 prompts x 2 completions, the final evaluation
    assert [len(c["topic"]) for c in calls] == [2, 4, 2]
    step = calls[1]
    assert step["prompts"][0][-1] == {"role": "user", "content": f"Tell me about {step['topic'][0]}."}
    assert step["completions"][0][0]["role"] == "assistant" and set(step["topic"]) <= {"cats", "dogs"}


@pytest.mark.parametrize("kwargs, logged, printed", [
    (dict(), False, 0),  # TRL's default: off
    (dict(num_completions_to_print=3), False, 0),  # printing is part of log_completions, as in TRL
    (dict(log_completions=True), True, 16),  # None: TRL prints all of them (a step's 16 here)
    (dict(log_completions=True, num_completions_to_print=3), True, 3),
])
def test_log_completions_and_num_completions_to_print_set_the_completions_log(tmp_path, kwargs, logged, printed):
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      gradient_accumulation_steps=2, **kwargs)
    cfg = args.to_config(model_path="m", train_rows=8)
    assert (cfg.train.log_completions, cfg.train.completions_to_print) == (logged, printed)
    assert args.ignored == []


def test_a_grpo_script_with_log_completions_writes_the_completions_and_their_extra_columns(model_dir, tmp_path):
    def topical(completions, topic, log_extra, **kwargs):
        log_extra("topic", topic)
        return [float(t in c[0]["content"]) for t, c in zip(topic, completions)]

    def length(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Tell me about {w}."}], "topic": w}
                              for w in ("cats", "dogs")])
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, max_steps=2,
                      max_completion_length=4, logging_steps=1, log_completions=True, num_completions_to_print=1)
    GRPOTrainer(model=str(model_dir), reward_funcs=[topical, length], args=args, train_dataset=chat).train()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4
    for r in rows:  # the topic column on the row of its prompt; each function's reward for that completion
        assert f"Tell me about {r['extra']['topic']}." in r["prompt"]
        assert r["rewards"] == {"topical": float(r["extra"]["topic"] in r["completion"]),
                                "length": float(len(r["completion"]))}
        assert r["reward"] == sum(r["rewards"].values())
    assert "[rl] Step 2/2: 1 of 4 completions" in (tmp_path / "train.log").read_text()


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_generations=3), "divisible by num_generations"),  # TRL's own check, as the config is made
    (dict(lr_scheduler_type="polynomial"), "lr_scheduler_type='polynomial' is not one of"),
    (dict(loss_type="cispo"), r"loss_type='cispo'\): lmrl's losses are grpo, dapo, bnpo, dr_grpo"),
    (dict(generation_kwargs={"num_beams": 4}), r"GRPOConfig\(generation_kwargs=\{'num_beams': 4\}\): lmrl takes "
                                               "temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens, "
                                               "max_tokens from generation_kwargs; num_beams has no lmrl equivalent"),
    (dict(generation_kwargs={"max_new_tokens": 8, "max_tokens": 9}), "max_new_tokens and max_tokens both set"),
    (dict(repetition_penalty=0.0), "train.repetition_penalty must be > 0, got 0.0"),
    (dict(min_p=1.5), r"train.min_p must be in \[0, 1\], got 1.5"),
    (dict(cast_lm_head_to_fp32=True), r"cast_lm_head_to_fp32=True\): the head runs in the model's dtype"),
    (dict(importance_sampling_level="sentence"), r"importance_sampling_level='sentence'\): lmrl's levels are token, "
                                                 "sequence, sequence_token"),
    (dict(delta=1.1), r"GRPOConfig\(delta=1.1\): must be > 1 \+ epsilon_high = 1.2"),
    (dict(epsilon_high=0.28, delta=1.25), r"GRPOConfig\(delta=1.25\): must be > 1 \+ epsilon_high = 1.28"),
    (dict(top_entropy_quantile=1.5), r"algo.top_entropy_quantile must be in \[0, 1\], got 1.5"),
    (dict(optim="sgd"), "lmrl trains with AdamW"),
    (dict(report_to=["mlflow"]), "lmrl reports to tensorboard and wandb"),
])
def test_grpo_arguments_lmrl_cannot_honour_are_refused_with_the_name(model_dir, tmp_path, kwargs, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        GRPOConfig(output_dir=str(tmp_path), **kwargs).to_config(model_path=str(model_dir), train_rows=8)


def test_min_p_repetition_penalty_and_generation_kwargs_set_the_sampling_keys(tmp_path):
    train = GRPOConfig(output_dir=str(tmp_path), min_p=0.05, repetition_penalty=1.2).to_config(
        model_path="m", train_rows=8).train
    assert (train.min_p, train.repetition_penalty) == (0.05, 1.2)
    # generation_kwargs override the fields, as TRL updates its GenerationConfig / SamplingParams with them
    args = GRPOConfig(output_dir=str(tmp_path), top_p=0.9, min_p=0.05, max_completion_length=32,
                      generation_kwargs={"top_p": 0.8, "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.1,
                                         "temperature": 0.7, "max_tokens": 12})
    cfg = args.to_config(model_path="m", train_rows=8)
    t = cfg.train
    assert (t.top_p, t.top_k, t.min_p, t.repetition_penalty, t.temperature) == (0.8, 0, 0.1, 1.1, 0.7)
    assert cfg.task.max_new_tokens == 12 and args.ignored == []
    cfg = GRPOConfig(output_dir=str(tmp_path), generation_kwargs='{"max_new_tokens": 7, "min_p": null}').to_config(
        model_path="m", train_rows=8)  # a JSON string, as TRL's command line gives it; None leaves an option off
    assert cfg.task.max_new_tokens == 7 and cfg.train.min_p == 0.0


def test_gspo_intellect2_and_high_entropy_fields_set_the_algo_keys(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, importance_sampling_level="sequence", delta=4.0,
                      top_entropy_quantile=0.2, off_policy_mask_threshold=0.5)
    algo = args.to_config(model_path="m", train_rows=8).algo
    assert (algo.ratio_level, algo.clip_ratio_max, algo.top_entropy_quantile, algo.off_policy_mask_threshold) == (
        "sequence", 4.0, 0.2, 0.5)
    assert args.ignored == []
    algo = GRPOConfig(output_dir=str(tmp_path), importance_sampling_level="sequence_token").to_config(
        model_path="m", train_rows=8).algo  # GSPO-token, TRL's trl.experimental.gspo_token
    assert (algo.ratio_level, algo.clip_ratio_max, algo.top_entropy_quantile, algo.off_policy_mask_threshold) == (
        "sequence_token", None, 1.0, None)


def test_a_trl_grpo_script_trains_with_gspo_a_ratio_cap_and_high_entropy_tokens(model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), learning_rate=1e-2, num_generations=4, max_completion_length=6,
                      per_device_train_batch_size=8, max_steps=4, num_iterations=2, bf16=False, report_to="none",
                      importance_sampling_level="sequence", delta=2.0, top_entropy_quantile=0.2,
                      off_policy_mask_threshold=0.5)
    GRPOTrainer(model=str(model_dir), reward_funcs=reward_len, args=args, train_dataset=PROMPTS).train()
    steps = [r for r in read_metrics(tmp_path) if "clip_ratio/region_mean" in r]
    assert len(steps) == 2 and all(v == v for r in steps for v in r.values() if isinstance(v, float))


def test_a_misspelt_argument_fails_where_the_config_is_made_as_in_trl(tmp_path):
    with pytest.raises(TypeError, match="num_generatoins"):
        GRPOConfig(output_dir=str(tmp_path), num_generatoins=4)


def test_arguments_that_change_nothing_are_accepted_and_listed(model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), logging_strategy="epoch", push_to_hub=True, logging_steps=10,
                      max_steps=1)
    args.to_config(model_path=str(model_dir), train_rows=8)
    assert args.ignored == ["logging_strategy", "push_to_hub"]  # logging_steps=10 is TRL's default: not named


def test_trls_derived_generation_sizes_are_what_lmrl_does(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, gradient_accumulation_steps=2,
                      generation_batch_size=16, num_generations=4)  # one generation per optimizer step
    cfg = args.to_config(model_path="m", train_rows=8)
    assert (cfg.train.rollout_size, cfg.algo.minibatch_size, cfg.train.ga_steps) == (16, 0, 2)
    with pytest.raises(ConfigError, match="steps_per_generation=3, gradient_accumulation_steps=2"):
        GRPOConfig(output_dir=str(tmp_path), gradient_accumulation_steps=2, steps_per_generation=3,
                   num_generations=4).to_config(model_path="m", train_rows=8)


@pytest.mark.parametrize("kwargs, steps, rollout, minibatch, epochs", [
    (dict(), 100, 8, 0, 1),
    (dict(num_iterations=2), 50, 8, 0, 2),  # TRL: 2 optimizer steps per generation
    (dict(steps_per_generation=4, gradient_accumulation_steps=2), 50, 32, 16, 1),
    (dict(generation_batch_size=64, num_iterations=2), 7, 64, 8, 2),  # 8 x 2 = 16 per generation: ceil(100/16)
])
def test_trl_optimizer_steps_become_generations(kwargs, steps, rollout, minibatch, epochs, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=100,
                      warmup_steps=20, logging_steps=8, save_steps=40, eval_strategy="steps", eval_steps=30, **kwargs)
    cfg = args.to_config(model_path="m", train_rows=64)
    assert (cfg.train.steps, cfg.train.rollout_size, cfg.algo.minibatch_size, cfg.algo.ppo_epochs) == (
        steps, rollout, minibatch, epochs)
    per = 100 // steps if steps != 7 else 16
    assert cfg.schedule.warmup_steps == -(-20 // per)
    assert (cfg.train.log_every, cfg.train.ckpt_every, cfg.train.eval_every) == (
        max(1, round(8 / per)), max(1, round(40 / per)), max(1, round(30 / per)))
    assert any("one lmrl RL step is one generation" in n for n in args.notes) == (per > 1)


def test_trl_epochs_with_num_iterations_sample_each_prompt_group_once_per_epoch(tmp_path):
    # TRL: 64 prompts x 4 completions / 32 per step = 8 generations per epoch, each trained twice
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=32, num_generations=4, num_train_epochs=2,
                      num_iterations=2)
    cfg = args.to_config(model_path="m", train_rows=64)
    assert (cfg.train.steps, cfg.algo.ppo_epochs) == (16, 2)


def test_bnpo_says_where_it_differs_from_trl(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), loss_type="bnpo", gradient_accumulation_steps=2, num_generations=4)
    assert args.to_config(model_path="m", train_rows=8).algo.loss_level == "token"
    assert any("bnpo" in note for note in args.notes)
    single = GRPOConfig(output_dir=str(tmp_path), loss_type="bnpo", num_generations=4)
    single.to_config(model_path="m", train_rows=8)
    assert not any("bnpo" in note for note in single.notes)  # one micro-batch: bnpo and dapo are the same loss


# -- RLOO --------------------------------------------------------------------------------------------------
def rloo_script(RLOOConfig, RLOOTrainer, model, dataset, out):  # noqa: N803  (TRL's class names as arguments)
    """A TRL RLOO script, as TRL's RLOOTrainer docs write it (smaller); two passes over each generation, so
    the second one's ratios have moved."""
    training_args = RLOOConfig(output_dir=str(out), learning_rate=1e-2, num_generations=4, max_completion_length=6,
                               per_device_train_batch_size=8, max_steps=4, num_iterations=2, logging_steps=1,
                               report_to="none", bf16=False)
    trainer = RLOOTrainer(model=str(model), reward_funcs=reward_len, args=training_args, train_dataset=dataset)
    trainer.train()
    trainer.save_model()
    return trainer


def test_a_trl_rloo_script_trains_and_saves_with_lmrls_trainer(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "rloo"
    trainer = rloo_script(RLOOConfig, RLOOTrainer, model_dir, PROMPTS, out)
    algo = trainer.config.algo
    # TRL's RLOO loss and defaults: beta 0.05, its k1 KL in the reward, one ratio per completion
    assert (algo.name, algo.group_size, algo.kl_coef, algo.ppo_epochs) == ("rloo", 4, 0.05, 2)
    assert (algo.ratio_level, algo.loss_level, algo.kl_in_reward, algo.kl_estimator) == (
        "sequence_sum", "sequence", True, "k1")
    # 4 of TRL's optimizer steps: 2 generations, each trained twice
    assert (trainer.config.train.steps, trainer.state.global_step) == (2, 2)
    steps = [r for r in read_metrics(out) if "train/avg_reward" in r]
    assert len(steps) == 2
    assert all("clip_ratio/region_mean" in r and "kl" in r and "train/shaped_reward_mean" in r for r in steps)
    assert all(v == v for r in steps for v in r.values() if isinstance(v, float))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    start = AutoModelForCausalLM.from_pretrained(model_dir)
    assert any(not torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), start.state_dict().values()))


@pytest.mark.parametrize("fields, keys", [
    (dict(), {"algo.name": "rloo", "algo.ratio_level": "sequence_sum", "algo.loss_level": "sequence",
              "algo.kl_in_reward": True, "algo.kl_estimator": "k1", "algo.kl_coef": 0.05, "algo.group_size": 2,
              "algo.normalize_advantages": False, "reward.clip": [], "run.trainer": "rl", "task.name": "prompts"}),
    (dict(beta=0.2), {"algo.kl_coef": 0.2, "algo.kl_in_reward": True}),
    (dict(beta=0.0), {"algo.kl_coef": 0.0}),
    (dict(reward_clip_range=(-2, 3)), {"reward.clip": [-2.0, 3.0]}),
    (dict(normalize_advantages=True), {"algo.normalize_advantages": True}),
    (dict(num_generations=4, epsilon=0.1, epsilon_high=0.3, num_iterations=2, mask_truncated_completions=True),
     {"algo.group_size": 4, "algo.clip_range_left": 0.1, "algo.clip_range_right": 0.3, "algo.ppo_epochs": 2,
      "algo.mask_truncated_completions": True}),
    (dict(temperature=0.7, top_p=0.9, top_k=5, max_completion_length=12, per_device_train_batch_size=4,
          steps_per_generation=2, max_steps=10),
     {"train.temperature": 0.7, "train.top_p": 0.9, "train.top_k": 5, "task.max_new_tokens": 12,
      "train.rollout_size": 8, "algo.minibatch_size": 4, "train.steps": 5}),
    (dict(use_vllm=True, log_completions=True), {"rollout.engine": "vllm", "train.log_completions": True}),
])
def test_each_rloo_field_lands_on_its_lmrl_key(tmp_path, fields, keys):
    args = RLOOConfig(output_dir=str(tmp_path), use_cpu=True, **fields)
    cfg = args.to_config(model_path="m", train_rows=8)
    for key, value in keys.items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value, key
    assert args.ignored == []
    assert any("population std" in note for note in args.notes) == bool(fields.get("normalize_advantages"))


def test_rloos_reward_clip_range_comes_from_a_config_file_and_a_bad_one_is_refused(tmp_path):
    from lmrl.trl import TrlParser

    (tmp_path / "rloo.yaml").write_text("reward_clip_range: [-1, 2]\nnormalize_advantages: true\n")
    (args,) = TrlParser((RLOOConfig,)).parse_args_and_config(["--config", str(tmp_path / "rloo.yaml"),
                                                              "--output_dir", str(tmp_path), "--use_cpu"])
    cfg = args.to_config(model_path="m", train_rows=8)
    assert (cfg.reward.clip, cfg.algo.normalize_advantages) == ([-1.0, 2.0], True)
    # TRL's command line parses the tuple into characters: refused in one line naming the field
    (args,) = TrlParser((RLOOConfig,)).parse_args_and_config(["--output_dir", str(tmp_path), "--use_cpu",
                                                              "--reward_clip_range", "1"])
    with pytest.raises(ConfigError, match=r"RLOOConfig\(reward_clip_range=\('1',\)\): lmrl takes two finite numbers "
                                          r"\(low, high\) with low < high \(reward.clip\)") as e:
        args.to_config(model_path="m", train_rows=8)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"reward_clip_range=\(2.0, 1.0\)"):
        RLOOConfig(output_dir=str(tmp_path), reward_clip_range=(2.0, 1.0)).to_config(model_path="m", train_rows=8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_generations=1), "RLOO requires at least 2 generations"),  # TRL's own check, as the config is made
    (dict(num_generations=3), "divisible by num_generations"),
    (dict(use_transformers_continuous_batching=True), r"RLOOConfig\(use_transformers_continuous_batching=True\): lmrl "
                                                      "samples with its own loop"),
    (dict(generation_kwargs={"num_beams": 4}), r"RLOOConfig\(generation_kwargs=\{'num_beams': 4\}\)"),
    (dict(gradient_accumulation_steps=2, steps_per_generation=3), r"RLOOConfig\(steps_per_generation=3, "
                                                                  r"gradient_accumulation_steps=2\)"),
])
def test_rloo_arguments_lmrl_cannot_honour_are_refused_with_the_name(tmp_path, kwargs, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        RLOOConfig(output_dir=str(tmp_path), **kwargs).to_config(model_path="m", train_rows=8)


def test_grpo_takes_trls_importance_sampling_levels_not_rloos_summed_ratio(tmp_path):
    with pytest.raises(ConfigError, match=r"importance_sampling_level='sequence_sum'\): lmrl's levels are token, "
                                          "sequence, sequence_token$"):
        GRPOConfig(output_dir=str(tmp_path), importance_sampling_level="sequence_sum").to_config(model_path="m",
                                                                                                 train_rows=8)


PAIRS = Dataset.from_list([{"prompt": f"Is {a} bigger than {b}?", "chosen": " Yes." if a > b else " No.",
                            "rejected": " No." if a > b else " Yes."} for a, b in
                           [(3, 1), (2, 5), (9, 4), (1, 7), (6, 2), (4, 8), (8, 3), (5, 9)]])


def dpo_script(DPOConfig, DPOTrainer, model, tokenizer, dataset, out):  # noqa: N803
    """A TRL DPO script, as TRL's quick start writes it (smaller)."""
    training_args = DPOConfig(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4, max_steps=2,
                              logging_steps=1, report_to="none", beta=0.2, bf16=False)
    trainer = DPOTrainer(model=model, args=training_args, processing_class=tokenizer, train_dataset=dataset)
    trainer.train()
    return trainer


def test_a_trl_dpo_script_trains_with_lmrls_trainer(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = dpo_script(DPOConfig, DPOTrainer, model, tokenizer, PAIRS, tmp_path / "dpo")
    cfg = trainer.config
    assert (cfg.run.trainer, cfg.dpo.beta, cfg.dpo.loss_type, cfg.data.batch_size, cfg.train.max_steps) == \
        ("dpo", 0.2, "sigmoid", 4, 2)
    assert (cfg.data.max_length, cfg.optim.lr, cfg.optim.weight_decay) == (1024, 1e-3, 0.0)
    steps = [r for r in read_metrics(tmp_path / "dpo") if "rewards/accuracies" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()), "the model did not train"


def test_peft_config_gives_the_lora_settings(model_dir, tmp_path):
    from peft import LoraConfig

    peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    cfg = DPOConfig(output_dir=str(tmp_path)).to_config(model_path=str(model_dir), train_rows=8, peft_config=peft)
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (4, 8.0, 0.0, ["q_proj", "v_proj"])


def test_rl_trainer_takes_a_prompt_dataset_in_place_of_files(model_dir, tmp_path):
    cfg = load_config(None, ["run.trainer=rl", "model.type=hf", f"model.path={model_dir}", "task.name=prompts",
                             "task.chat=false", "sft.steps=0", "algo.name=grpo", "algo.group_size=4",
                             "train.rollout_size=8", "train.steps=1", "task.max_new_tokens=4", "eval.size=2",
                             f"run.dir={tmp_path / 'run'}", "run.progress=false", "run.tensorboard=false"])
    trainer = RLTrainer(cfg, reward_funcs=reward_len, train_dataset=PROMPTS)
    assert len(trainer.task.heldout_ids) == 2  # no eval_dataset: the first eval.size training prompts
    trainer.train()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps_done"] == 1


def test_a_prompt_task_without_prompts_or_reward_is_refused_before_the_model_loads(tmp_path):
    base = ["run.trainer=rl", "model.type=hf", "model.path=/nonexistent", "task.name=prompts", "sft.steps=0",
            f"run.dir={tmp_path}"]
    with pytest.raises(ConfigError, match="reads its problems from JSONL.*or pass train_dataset="):
        RLTrainer(load_config(None, base))
    with pytest.raises(ConfigError, match="task.name=prompts needs a reward"):
        RLTrainer(load_config(None, base), train_dataset=PROMPTS)
    with pytest.raises(Exception, match=r"row 1: a prompt data set needs a 'prompt'"):
        RLTrainer(load_config(None, base), reward_funcs=reward_len, train_dataset=[{"prompt": "a"}, {"text": "b"}])


@pytest.mark.slow
def test_the_same_scripts_run_on_trl_itself(model_dir, tmp_path):
    """The scripts above are TRL's own: with TRL's classes they train too (so lmrl's are drop-in)."""
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    grpo_script(trl.GRPOConfig, trl.GRPOTrainer, model_dir, PROMPTS, tmp_path / "trl-grpo")
    rloo_script(trl.RLOOConfig, trl.RLOOTrainer, model_dir, PROMPTS, tmp_path / "trl-rloo")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    dpo_script(trl.DPOConfig, trl.DPOTrainer, model, AutoTokenizer.from_pretrained(model_dir), PAIRS,
               tmp_path / "trl-dpo")
