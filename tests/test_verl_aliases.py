"""A verl or OpenRLHF user's config names set the lmrl key each stands for, or are refused in one line
saying what to write; lmrl's own keys that a run would not read are refused; and the docs' tables
are the alias tables as the code has them."""

import dataclasses

import pytest

from lmrl.algos.base import VALUE_KEYS
from lmrl.config import (OPENRLHF_ALIASES, TRL_ALIASES, VERL_ALIASES, Config, ConfigError, config_to_dict,
                         list_presets, load_config)
from lmrl.config.aliases import DOC, RL_SPELLINGS, SPELLINGS, all_keys, markdown_tables, spelling, with_tables
from lmrl.config.schema import OFFLINE_SECTIONS, WARMUP_KEYS, unread_keys

RL = "math-grpo-smollm2"  # GRPO on an hf model, no warm-up (sft.steps: 0)


def _value(cfg, key):
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def _refused(overrides, preset=RL) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(preset, overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


# -- keys a run does not read --------------------------------------------------------------------
# A value away from the default for every key of the offline trainers' sections but data.prompt_key, which
# in an RL run is verl's name for task.prompt_key (TRANSLATED).
OFFLINE_VALUES = {
    "data.train_file": "x.jsonl", "data.eval_file": "y.jsonl", "data.generate": "preferences",
    "data.generate_train": 10, "data.generate_test": 10, "data.max_length": 3, "data.batch_size": 2,
    "data.epochs": 2.0, "data.chat": False, "data.eval_size": 4, "data.text_field": "body",
    "data.response_key": "answer", "data.messages_key": "dialog", "data.chosen_key": "better",
    "data.rejected_key": "worse",
    "data.truncation_mode": "keep_end", "data.packing": True, "data.packing_strategy": "wrapped",
    "data.padding_free": True, "dpo.beta": 0.2, "dpo.loss_type": "ipo", "dpo.label_smoothing": 0.1,
    "dpo.ipo_length_normalize": False,
}


def test_every_offline_key_has_a_refusal_case():
    offline = {f"{s}.{f.name}" for s in OFFLINE_SECTIONS for f in dataclasses.fields(getattr(Config(), s))}
    assert set(OFFLINE_VALUES) == offline - set(RL_SPELLINGS) and set(RL_SPELLINGS) == {"data.prompt_key"}


@pytest.mark.parametrize("key", sorted(OFFLINE_VALUES))
def test_an_offline_trainers_key_in_an_rl_run_is_refused_naming_key_and_value(key):
    value = OFFLINE_VALUES[key]
    shown = str(value).lower() if isinstance(value, bool) else value
    extra = ["data.packing=true"] if key == "data.packing_strategy" else []  # packing_strategy needs packing on
    message = _refused([f"{key}={shown}", *extra])
    assert "run.trainer=rl does not read it" in message
    assert message.startswith(("data.packing=True" if extra else f"{key}={value}") + " is for ")


@pytest.mark.parametrize("key, meant", [
    ("data.max_length=3", "(an RL run's is task.max_new_tokens for completions, task.max_prompt_length for prompts)"),
    ("data.batch_size=2", "(an RL run's is train.rollout_size)"),
    ("data.epochs=2", "(an RL run's is train.steps)"),
    ("data.train_file=x.jsonl", "(an RL run's is task.train_file)"),
    ("data.eval_size=4", "(an RL run's is eval.size)"),
])
def test_an_offline_key_refused_in_rl_names_the_rl_key_meant(key, meant):
    message = _refused([key])
    assert message == (f"{key.replace('=2', '=2.0') if key.startswith('data.epochs') else key} is for the offline "
                       f"trainers (run.trainer=sft, dpo, reward); run.trainer=rl does not read it {meant}")


WARMUP_CASES = [
    ("sft.warmup_steps=10", "sft.warmup_steps=10 sets the supervised warm-up before RL, which sft.steps=0 skips (the "
                            "RL stage's is schedule.warmup_steps)"),
    ("sft.lr=1e-4", "sft.lr=0.0001 sets the supervised warm-up before RL, which sft.steps=0 skips (the RL stage's is "
                    "optim.lr)"),
    ("sft.weight_decay=0.1", "sft.weight_decay=0.1 sets the supervised warm-up before RL, which sft.steps=0 skips "
                             "(the RL stage's is optim.weight_decay)"),
    ("sft.min_lr_ratio=0.5", "sft.min_lr_ratio=0.5 sets the supervised warm-up before RL, which sft.steps=0 skips "
                             "(the RL stage's is schedule.min_lr_ratio)"),
    ("sft.batch_size=8", "sft.batch_size=8 sets the supervised warm-up before RL, which sft.steps=0 skips (set "
                         "sft.steps > 0 to run it)"),
    ("sft.examples=10", "sft.examples=10 sets the supervised warm-up before RL, which sft.steps=0 skips (set "
                        "sft.steps > 0 to run it)"),
]


@pytest.mark.parametrize("override, message", WARMUP_CASES)
def test_a_warm_up_key_without_a_warm_up_is_refused(override, message):
    assert _refused([override]) == message


def test_every_warm_up_key_but_its_step_count_has_a_case():
    assert {o.partition("=")[0] for o, _ in WARMUP_CASES} == set(WARMUP_KEYS) - {"sft.steps"}


@pytest.mark.parametrize("override, message", [
    ("sft.steps=5", "sft.steps=5 sets the supervised warm-up before RL (run.trainer=rl); run.trainer=dpo runs none "
                    "(its own is train.max_steps)"),
    ("sft.lr=1e-5", "sft.lr=1e-05 sets the supervised warm-up before RL (run.trainer=rl); run.trainer=dpo runs none "
                    "(its own is optim.lr)"),
    ("sft.examples=10", "sft.examples=10 sets the supervised warm-up before RL (run.trainer=rl); run.trainer=dpo "
                        "runs none"),
])
def test_a_warm_up_key_in_an_offline_run_is_refused(override, message):
    assert _refused([override], preset="dpo-smollm2") == message


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce"])
@pytest.mark.parametrize("key, value", [("vf_coef", 0.3), ("value_clip", 0.5), ("gamma", 0.99), ("lam", 1.0)])
def test_a_value_model_key_without_a_value_model_is_refused(algo, key, value):
    group = ["algo.group_size=1"] if algo == "reinforce" else []
    message = _refused([f"algo.name={algo}", *group, f"algo.{key}={value}"])
    default = dataclasses.fields(Config().algo)[[f.name for f in dataclasses.fields(Config().algo)].index(key)].default
    assert message == (f"algo.{key}={value} sets {VALUE_KEYS[key]}; algo.name={algo} has no value model (leave it "
                       f"at {default})")


def test_ppo_takes_its_value_model_keys():
    cfg = load_config("adder-ppo", ["algo.value_clip=0.5", "algo.vf_coef=0.3", "algo.gamma=0.99", "algo.lam=1.0"])
    assert (cfg.algo.value_clip, cfg.algo.vf_coef, cfg.algo.gamma, cfg.algo.lam) == (0.5, 0.3, 0.99, 1.0)


def test_the_audits_run_that_trained_ignoring_four_keys_is_refused_at_each_of_them():
    keys = ["data.max_length=3", "data.batch_size=2", "algo.value_clip=0.5", "sft.warmup_steps=10"]
    assert _refused(keys).startswith("algo.value_clip=0.5 sets the clip range of ppo's value loss")
    for key in keys:
        assert _refused([key]).startswith(key)


def test_a_command_line_that_skips_a_presets_warm_up_drops_the_presets_warm_up_keys():
    cfg = load_config("adder", ["sft.steps=0"])  # the adder's preset sets sft.lr, warmup_steps, examples, ...
    assert config_to_dict(cfg)["sft"] == config_to_dict(Config())["sft"]
    # set where the warm-up is skipped, the key is refused
    assert _refused(["sft.steps=0", "sft.warmup_steps=3"], preset="adder").startswith("sft.warmup_steps=3 sets the ")


def test_a_key_set_for_a_skipped_stage_in_a_yaml_file_names_its_line(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: {RL}\nsft:\n  warmup_steps: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert f"(the RL stage's is schedule.warmup_steps) (sft.warmup_steps from {path}:3, sft.steps from " in str(e.value)


def test_an_rl_config_on_an_offline_base_drops_the_bases_data_section(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: sql-sft-smollm2\nrun:\n  trainer: rl\n")  # data.max_length 1024, batch_size 16, ...
    cfg = load_config(path)
    assert config_to_dict(cfg)["data"] == config_to_dict(Config())["data"]
    path.write_text("base: sql-sft-smollm2\nrun:\n  trainer: rl\ndata:\n  batch_size: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith("data.batch_size=8 is for the offline trainers") and f"from {path}:5" in str(e.value)


def test_an_offline_config_on_a_base_with_a_warm_up_drops_the_warm_up(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: adder\nrun:\n  trainer: sft\n")  # the adder's sft.steps 200, sft.lr, ...
    cfg = load_config(path)
    assert config_to_dict(cfg)["sft"] == config_to_dict(Config())["sft"]


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_loads_and_sets_no_key_its_run_does_not_read(preset):
    cfg = load_config(preset)
    for key in unread_keys(cfg):
        section, _, name = key.partition(".")
        assert _value(cfg, key) == getattr(type(getattr(cfg, section))(), name), key


# -- verl's and OpenRLHF's names -------------------------------------------------------------------
# (name in the table, overrides on RL, the lmrl keys and their values after)
TRANSLATED = [
    ("data.max_prompt_length", ["data.max_prompt_length=128"], {"task.max_prompt_length": 128}),
    ("data.max_response_length", ["data.max_response_length=64"], {"task.max_new_tokens": 64}),
    ("data.train_files", ["data.train_files=train.parquet"], {"task.train_file": "train.parquet"}),
    ("data.val_files", ["data.val_files=test.parquet"], {"task.test_file": "test.parquet"}),
    ("data.prompt_key", ["data.prompt_key=question"], {"task.prompt_key": "question"}),
    ("data.shuffle", ["data.shuffle=false"], {"train.prompt_order": "in_order"}),
    ("algorithm.filter_groups.enable", ["algorithm.filter_groups.enable=true"], {"algo.dynamic_sampling": True}),
    ("algorithm.filter_groups.max_num_gen_batches", ["algorithm.filter_groups.max_num_gen_batches=4"],
     {"algo.max_sample_batches": 4}),
    ("actor_rollout_ref.rollout.n", ["actor_rollout_ref.rollout.n=8"], {"algo.group_size": 8}),
    ("actor_rollout_ref.rollout.n", ["rollout.n=8"], {"algo.group_size": 8}),
    ("actor_rollout_ref.actor.ppo_epochs", ["actor_rollout_ref.actor.ppo_epochs=2"], {"algo.ppo_epochs": 2}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=grpo"], {"algo.name": "grpo", "algo.adv_eps": 1e-6}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=rloo"], {"algo.name": "rloo", "algo.adv_eps": 1e-4}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=reinforce_plus_plus"], {"algo.name": "reinforce_plus_plus"}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
     {"algo.name": "reinforce_plus_plus_baseline"}),
    ("advantage_estimator", ["advantage_estimator=reinforce"], {"algo.name": "reinforce_plus_plus"}),
    ("advantage_estimator", ["advantage_estimator=reinforce_baseline", "n_samples_per_prompt=4"],
     {"algo.name": "reinforce_plus_plus_baseline", "algo.group_size": 4}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=gae"],
     {"algo.name": "ppo", "algo.value_model": "separate", "algo.normalize_advantages": True}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=grpo_vectorized"], {"algo.name": "grpo", "algo.adv_eps": 1e-6}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=rloo_vectorized"], {"algo.name": "rloo"}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=grpo_passk", "algorithm.norm_adv_by_std_in_grpo=false"],
     {"algo.name": "grpo", "algo.adv_mode": "passk", "algo.adv_eps": 1e-6, "algo.scale_rewards": "none"}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=opo"], {"algo.name": "grpo", "algo.adv_mode": "opo"}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=4"],
     {"algo.name": "remax", "algo.group_size": 4}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg"],
     {"algo.name": "grpo", "algo.adv_mode": "gpg", "algo.ratio_level": "token"}),
    ("algorithm.adv_estimator", ["algorithm.adv_estimator=gae", "algo.value_model=head"],  # a key written wins
     {"algo.name": "ppo", "algo.value_model": "head", "algo.normalize_advantages": True}),
    ("algorithm.norm_adv_by_std_in_grpo", ["algo.norm_adv_by_std_in_grpo=false"], {"algo.scale_rewards": "none"}),
    ("actor_rollout_ref.actor.use_kl_loss", ["actor.use_kl_loss=true", "algo.kl_in_reward=true"],
     {"algo.kl_in_reward": True}),
    ("actor_rollout_ref.actor.use_kl_loss", ["algo.kl_in_reward=true", "actor.use_kl_loss=true"],
     {"algo.kl_in_reward": False}),
    ("actor_rollout_ref.actor.kl_loss_coef", ["actor_rollout_ref.actor.kl_loss_coef=0.001"], {"algo.kl_coef": 0.001}),
    ("actor_rollout_ref.actor.kl_loss_type", ["algo.kl_loss_type=low_var_kl"],
     {"algo.kl_estimator": "k3", "algo.kl_clamp": 10.0}),
    ("actor_rollout_ref.actor.kl_loss_type", ["actor.kl_loss_type=mse"], {"algo.kl_estimator": "k2", "algo.kl_clamp": None}),
    ("algorithm.use_kl_in_reward", ["algorithm.use_kl_in_reward=true", "algo.kl_coef=0.01"],
     {"algo.kl_in_reward": True, "algo.kl_estimator": "k1"}),
    ("algorithm.use_kl_in_reward", ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=low_var_kl"],
     {"algo.kl_in_reward": True, "algo.kl_estimator": "k3"}),
    ("algorithm.use_kl_in_reward", ["algorithm.use_kl_in_reward=false"], {"algo.kl_in_reward": False}),
    ("algorithm.kl_penalty", ["algorithm.kl_penalty=kl"], {"algo.kl_estimator": "k1"}),
    ("algorithm.kl_ctrl.kl_coef", ["algorithm.kl_ctrl.kl_coef=0.002"], {"algo.kl_coef": 0.002}),
    ("algorithm.kl_ctrl.type", ["algorithm.kl_ctrl.type=fixed"], {"algo.kl_target": 0.0}),
    ("algorithm.kl_ctrl.horizon", ["algorithm.kl_ctrl.horizon=5000"], {"algo.kl_horizon": 5000}),
    ("actor_rollout_ref.actor.clip_ratio", ["actor.clip_ratio=0.1"],
     {"algo.clip_range_left": 0.1, "algo.clip_range_right": 0.1}),
    ("actor_rollout_ref.actor.clip_ratio", ["actor.clip_ratio=0.1", "actor.clip_ratio_high=0.28"],
     {"algo.clip_range_left": 0.1, "algo.clip_range_right": 0.28}),
    ("actor_rollout_ref.actor.clip_ratio_low", ["actor_rollout_ref.actor.clip_ratio_low=0.1"],
     {"algo.clip_range_left": 0.1}),
    ("actor_rollout_ref.actor.clip_ratio_high", ["algo.clip_ratio_high=0.28"], {"algo.clip_range_right": 0.28}),
    ("actor_rollout_ref.actor.clip_ratio_c", ["actor_rollout_ref.actor.clip_ratio_c=3.0"],
     {"algo.clip_ratio_max": 3.0}),
    ("actor_rollout_ref.actor.loss_agg_mode", ["algo.loss_agg_mode=token-mean"], {"algo.loss_level": "token"}),
    ("actor_rollout_ref.actor.loss_agg_mode", ["actor.loss_agg_mode=seq-mean-token-mean"],
     {"algo.loss_level": "sequence"}),
    ("actor_rollout_ref.actor.loss_agg_mode", ["actor.loss_agg_mode=seq-mean-token-sum"],
     {"algo.loss_level": "constant", "algo.loss_constant": 1.0}),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", ["actor.policy_loss.loss_mode=gspo"],
     {"algo.ratio_level": "sequence"}),
    ("actor_rollout_ref.actor.entropy_coeff", ["actor_rollout_ref.actor.entropy_coeff=0.01"], {"algo.ent_coef": 0.01}),
    ("actor_rollout_ref.actor.grad_clip", ["actor.grad_clip=0.5"], {"train.grad_clip": 0.5}),
    ("actor_rollout_ref.actor.optim.lr", ["actor_rollout_ref.actor.optim.lr=1e-6"], {"optim.lr": 1e-6}),
    ("actor_rollout_ref.actor.optim.weight_decay", ["actor.optim.weight_decay=0.1"], {"optim.weight_decay": 0.1}),
    ("actor_rollout_ref.actor.optim.betas", ["actor.optim.betas=[0.9, 0.999]"], {"optim.betas": [0.9, 0.999]}),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", ["actor.optim.lr_warmup_steps=10"],
     {"schedule.warmup_steps": 10}),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", ["actor.optim.lr_warmup_steps=-1"], {"schedule.warmup_steps": 0}),
    ("actor_rollout_ref.actor.optim.warmup_style", ["actor.optim.warmup_style=cosine"], {"schedule.name": "cosine"}),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", ["actor.optim.lr_scheduler_type=cosine"],
     {"schedule.name": "cosine"}),
    ("actor_rollout_ref.actor.optim.min_lr_ratio", ["actor.optim.min_lr_ratio=0.0"], {"schedule.min_lr_ratio": 0.0}),
    ("actor_rollout_ref.rollout.temperature", ["actor_rollout_ref.rollout.temperature=1.0"],
     {"train.temperature": 1.0}),
    ("actor_rollout_ref.rollout.top_p", ["rollout.top_p=0.9"], {"train.top_p": 0.9}),
    ("actor_rollout_ref.rollout.top_k", ["rollout.top_k=-1"], {"train.top_k": 0}),
    ("actor_rollout_ref.rollout.top_k", ["rollout.top_k=20"], {"train.top_k": 20}),
    ("actor_rollout_ref.rollout.name", ["actor_rollout_ref.rollout.name=hf"], {"rollout.engine": "local"}),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", ["actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
     {"rollout.gpu_memory_utilization": 0.5}),
    ("actor_rollout_ref.model.path", ["actor_rollout_ref.model.path=models/x"],
     {"model.path": "models/x", "model.type": "hf"}),
    ("actor_rollout_ref.model.lora_rank", ["actor_rollout_ref.model.lora_rank=32"], {"lora.r": 32}),
    ("actor_rollout_ref.model.lora_alpha", ["model.lora_alpha=64"], {"lora.alpha": 64.0}),
    ("actor_rollout_ref.model.target_modules", ["actor_rollout_ref.model.target_modules=all-linear"],
     {"lora.target_modules": ["all-linear"]}),
    ("actor_rollout_ref.model.enable_gradient_checkpointing",
     ["actor_rollout_ref.model.enable_gradient_checkpointing=true"], {"model.gradient_checkpointing": True}),
    ("critic.optim.lr", ["algo.name=ppo", "algo.value_model=head", "critic.optim.lr=1e-5"], {"algo.critic_lr": 1e-5}),
    ("critic_learning_rate", ["algo.name=ppo", "algo.value_model=head", "critic_learning_rate=9e-6"],
     {"algo.critic_lr": 9e-6}),
    ("critic.cliprange_value", ["algo.name=ppo", "algo.value_model=head", "critic.cliprange_value=0.5"],
     {"algo.value_clip": 0.5}),
    ("algorithm.gamma", ["algo.name=ppo", "algo.value_model=head", "algorithm.gamma=0.99"], {"algo.gamma": 0.99}),
    ("algorithm.lam", ["algo.name=ppo", "algo.value_model=head", "algorithm.lam=1.0"], {"algo.lam": 1.0}),
    ("trainer.total_training_steps", ["trainer.total_training_steps=100"], {"train.steps": 100}),
    ("trainer.test_freq", ["train.test_freq=5"], {"train.eval_every": 5}),
    ("trainer.save_freq", ["trainer.save_freq=10"], {"train.ckpt_every": 10}),
    ("trainer.max_actor_ckpt_to_keep", ["trainer.max_actor_ckpt_to_keep=null"], {"train.keep_checkpoints": 0}),
    ("trainer.resume_mode", ["trainer.resume_mode=auto"], {"run.resume": "auto"}),
    ("trainer.resume_from_path", ["trainer.resume_mode=auto", "trainer.resume_from_path=runs/x/checkpoints/step_2"],
     {"run.resume_from": "runs/x/checkpoints/step_2"}),
    ("trainer.default_local_dir", ["trainer.default_local_dir=runs/mine"], {"run.dir": "runs/mine"}),
    ("trainer.experiment_name", ["trainer.experiment_name=mine"], {"run.name": "mine"}),
    ("trainer.project_name", ["trainer.project_name=proj"], {"run.wandb_project": "proj"}),
    # OpenRLHF
    ("n_samples_per_prompt", ["n_samples_per_prompt=8"], {"algo.group_size": 8}),
    ("dynamic_filtering", ["dynamic_filtering=true"], {"algo.dynamic_sampling": True}),
    ("n_samples_per_prompt", ["rollout.n_samples_per_prompt=8"], {"algo.group_size": 8}),
    ("train_batch_size", ["train_batch_size=16"], {"algo.minibatch_size": 16}),
    ("max_epochs", ["max_epochs=2"], {"algo.ppo_epochs": 2}),
    ("advantage_estimator", ["advantage_estimator=group_norm"], {"algo.name": "grpo", "algo.adv_eps": 1e-9}),
    ("advantage_estimator", ["algo.advantage.estimator=dr_grpo"], {"algo.name": "grpo", "algo.scale_rewards": "none"}),
    ("advantage_estimator", ["advantage_estimator=rloo"], {"algo.name": "rloo"}),
    ("advantage_estimator", ["advantage_estimator=gae"], {"algo.name": "ppo", "algo.value_model": "separate"}),
    ("reward_clip_range", ["reward.clip_range=[-10,10]"], {"reward.clip": [-10, 10]}),
    ("no_advantage_std_norm", ["advantage_estimator=reinforce", "no_advantage_std_norm=true"],
     {"algo.name": "reinforce_plus_plus", "algo.normalize_advantages_std": False}),
    ("no_advantage_std_norm", ["advantage_estimator=gae", "algo.advantage.no_std_norm=true"],
     {"algo.name": "ppo", "algo.normalize_advantages_std": False}),
    ("init_kl_coef", ["init_kl_coef=0.01"], {"algo.kl_coef": 0.01, "algo.kl_in_reward": True,
                                             "algo.kl_estimator": "k1", "algo.kl_clamp": 10.0}),
    ("init_kl_coef", ["init_kl_coef=0.01", "kl_estimator=k3"], {"algo.kl_coef": 0.01, "algo.kl_estimator": "k3"}),
    ("init_kl_coef", ["init_kl_coef=0.01", "use_kl_loss=true"], {"algo.kl_coef": 0.01, "algo.kl_in_reward": False}),
    ("use_kl_loss", ["algo.kl.use_loss=false", "algo.kl_coef=0.01"], {"algo.kl_in_reward": True}),
    ("kl_estimator", ["kl_estimator=k2"], {"algo.kl_estimator": "k2", "algo.kl_clamp": 10.0}),
    ("kl_horizon", ["kl_horizon=5000"], {"algo.kl_horizon": 5000}),
    ("eps_clip", ["algo.eps_clip=0.1"], {"algo.clip_range_left": 0.1, "algo.clip_range_right": 0.1}),
    ("eps_clip_low_high", ["eps_clip_low_high=[0.2, 0.28]"],
     {"algo.clip_range_left": 0.2, "algo.clip_range_right": 0.28}),
    ("dual_clip", ["dual_clip=3"], {"algo.clip_ratio_max": 3.0}),
    ("value_clip", ["algo.name=ppo", "algo.value_model=head", "value_clip=0.5"], {"algo.value_clip": 0.5}),
    ("gamma", ["algo.name=ppo", "algo.value_model=head", "gamma=0.99"], {"algo.gamma": 0.99}),
    ("lambd", ["algo.name=ppo", "algo.value_model=head", "algo.lambd=1"], {"algo.lam": 1.0}),
    ("entropy_loss_coef", ["entropy_loss_coef=0.01"], {"algo.ent_coef": 0.01}),
    ("policy_loss_type", ["policy_loss_type=gspo"], {"algo.ratio_level": "sequence"}),
    ("temperature", ["temperature=0.9"], {"train.temperature": 0.9}),
    ("top_p", ["top_p=0.9"], {"train.top_p": 0.9}),
    ("prompt_max_len", ["prompt_max_len=128"], {"task.max_prompt_length": 128}),
    ("generate_max_len", ["generate_max_len=64"], {"task.max_new_tokens": 64}),
    ("max_new_tokens", ["rollout.max_new_tokens=64"], {"task.max_new_tokens": 64}),
    ("actor_learning_rate", ["actor_learning_rate=1e-6"], {"optim.lr": 1e-6}),
    ("lr_scheduler", ["lr_scheduler=cosine_with_min_lr"], {"schedule.name": "cosine"}),
    ("adam_betas", ["adam_betas=[0.9, 0.95]"], {"optim.betas": [0.9, 0.95]}),
    ("l2", ["l2=0.1"], {"optim.weight_decay": 0.1}),
    ("max_norm", ["max_norm=0.5"], {"train.grad_clip": 0.5}),
    ("pretrain", ["pretrain=models/x"], {"model.path": "models/x", "model.type": "hf"}),
    ("reward_pretrain", ["task.name=prompts", "reward.format_weight=0", "reward_pretrain=runs/rm/reward_model"],
     {"reward.model": "runs/rm/reward_model"}),
    ("prompt_data", ["prompt_data=train.jsonl"], {"task.train_file": "train.jsonl"}),
    ("eval_dataset", ["eval.dataset=test.jsonl"], {"task.test_file": "test.jsonl"}),
    ("input_key", ["input_key=question"], {"task.prompt_key": "question"}),
    ("prompt_key", ["prompt_key=question"], {"task.prompt_key": "question"}),
    ("label_key", ["data.label_key=answer"], {"task.label_key": "answer"}),
    ("apply_chat_template", ["apply_chat_template=false"], {"task.chat": False}),
    ("lora_rank", ["lora_rank=32"], {"lora.r": 32}),
    ("lora_alpha", ["ds.lora.alpha=64"], {"lora.alpha": 64.0}),
    ("lora_dropout", ["lora_dropout=0.05"], {"lora.dropout": 0.05}),
    ("target_modules", ["target_modules=[q_proj, v_proj]"], {"lora.target_modules": ["q_proj", "v_proj"]}),
    ("gradient_checkpointing", ["gradient_checkpointing=true"], {"model.gradient_checkpointing": True}),
    ("save_steps", ["ckpt.save_steps=10"], {"train.ckpt_every": 10}),
    ("eval_steps", ["eval.steps=10"], {"train.eval_every": 10}),
    ("logging_steps", ["logger.logging_steps=5"], {"train.log_every": 5}),
    ("max_ckpt_num", ["max_ckpt_num=3"], {"train.keep_checkpoints": 3}),
    ("seed", ["train.seed=7"], {"run.seed": 7}),
    ("wandb_project", ["wandb_project=proj"], {"run.wandb_project": "proj"}),
]


# The names of the offline trainers' data columns, on an offline preset: (name, preset, overrides, the lmrl keys
# and their values after). A name of the prompt's column sets task.prompt_key in an RL run (TRANSLATED) and
# data.prompt_key here.
OFFLINE_TRANSLATED = [
    ("input_key", "sql-sft-smollm2", ["input_key=question"],
     {"data.prompt_key": "question", "task.prompt_key": "prompt"}),
    ("input_key", "dpo-smollm2", ["data.input_key=question"], {"data.prompt_key": "question"}),
    ("prompt_key", "rm-smollm2", ["prompt_key=question"], {"data.prompt_key": "question", "task.prompt_key": "prompt"}),
    ("output_key", "sql-sft-smollm2", ["output_key=answer"], {"data.response_key": "answer"}),
    ("output_key", "sql-sft-smollm2", ["data.output_key=answer"], {"data.response_key": "answer"}),
    ("chosen_key", "dpo-smollm2", ["chosen_key=better"], {"data.chosen_key": "better"}),
    ("rejected_key", "rm-smollm2", ["rejected_key=worse"], {"data.rejected_key": "worse"}),
    ("data.train_files", "sql-sft-smollm2", ["data.train_files=sft.parquet"], {"data.train_file": "sft.parquet"}),
    ("data.val_files", "dpo-smollm2", ["data.val_files=test.parquet"], {"data.eval_file": "test.parquet"}),
    ("data.multiturn.messages_key", "sql-sft-smollm2", ["data.multiturn.messages_key=dialog"],
     {"data.messages_key": "dialog"}),
    ("data.multiturn.messages_key", "sql-sft-smollm2", ["multiturn.messages_key=dialog"],
     {"data.messages_key": "dialog"}),
]


def _note_of(cfg, name: str, overrides: list[str], offline: bool) -> str:
    written = next(o.partition("=")[0] for o in overrides
                   if (spelling(o.partition("=")[0], offline) or (None,))[0] == name)
    note = next(n for n in cfg.aliases if n.startswith(f"{written} is "))
    owner = spelling(written, offline)[1].owner  # TRL's temperature and OpenRLHF's are one name
    assert note.startswith(f"{written} is {owner}'s name for ")
    return note


@pytest.mark.parametrize("name, overrides, expected", TRANSLATED)
def test_a_verl_or_openrlhf_name_sets_the_lmrl_key_it_stands_for(name, overrides, expected):
    cfg = load_config(RL, overrides)
    assert {key: _value(cfg, key) for key in expected} == expected
    alias = VERL_ALIASES.get(name) or OPENRLHF_ALIASES[name]
    assert f"set {alias.key}=" in _note_of(cfg, name, overrides, offline=False)  # says what it became


@pytest.mark.parametrize("name, preset, overrides, expected", OFFLINE_TRANSLATED)
def test_a_data_column_name_sets_the_offline_trainers_key(name, preset, overrides, expected):
    cfg = load_config(preset, overrides)
    assert {key: _value(cfg, key) for key in expected} == expected
    alias = VERL_ALIASES.get(name) or OPENRLHF_ALIASES[name]
    assert f"set {alias.offline or alias.key}=" in _note_of(cfg, name, overrides, offline=True)


def test_every_translated_verl_and_openrlhf_name_has_a_case():
    mapped = {name for table in (VERL_ALIASES, OPENRLHF_ALIASES) for name, a in table.items() if a.key is not None}
    rl = {name for name, _, _ in TRANSLATED}
    offline = {name for name, _, _, _ in OFFLINE_TRANSLATED}
    assert mapped == rl | offline
    # a name for the prompt's column or the data files has a case in each kind of run, but verl's
    # data.prompt_key, which in an offline run is lmrl's own key (tests/test_offline_keys.py)
    by_kind = {name for table in (VERL_ALIASES, OPENRLHF_ALIASES) for name, a in table.items() if a.offline}
    assert by_kind == {"data.prompt_key", "input_key", "prompt_key", "data.train_files", "data.val_files"}
    assert by_kind <= rl and by_kind - set(RL_SPELLINGS) <= offline


def test_verl_sections_nested_in_yaml_are_its_dotted_names(tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text(f"base: {RL}\nactor_rollout_ref:\n  rollout:\n    n: 8\n  actor:\n    clip_ratio_high: 0.28\n"
                    "    optim:\n      lr: 1.0e-6\nalgorithm:\n  adv_estimator: grpo\n  kl_ctrl:\n    horizon: 500\n"
                    "trainer:\n  test_freq: 5\ndata:\n  max_response_length: 32\n")
    cfg = load_config(path)
    assert (cfg.algo.group_size, cfg.algo.clip_range_right, cfg.optim.lr, cfg.algo.adv_eps) == (8, 0.28, 1e-6, 1e-6)
    assert (cfg.algo.kl_horizon, cfg.train.eval_every, cfg.task.max_new_tokens) == (500, 5, 32)
    assert len(cfg.aliases) == 7
    path.write_text(f"base: {RL}\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).endswith(f"(from {path}:4)")


# Names lmrl does not take as they are, each refused in one line: (overrides, the line)
REFUSED = [
    (["data.train_batch_size=1024"],
     "verl's data.train_batch_size=1024 counts prompts per step, lmrl's train.rollout_size completions: set "
     "train.rollout_size = 1024 x algo.group_size (from override data.train_batch_size=1024)"),
    (["rollout_batch_size=128"],
     "OpenRLHF's rollout_batch_size=128 counts prompts per step, lmrl's train.rollout_size completions: set "
     "train.rollout_size = 128 x algo.group_size (from override rollout_batch_size=128)"),
    (["actor.ppo_mini_batch_size=256"],
     "actor.ppo_mini_batch_size=256 (verl's actor_rollout_ref.actor.ppo_mini_batch_size) counts prompts, lmrl's "
     "algo.minibatch_size completions: set algo.minibatch_size = 256 x algo.group_size (from override "
     "actor.ppo_mini_batch_size=256)"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
     "verl's actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 is a micro-batch's size, lmrl's train.ga_steps "
     "a count of micro-batches: set train.ga_steps = minibatch / (4 x processes), the minibatch being "
     "algo.minibatch_size (0: train.rollout_size)"),
    (["micro_train_batch_size=2"], "set train.ga_steps = minibatch / (2 x processes)"),
    (["actor.loss_agg_mode=seq-mean-token-sum-norm"],
     "actor.loss_agg_mode=seq-mean-token-sum-norm (verl's actor_rollout_ref.actor.loss_agg_mode) divides the summed "
     "token losses by the response length only; lmrl's nearest, algo.loss_level=constant, divides by the "
     "minibatch's completions x algo.loss_constant"),
    (["actor_rollout_ref.actor.kl_loss_type=abs"], "is |log ratio|, which lmrl does not estimate"),
    (["algorithm.kl_penalty=low_var_kl+"], "is a straight-through estimate (its value, k2's gradient)"),
    (["algorithm.adv_estimator=optimal_token_baseline"], "has no lmrl estimator"),
    (["algorithm.kl_ctrl.target_kl=0.1"],
     "verl's algorithm.kl_ctrl.target_kl=0.1 is a per-token mean of the KL; lmrl's algo.kl_target is a "
     "per-completion sum (the KL summed over a completion's tokens): set algo.kl_target = 0.1 x the mean "
     "completion length in tokens"),
    (["kl_target=0.1"], "OpenRLHF's kl_target=0.1 is a per-token mean of the KL"),
    (["algorithm.kl_ctrl.type=adaptive"], "a per-completion sum of the KL where verl's target_kl is a per-token mean"),
    (["optim.lr_warmup_steps_ratio=0.1"],
     "optim.lr_warmup_steps_ratio=0.1 (verl's actor_rollout_ref.actor.optim.lr_warmup_steps_ratio) is a fraction of "
     "the run; lmrl counts warm-up steps: set schedule.warmup_steps = 0.1 x train.steps"),
    (["train.micro_batch_size=2"], "train.micro_batch_size=2 (OpenRLHF's micro_train_batch_size) is a micro-batch's "
                                   "size"),
    (["actor_rollout_ref.actor.use_kl_loss=false"], "has no lmrl switch"),
    (["trainer.save_freq=-1"], "turns checkpoints off"),
    (["trainer.test_freq=-1"], "turns evaluation off"),
    (["actor_rollout_ref.rollout.name=sglang"], "is not an lmrl engine"),
    (["trainer.resume_mode=resume_path"], "set run.resume=auto run.resume_from=PATH"),
    (["algorithm.adv_estimator=mystery"], "algorithm.adv_estimator='mystery' is not one of grpo, grpo_vectorized, "
                                          "rloo, rloo_vectorized, gae, reinforce_plus_plus, reinforce_plus_plus_baseline, "
                                          "remax, grpo_passk, opo, gpg (verl's algorithm.adv_estimator, which sets algo.name; "
                                          "from override algorithm.adv_estimator=mystery)"),
    (["eps_clip_low_high=0.2"], "OpenRLHF's eps_clip_low_high=0.2 takes two numbers, [algo.clip_range_left, "
                                "algo.clip_range_right]"),
    (["actor_rollout_ref.actor.kl_loss_coef=0.001", "algorithm.kl_ctrl.kl_coef=0.01"],
     "actor_rollout_ref.actor.kl_loss_coef and algorithm.kl_ctrl.kl_coef both set algo.kl_coef, to 0.001 and 0.01 "
     "(in override algorithm.kl_ctrl.kl_coef=0.01): lmrl has one algo.kl_coef; write one of them"),
    (["algorithm.kl_penalty=kl", "actor.kl_loss_type=low_var_kl"], "both set algo.kl_estimator, to k1 and k3"),
]


@pytest.mark.parametrize("overrides, line", REFUSED)
def test_a_name_lmrl_does_not_take_as_it_is_is_refused_saying_what_to_write(overrides, line):
    assert line in _refused(overrides)


@pytest.mark.parametrize("table", [VERL_ALIASES, OPENRLHF_ALIASES], ids=["verl", "OpenRLHF"])
def test_every_name_without_an_lmrl_key_is_refused_naming_it_and_its_value(table):
    for name, alias in table.items():
        if alias.key is None:
            message = _refused([f"{name}=7"])
            assert message.startswith(f"{alias.owner}'s {name}=7 ") and message.endswith(f"(from override {name}=7)")


@pytest.mark.parametrize("table", [VERL_ALIASES, OPENRLHF_ALIASES], ids=["verl", "OpenRLHF"])
def test_every_refused_value_is_one_line_naming_name_and_value(table):
    for name, alias in table.items():
        for value in alias.refused or {}:
            shown = {True: "true", False: "false"}.get(value, value) if isinstance(value, bool) else value
            assert _refused([f"{name}={shown}"]).startswith(f"{alias.owner}'s {name}=")


@pytest.mark.parametrize("table", [VERL_ALIASES, OPENRLHF_ALIASES], ids=["verl", "OpenRLHF"])
def test_a_value_that_asks_for_what_lmrl_does_anyway_sets_nothing_and_says_so(table):
    for name, alias in table.items():
        for value in alias.matches:
            shown = str(value).lower() if isinstance(value, bool) else value
            cfg = load_config(RL, [f"{name}={shown}"])
            assert config_to_dict(cfg) == config_to_dict(load_config(RL))
            assert cfg.aliases == (f"{alias.owner}'s {name}={shown} asks for what lmrl does anyway: nothing to set",)


# what the audit typed and what lmrl then suggested (finding 3): each now sets or names the key meant
@pytest.mark.parametrize("override, key, value", [
    ("data.max_response_length=64", "task.max_new_tokens", 64),
    ("algo.eps_clip=0.2", "algo.clip_range_left", 0.2),
    ("algo.clip_ratio_high=0.28", "algo.clip_range_right", 0.28),
    ("algo.loss_agg_mode=token-mean", "algo.loss_level", "token"),
    ("algo.kl_loss_type=low_var_kl", "algo.kl_estimator", "k3"),
    ("algo.norm_adv_by_std_in_grpo=false", "algo.scale_rewards", "none"),
    ("train.test_freq=5", "train.eval_every", 5),
])
def test_what_a_verl_user_typed_sets_the_key_meant(override, key, value):
    assert _value(load_config(RL, [override]), key) == value


@pytest.mark.parametrize("override, meant", [
    ("data.train_batch_size=8", "train.rollout_size"),
    ("optim.lr_warmup_steps_ratio=0.1", "schedule.warmup_steps"),
    ("train.micro_batch_size=2", "train.ga_steps"),
    ("algo.use_kl_loss=true", "'actor.use_kl_loss' (verl's name for algo.kl_in_reward)"),
])
def test_what_a_verl_user_typed_is_refused_naming_the_key_meant(override, meant):
    assert meant in _refused([override])


@pytest.mark.parametrize("override, section", [
    ("actor_rollout_ref.actor.fsdp_config.param_offload=true", "verl's actor_rollout_ref is lmrl's model and lora"),
    ("algorithm.pf_ppo.reweight_method=pow", "verl's algorithm is lmrl's algo"),
    ("trainer.logger_level=info", "verl's trainer is lmrl's train"),
    ("critic.ppo_epochs=2", "verl's and OpenRLHF's critic is lmrl's algo.value_model"),
    ("reward_model.enable=true", "verl's reward_model is lmrl's reward section"),
    ("ds.adam_offload=true", "OpenRLHF's ds (DeepSpeed) is lmrl's distributed and lora sections"),
])
def test_an_unknown_name_in_a_verl_or_openrlhf_section_names_the_lmrl_sections(override, section):
    key = override.partition("=")[0]
    assert _refused([override]).startswith(f"unknown key {key!r} in override {override}: {section}")


def test_a_near_miss_of_a_verl_name_suggests_it():
    assert _refused(["actor_rollout_ref.rollout.nn=8"]).endswith(
        "did you mean 'actor_rollout_ref.rollout.n' (verl's name for algo.group_size)?")


def test_an_unknown_data_key_says_the_data_section_is_the_offline_trainers():
    assert _refused(["data.truncation=error"]).endswith(
        "(the data section is the offline trainers' (run.trainer=sft, dpo, reward); an RL run's prompts are the "
        "task section's)")


def test_every_alias_sets_lmrl_keys_and_every_name_is_its_own_spelling():
    keys = set(all_keys())
    for table in (TRL_ALIASES, VERL_ALIASES, OPENRLHF_ALIASES):
        for name, alias in table.items():
            sets = [alias.key, alias.also, alias.offline, *(alias.implies or {})]
            sets += [k for v in (alias.values or {}).values() if isinstance(v, dict) for k in v]
            assert {k for k in sets if k} <= keys, name
            if alias.bare:
                assert (SPELLINGS.get(name) or RL_SPELLINGS[name])[1].key == alias.key, name
    assert not keys & set(SPELLINGS)
    assert set(RL_SPELLINGS) <= keys  # an offline trainer's key, another tool's name in an RL run


# -- help texts and docs ---------------------------------------------------------------------------
def test_help_texts_say_where_lmrl_differs_from_verl_and_openrlhf():
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(Config().algo)}
    assert "reinforce_plus_plus is REINFORCE++ (OpenRLHF's reinforce)" in helps["name"]
    assert "per-completion sum" in helps["kl_target"] and "per-token mean" in helps["kl_target"]
    assert "verl's 1e-6" in helps["adv_eps"]
    assert "verl, OpenRLHF and TRL whiten PPO's advantages" in helps["normalize_advantages"]


def test_the_docs_tables_are_the_alias_tables():
    text = DOC.read_text()
    assert text == with_tables(text), ('regenerate: python -c "from lmrl.config.aliases import write_doc; '
                                       'write_doc()"')
    assert markdown_tables() in text
    for name in VERL_ALIASES:
        assert f"| `{name}` |" in text
    for name in OPENRLHF_ALIASES:
        assert f"| `--{name}`" in text


def test_the_readme_links_the_doc():
    readme = (DOC.parents[1] / "README.md").read_text()
    assert "](docs/from-verl-openrlhf.md)" in readme


def test_an_openrlhf_flag_written_as_a_flag_is_shown_as_an_override(capsys):
    from lmrl.cli.commands import main

    with pytest.raises(SystemExit):
        main(["config", RL, "--n_samples_per_prompt=8"])
    assert capsys.readouterr().err.endswith(
        "unrecognized arguments: --n_samples_per_prompt=8 (overrides are written without '--': "
        "n_samples_per_prompt=8)\n")
    assert main(["config", RL, "n_samples_per_prompt=8"]) == 0
    assert capsys.readouterr().err == ("lmrl config: n_samples_per_prompt is OpenRLHF's name for algo.group_size: set "
                                       "algo.group_size=8\n")


def test_dynamic_sampling_compares_rewards_whatever_verls_filter_metric_says():
    assert load_config(RL, ["algorithm.filter_groups.metric=seq_reward"]).algo.dynamic_sampling is False
    with pytest.raises(ConfigError, match="lmrl compares each completion's reward"):
        load_config(RL, ["algorithm.filter_groups.metric=acc"])
