"""TRL's config names (GRPOConfig, DPOConfig, TrainingArguments) set the lmrl key each stands for,
written bare, under that key's section or under algo / dpo; a typo near one suggests it; and the
key reference lists every key with its value and help text."""

import dataclasses

import pytest
import yaml

from lmrl.config import (TRL_ALIASES, Config, ConfigError, config_from_dict, config_to_dict, describe_config,
                         load_config)

# Each TRL name: how a user writes it, and the lmrl keys that then hold which values (on adder-grpo).
ALIAS_CASES = [
    ("num_generations", ["algo.num_generations=8"], {"algo.group_size": 8}),
    ("num_generations", ["num_generations=8"], {"algo.group_size": 8}),
    ("beta", ["algo.beta=0.04"], {"algo.kl_coef": 0.04}),
    ("epsilon", ["algo.epsilon=0.1"], {"algo.clip_range_left": 0.1, "algo.clip_range_right": 0.1}),
    ("epsilon", ["epsilon=0.1", "epsilon_high=0.3"], {"algo.clip_range_left": 0.1, "algo.clip_range_right": 0.3}),
    ("epsilon_high", ["epsilon_high=0.3", "epsilon=0.1"], {"algo.clip_range_left": 0.1, "algo.clip_range_right": 0.3}),
    ("epsilon", ["algo.clip_range_right=0.3", "epsilon=0.1"], {"algo.clip_range_left": 0.1,
                                                               "algo.clip_range_right": 0.3}),
    ("loss_type", ["algo.loss_type=grpo"], {"algo.loss_level": "sequence"}),
    ("loss_type", ["algo.loss_type=bnpo"], {"algo.loss_level": "token"}),
    ("loss_type", ["algo.loss_type=dr_grpo"], {"algo.loss_level": "constant"}),
    ("loss_type", ["algo.loss_type=dapo", "algo.loss_level=sequence"], {"algo.loss_level": "sequence"}),
    ("max_completion_length", ["max_completion_length=64"], {"task.max_new_tokens": 64}),
    ("max_completion_length", ["task.max_completion_length=64"], {"task.max_new_tokens": 64}),
    ("max_prompt_length", ["max_prompt_length=128"], {"task.max_prompt_length": 128}),
    ("num_iterations", ["algo.num_iterations=2"], {"algo.ppo_epochs": 2}),
    ("scale_rewards", ["scale_rewards=batch"], {"algo.scale_rewards": "batch"}),
    ("scale_rewards", ["scale_rewards=false"], {"algo.scale_rewards": "none"}),
    ("scale_rewards", ["scale_rewards=true"], {"algo.scale_rewards": "group"}),
    ("mask_truncated_completions", ["mask_truncated_completions=true"], {"algo.mask_truncated_completions": True}),
    ("importance_sampling_level", ["importance_sampling_level=sequence"], {"algo.ratio_level": "sequence"}),
    ("importance_sampling_level", ["algo.importance_sampling_level=sequence_token"],
     {"algo.ratio_level": "sequence_token"}),
    ("use_bias_correction_kl", ["use_bias_correction_kl=true"], {"algo.kl_ratio_weighted": True}),
    ("delta", ["delta=4"], {"algo.clip_ratio_max": 4.0}),
    ("delta", ["algo.delta=2.5"], {"algo.clip_ratio_max": 2.5}),
    ("top_entropy_quantile", ["top_entropy_quantile=0.2"], {"algo.top_entropy_quantile": 0.2}),
    ("off_policy_mask_threshold", ["off_policy_mask_threshold=0.5"], {"algo.off_policy_mask_threshold": 0.5}),
    ("reward_weights", ["reward.funcs=[tests.trl_rewards:reward_len]", "reward_weights=[2]"], {"reward.weights": [2]}),
    ("disable_dropout", ["disable_dropout=false"], {"train.disable_dropout": False}),
    ("log_completions", ["log_completions=true"], {"train.log_completions": True}),
    ("num_completions_to_print", ["log_completions=true", "num_completions_to_print=4"],
     {"train.completions_to_print": 4}),
    ("temperature", ["algo.temperature=0.7"], {"train.temperature": 0.7}),
    ("top_p", ["top_p=0.9"], {"train.top_p": 0.9}),
    ("top_k", ["algo.top_k=50"], {"train.top_k": 50}),
    ("min_p", ["min_p=0.05"], {"train.min_p": 0.05}),
    ("min_p", ["min_p=null"], {"train.min_p": 0.0}),  # TRL's default, None: off
    ("repetition_penalty", ["algo.repetition_penalty=1.1"], {"train.repetition_penalty": 1.1}),
    ("chat_template_kwargs", ["chat_template_kwargs={enable_thinking: false}"],
     {"model.chat_template_kwargs": {"enable_thinking": False}}),
    ("chat_template_kwargs", ["algo.chat_template_kwargs={enable_thinking: false}"],
     {"model.chat_template_kwargs": {"enable_thinking": False}}),
    ("max_length", ["dpo.max_length=512"], {"data.max_length": 512}),
    ("learning_rate", ["learning_rate=1e-6"], {"optim.lr": 1e-6}),
    ("learning_rate", ["dpo.learning_rate=5e-7"], {"optim.lr": 5e-7}),
    ("learning_rate", ["optim.learning_rate=5e-7"], {"optim.lr": 5e-7}),
    ("weight_decay", ["weight_decay=0.1"], {"optim.weight_decay": 0.1, "sft.weight_decay": 0.01}),
    ("adam_epsilon", ["adam_epsilon=1e-6"], {"optim.eps": 1e-6}),
    ("max_grad_norm", ["algo.max_grad_norm=0.5"], {"train.grad_clip": 0.5}),
    ("warmup_steps", ["warmup_steps=10"], {"schedule.warmup_steps": 10, "sft.warmup_steps": 20}),
    ("gradient_accumulation_steps", ["gradient_accumulation_steps=4"], {"train.ga_steps": 4}),
    ("num_train_epochs", ["num_train_epochs=3"], {"data.epochs": 3.0}),
    ("seed", ["seed=7"], {"run.seed": 7}),
    ("output_dir", ["output_dir=runs/mine"], {"run.dir": "runs/mine"}),
    ("logging_steps", ["logging_steps=5"], {"train.log_every": 5}),
    ("eval_steps", ["eval_steps=25"], {"train.eval_every": 25}),
    ("save_steps", ["save_steps=25"], {"train.ckpt_every": 25}),
    ("save_total_limit", ["save_total_limit=3"], {"train.keep_checkpoints": 3}),
]


def _value(cfg, key):
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


# names of the offline trainers' data keys, which an RL config refuses
OFFLINE_NAMES = {"max_length", "num_train_epochs"}


@pytest.mark.parametrize("name, overrides, expected", ALIAS_CASES)
def test_a_trl_name_sets_the_lmrl_key_it_stands_for(name, overrides, expected):
    # arithmetic answers are never cut off, so masking truncated completions is for a text task
    preset = ("math-grpo-smollm2" if name == "mask_truncated_completions" else
              "dpo-smollm2" if name in OFFLINE_NAMES else "adder-grpo")
    cfg = load_config(preset, overrides)
    assert {key: _value(cfg, key) for key in expected} == expected
    written = next(key for key, _, _ in (o.partition("=") for o in overrides) if key.rpartition(".")[2] == name)
    assert any(note.startswith(f"{written} is TRL's name for ") for note in cfg.aliases)


def test_an_offline_trainers_trl_name_in_an_rl_config_is_refused_naming_the_key_it_set():
    with pytest.raises(ConfigError) as e:
        load_config("adder-grpo", ["num_train_epochs=3"])
    assert str(e.value) == ("data.epochs=3.0 is for the offline trainers (run.trainer=sft, dpo, reward); "
                            "run.trainer=rl does not read it (an RL run's is train.steps)")


def test_every_trl_name_in_the_table_has_a_case():
    mapped = {name for name, alias in TRL_ALIASES.items() if alias.key is not None}
    assert mapped == {name for name, _, _ in ALIAS_CASES}


def test_a_config_without_trl_names_notes_none():
    assert load_config("adder-grpo", ["algo.group_size=8"]).aliases == ()


def test_trl_names_in_a_yaml_file_bare_and_under_a_section(tmp_path):
    path = tmp_path / "trl.yaml"
    path.write_text("base: adder-grpo\nlearning_rate: 1.0e-6\nnum_generations: 8\nepsilon_high: 0.3\n"
                    "chat_template_kwargs:\n  enable_thinking: false\n"  # a bare TRL name whose value is a mapping
                    "algo:\n  epsilon: 0.1\n  loss_type: dr_grpo\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.algo.group_size, cfg.algo.loss_level) == (1e-6, 8, "constant")
    assert (cfg.algo.clip_range_left, cfg.algo.clip_range_right) == (0.1, 0.3)  # epsilon_high wins in its file
    assert cfg.model.chat_template_kwargs == {"enable_thinking": False}
    assert len(cfg.aliases) == 6
    assert config_to_dict(config_from_dict(yaml.safe_load(path.read_text().replace("base: adder-grpo\n", ""))))[
        "algo"]["group_size"] == 8


def test_epsilon_on_the_command_line_moves_a_presets_upper_clip_too():
    # adder-grpo sets clip_range_right 0.28; TRL's epsilon_high defaults to epsilon
    cfg = load_config("adder-grpo", ["epsilon=0.1"])
    assert (cfg.algo.clip_range_left, cfg.algo.clip_range_right) == (0.1, 0.1)


@pytest.mark.parametrize("overrides, message", [
    # TRL's names once had misleading suggestions (kl_horizon, adv_eps, kl_in_reward); now near typos suggest them
    (["algo.num_generation=8"], "unknown key 'algo.num_generation' in override algo.num_generation=8; did you mean "
                                "'algo.num_generations' (TRL's name for algo.group_size)?"),
    (["algo.epsilonn=0.1"], "did you mean 'algo.epsilon' (TRL's name for algo.clip_range_left)?"),
    (["algo.scale_reward=none"], "did you mean 'algo.scale_rewards'?"),
    (["num_generation=8"], "unknown section or key 'num_generation' in override num_generation=8; did you mean "
                           "'num_generations' (TRL's name for algo.group_size)?"),
    (["steps=5"], "unknown key 'steps' in override steps=5; did you mean 'sft.steps' or 'train.steps'?"),
    (["beta=0.1"], "'beta' in override beta=0.1 is ambiguous: write algo.beta for GRPOConfig's (it sets "
                   "algo.kl_coef); DPOConfig's beta is dpo.beta"),
    (["loss_type=dapo"], "'loss_type' in override loss_type=dapo is ambiguous: write algo.loss_type"),
    (["algo.loss_type=dpo"], "algo.loss_type='dpo' is not one of grpo, bnpo, dr_grpo, dapo (TRL's loss_type, which "
                             "sets algo.loss_level; from override algo.loss_type=dpo); did you mean 'dapo'?"),
    (["scale_rewards=std"], "scale_rewards='std' is not one of group, batch, none, true, false"),
    (["num_generations=four"], "algo.group_size must be an int, got 'four' (from override num_generations=four, as "
                               "TRL's num_generations)"),
    (["per_device_train_batch_size=8"], "per_device_train_batch_size (TRL's TrainingArguments) has no single lmrl "
                                        "key in override per_device_train_batch_size=8: lmrl sizes a whole update"),
    (["algo.top_p=1.5"], "train.top_p must be in (0, 1], got 1.5"),
    (["min_p=1.5"], "train.min_p must be in [0, 1], got 1.5"),
    (["importance_sampling_level=sequence_sum"], "importance_sampling_level='sequence_sum' is not one of token, "
                                                 "sequence, sequence_token"),  # RLOOConfig's level, not GRPOConfig's
    (["repetition_penalty=0"], "train.repetition_penalty must be > 0, got 0"),
    (["chat_template_kwargs=no_thinking"], "model.chat_template_kwargs must be a mapping, got 'no_thinking' (from "
                                           "override chat_template_kwargs=no_thinking, as TRL's chat_template_kwargs)"),
])
def test_trl_name_mistakes_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("adder-grpo", overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_no_trl_spelling_hides_an_lmrl_key():
    from lmrl.config import _ALIAS_SPELLINGS

    cfg = Config()
    keys = {f"{s.name}.{f.name}" for s in dataclasses.fields(cfg) for f in dataclasses.fields(getattr(cfg, s.name))}
    assert not keys & set(_ALIAS_SPELLINGS)
    assert "dpo.beta" in keys and "algo.beta" in _ALIAS_SPELLINGS and "beta" not in _ALIAS_SPELLINGS


def test_resume_from_needs_resume_auto():
    with pytest.raises(ConfigError) as e:
        load_config("adder", ["run.resume_from=runs/x/checkpoints/step_2"])
    assert str(e.value) == ("run.resume_from=runs/x/checkpoints/step_2 resumes a run: set run.resume=auto too "
                            "(--resume_from_checkpoint PATH sets both)")
    cfg = load_config("adder", ["run.resume_from=runs/x/checkpoints/step_2", "run.resume=auto"])
    assert cfg.run.resume_from == "runs/x/checkpoints/step_2"


@pytest.mark.parametrize("preset", [None, "adder-grpo", "dpo-smollm2"])
def test_the_key_reference_lists_every_key_with_its_value_and_help(preset):
    cfg = load_config(preset) if preset else Config()
    text = describe_config(cfg)
    assert yaml.safe_load(text) == config_to_dict(cfg)  # every key, with this config's value, loads back
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            assert f"# {f.metadata['help']}" in text, f"{section.name}.{f.name}"
    assert "  group_size: 1 " in describe_config() and "(>= 1)" in text
    for name, alias in TRL_ALIASES.items():
        assert f"#   {name} " in text and (alias.key is None or f"-> {alias.key}" in text)


def test_trl_names_that_once_drew_misleading_suggestions_are_understood():
    # were: did you mean algo.kl_horizon / algo.adv_eps / algo.kl_in_reward
    cfg = load_config("adder-grpo", ["algo.num_generations=8", "algo.epsilon=0.1", "algo.scale_rewards=none"])
    assert (cfg.algo.group_size, cfg.algo.clip_range_left, cfg.algo.scale_rewards) == (8, 0.1, "none")
