"""Configs: presets and their aliases, overrides, `base:` inheritance, and one-line errors that
name the key, its source and the nearest valid key."""

import pytest
import torch
import yaml

from lmrl.config import (AdderRLConfig, ConfigError, MultiplierRLConfig, config_from_dict, config_to_dict,
                         list_presets, load_config, save_config, DataConfig, SFTConfig)


def test_adder_preset_matches_the_spec():
    cfg = load_config("adder")
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.n_position) == (4, 8, 256, 64)
    assert (cfg.task.name, cfg.task.ndigit) == ("addition", 3)
    assert cfg.sft.steps > 0 and cfg.sft.examples > 0  # a label-budgeted warm-up, then RL
    assert cfg.algo.name == "reinforce"


def test_multiplier_preset_matches_the_spec():
    cfg = load_config("multiplier")
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.n_position) == (6, 8, 256, 128)
    assert (cfg.task.name, cfg.task.ndigit) == ("multiplication", 2)


def test_class_style_names_and_paths_give_the_same_config():
    by_name = config_to_dict(load_config("adder"))
    assert config_to_dict(AdderRLConfig()) == by_name
    assert config_to_dict(load_config("AdderRLConfig")) == by_name
    assert config_to_dict(load_config("configs/adder.yaml")) == by_name
    assert config_to_dict(MultiplierRLConfig()) == config_to_dict(load_config("multiplier"))
    assert {"adder", "multiplier"} <= set(list_presets())


def test_overrides_are_parsed_as_yaml_values():
    cfg = load_config("adder", ["train.steps=7", "optim.lr=3e-4", "task.use_format=false", "optim.betas=[0.8, 0.9]",
                                "run.name=x"])
    assert cfg.train.steps == 7 and cfg.optim.lr == 3e-4 and cfg.task.use_format is False
    assert cfg.optim.betas == [0.8, 0.9] and cfg.run.name == "x"
    assert isinstance(load_config("adder", ["optim.lr=1"]).optim.lr, float)  # ints widen to float


def test_base_inheritance_and_yaml_round_trip(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: adder\ntrain:\n  steps: 3\n")
    cfg = load_config(path)
    assert cfg.train.steps == 3 and cfg.model.n_layer == 4
    save_config(cfg, tmp_path / "saved.yaml")
    again = config_from_dict(yaml.safe_load((tmp_path / "saved.yaml").read_text()))
    assert config_to_dict(again) == config_to_dict(cfg)


@pytest.mark.parametrize("overrides, message", [
    (["train.stpes=5"], "unknown key 'train.stpes' in override train.stpes=5; did you mean 'train.steps'?"),
    (["trian.steps=5"], "unknown section 'trian' in override trian.steps=5; did you mean 'train'?"),
    (["train.steps=five"], "train.steps must be an int, got 'five' (from override train.steps=five)"),
    (["train.steps=1.5"], "train.steps must be an int, got 1.5"),
    (["task.use_format=maybe"], "task.use_format must be true or false, got 'maybe'"),
    (["train.steps"], "override 'train.steps' must look like section.key=value"),
    (["task.ndigit=9", "model.n_position=16"], "task.ndigit=9 needs 30 positions but model.n_position is 16"),
    (["algo.name=reinforc"], "algo.name='reinforc' is not one of reinforce, grpo, rloo, ppo, reinforce_plus_plus, "
                              "reinforce_plus_plus_baseline, remax; did you mean 'reinforce'?"),
    (["train.rollout_size=10", "train.ga_steps=3"], "must be divisible by train.ga_steps=3"),
    (["sft.examples=0"], "sft.steps > 0 needs sft.examples > 0"),
    (["task.reward=per_step"], "task.reward=per_step checks scratchpad steps: it needs task.scratchpad=true"),
])
def test_bad_overrides_fail_with_a_message_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("adder", overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_preset_suggests_the_nearest():
    with pytest.raises(ConfigError, match=r"unknown preset 'addr'; did you mean 'adder'\?"):
        load_config("addr")


def test_errors_in_a_yaml_file_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  rollout_sise: 8\n")
    with pytest.raises(ConfigError, match=rf"unknown key 'train.rollout_sise' in {path}:2; did you mean "
                                          r"'train.rollout_size'\?"):
        load_config(path)
    path.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2:1: not valid YAML: expected ',' or '\]', but got '<stream end>'$"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_a_label_budget_larger_than_the_training_split_is_refused():
    with pytest.raises(ConfigError, match="sft.examples=9500 is more than the 9000 training problems of ndigit=2"):
        load_config("multiplier", ["sft.examples=9500"])


@pytest.mark.parametrize("key, registry", [
    ("algo.name", "lmrl.algos:ALGORITHMS"),
    ("algo.adv_mode", "lmrl.algos.advantages:GROUP_MODES"),
    ("algo.loss_level", "lmrl.algos.losses:LOSS_LEVELS"),
    ("algo.kl_estimator", "lmrl.algos.losses:KL_ESTIMATORS"),
    ("dpo.loss_type", "lmrl.algos.preference_losses:DPO_LOSS_TYPES"),
    ("task.name", "lmrl.tasks:TASKS"),
    ("task.reward", "lmrl.tasks.arithmetic:REWARDS"),
    ("schedule.name", "lmrl.common.schedules:SCHEDULES"),
    ("rollout.engine", "lmrl.engines.registry:ENGINES"),
])
def test_a_choice_key_takes_its_choices_from_the_implementing_modules_registry(key, registry):
    import importlib

    module, name = registry.split(":")
    names = list(getattr(importlib.import_module(module), name))
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={names[-1]}x"])
    assert str(e.value) == f"{key}='{names[-1]}x' is not one of {', '.join(names)}; did you mean '{names[-1]}'?"


def test_every_schedule_in_the_registry_is_a_valid_schedule_name():
    from lmrl.common.schedules import SCHEDULES

    for name in SCHEDULES:
        assert load_config("adder", [f"schedule.name={name}", "schedule.decay_steps=10"]).schedule.name == name


def test_an_algorithm_states_its_own_requirements():
    with pytest.raises(ConfigError, match="algo.name=reinforce makes one on-policy update per rollout"):
        load_config("adder", ["algo.minibatch_size=64"])
    with pytest.raises(ConfigError, match="algo.name=ppo needs a value model"):
        load_config("adder", ["algo.name=ppo"])
    assert load_config("adder", ["algo.name=grpo", "algo.adv_mode=raw"]).algo.group_size == 1  # A = r needs no group


def test_the_config_layer_imports_no_trainer_and_light_modules_no_torch():
    import subprocess
    import sys

    probe = ("import sys, lmrl.tasks.math_reward; light = 'torch' not in sys.modules; import lmrl.config; "
             "print(light, any(m.startswith('lmrl.train') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]


def test_offline_trainers_count_optimizer_steps_in_max_steps_and_refuse_train_steps():
    dpo = load_config("dpo-smollm2")
    assert dpo.train.max_steps == 40 and dpo.train.steps == 200  # train.steps (RL updates) left at its default
    with pytest.raises(ConfigError) as e:
        load_config("dpo-smollm2", ["train.steps=10"])
    assert str(e.value) == ("train.steps=10 counts RL updates; run.trainer=dpo counts optimizer steps in "
                            "train.max_steps (0 = data.epochs passes): set train.max_steps=10")
    with pytest.raises(ConfigError, match="train.max_steps=3 counts the offline trainers' optimizer steps; "
                                          "run.trainer=rl counts RL updates in train.steps"):
        load_config("adder", ["train.max_steps=3"])


def test_an_offline_preset_on_an_rl_base_drops_the_bases_rl_updates(tmp_path):
    # sql-sft-smollm2 is `base: sql-agent-smollm2` (train.steps: 20) with run.trainer: sft
    assert load_config("sql-sft-smollm2").train.steps == 200
    with pytest.raises(ConfigError, match="train.steps=5 counts RL updates; run.trainer=sft"):
        load_config("sql-sft-smollm2", ["train.steps=5"])
    path = tmp_path / "mine.yaml"
    path.write_text("base: dpo-smollm2\ntrain:\n  steps: 7\n")  # set in the offline config itself
    with pytest.raises(ConfigError, match="train.steps=7 counts RL updates"):
        load_config(path)
    path.write_text("base: sql-sft-smollm2\nrun:\n  trainer: rl\n")  # and back: RL on the offline preset
    cfg = load_config(path)
    assert (cfg.train.steps, cfg.train.max_steps) == (20, 0)  # sql-agent's RL updates count again
    path.write_text("base: dpo-smollm2\nrun:\n  trainer: rl\n")
    rl = load_config(path, ["model.path=x", "task.name=math", "task.train_file=a", "task.test_file=b"])
    assert rl.train.max_steps == 0  # dpo-smollm2's max_steps: 40 dropped


@pytest.mark.parametrize("override, message", [
    ("algo.group_size=0", "algo.group_size must be >= 1, got 0"),  # divided by in the checks before
    ("train.ga_steps=0", "train.ga_steps must be >= 1, got 0"),
    ("model.n_head=0", "model.n_head must be >= 1, got 0"),
    ("model.n_embd=-8", "model.n_embd must be >= 1, got -8"),
    ("eval.batch_size=0", "eval.batch_size must be >= 1, got 0"),
    ("sft.batch_size=0", "sft.batch_size must be >= 1, got 0"),  # trained on empty batches, every loss NaN
    ("data.batch_size=0", "data.batch_size must be >= 1, got 0"),
    ("optim.lr=nan", "optim.lr must be a finite number, got nan"),
    ("optim.lr=.inf", "optim.lr must be a finite number, got inf"),
    ("optim.lr=-1e-4", "optim.lr must be >= 0, got -0.0001"),
    ("algo.kl_coef=-.inf", "algo.kl_coef must be a finite number, got -inf"),
    ("optim.betas=[.nan, 0.9]", "optim.betas must be two numbers in [0, 1), got [nan, 0.9]"),
    ("model.dropout=1.5", "model.dropout must be in [0, 1), got 1.5"),
    ("lora.dropout=-0.1", "lora.dropout must be in [0, 1), got -0.1"),
    ("algo.gamma=1.5", "algo.gamma must be in [0, 1], got 1.5"),
    ("rollout.gpu_memory_utilization=0", "rollout.gpu_memory_utilization must be in (0, 1], got 0.0"),
    ("run.threads=-2", "run.threads must be >= 0, got -2"),
    # past these, torch's seed overflows and problem ids overflow int64 once the run starts
    ("run.seed=99999999999999999999", "run.seed must be in [0, 4294967296), got 99999999999999999999"),
    ("run.seed=-1", "run.seed must be in [0, 4294967296), got -1"),
    ("task.ndigit=10", "task.ndigit must be in [1, 9], got 10"),
    ("run.device=gpu7", "run.device='gpu7' is not one of auto | cpu | cuda | cuda:N"),
    ("train.temperature=0", "train.temperature must be > 0, got 0.0"),
    ("model.chat_template_kwargs=[enable_thinking]",
     "model.chat_template_kwargs must be a mapping, got ['enable_thinking'] (from override "
     "model.chat_template_kwargs=[enable_thinking])"),
    ("model.chat_template_kwargs={1: false}",
     "model.chat_template_kwargs takes the template variables' names as string keys, got 1"),
    ("model.chat_template_kwargs={add_generation_prompt: false}",
     "model.chat_template_kwargs cannot set 'add_generation_prompt': lmrl sets that argument of apply_chat_template "
     "for each rendering"),
])
def test_bad_values_are_refused_up_front_in_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config("adder", [override])
    assert str(e.value) == message


def test_a_config_built_in_python_is_checked_the_same_way():
    from lmrl.config import Config, validate

    cfg = Config()
    cfg.algo.group_size = 0  # the rollout_size % group_size rule would divide by it
    with pytest.raises(ConfigError, match="algo.group_size must be >= 1, got 0"):
        validate(cfg)
    cfg = Config()
    cfg.model.chat_template_kwargs = "enable_thinking=False"  # no YAML read turned it into a mapping
    with pytest.raises(ConfigError, match="^model.chat_template_kwargs must be a mapping of the chat template's "
                                          "variables .*, got 'enable_thinking=False'$"):
        validate(cfg)


@pytest.mark.parametrize("text, line, key", [
    ("train:\n  steps: 3\n  steps: 4\n", 3, "steps"),
    ("train:\n  steps: 3\nmodel:\n  n_layer: 2\ntrain:\n  ga_steps: 2\n", 5, "train"),
])
def test_a_key_or_section_written_twice_in_yaml_is_refused(tmp_path, text, line, key):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}:{line}: key {key!r} appears twice in one mapping (first on line ")



def test_a_yaml_file_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError) as e:
        load_config(folder)
    assert str(e.value) == f"{folder}: cannot read the config file: Is a directory"
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"run:\n  name: caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        load_config(latin1)
    assert str(e.value) == f"{latin1}:2: not UTF-8 text (invalid continuation byte at byte 16 of the file)"
    deep = tmp_path / "deep.yaml"
    deep.write_text("run: " + "[" * 100_000 + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(deep)
    assert str(e.value) == f"{deep}: not valid YAML: nested too deeply to read"


def test_a_single_string_for_a_list_key_is_a_one_item_list_as_trls_cli_takes_it(tmp_path):
    # reward.funcs=pkg:fn was refused with "must be a list" (issue 45)
    cfg = load_config("math-grpo-smollm2", ["reward.funcs=tests.trl_rewards:reward_len", "lora.target_modules=q_proj"])
    assert (cfg.reward.funcs, cfg.lora.target_modules) == (["tests.trl_rewards:reward_len"], ["q_proj"])
    path = tmp_path / "one.yaml"
    path.write_text("base: math-grpo-smollm2\nreward:\n  funcs: tests.trl_rewards:reward_len\n")
    assert load_config(path).reward.funcs == ["tests.trl_rewards:reward_len"]
    assert load_config("math-grpo-smollm2", ["reward.funcs="]).reward.funcs == []


def test_the_largest_seed_and_digit_count_the_config_takes_build_their_task():
    from lmrl.tasks.arithmetic import ArithmeticTask

    load_config("adder", ["run.seed=4294967295", "task.ndigit=9", "model.n_position=32", "run.device=cuda:0"])
    task = ArithmeticTask("multiplication", ndigit=9, heldout_size=10)
    ids = task.sample_train_ids(4, torch.Generator().manual_seed(4294967295 + 7919))
    assert len(ids) == 4 and int(ids.max()) < 10 ** 18


def test_a_gpu_that_is_not_there_is_one_line(monkeypatch):
    from lmrl.parallel.ddp import DistInfo, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^run.device=cuda:5 but no CUDA device is visible; use run.device=cpu or auto$"):
        resolve_device("cuda:5", DistInfo())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError) as raised:
        resolve_device("cuda:5", DistInfo())
    assert str(raised.value) == "run.device=cuda:5 names a GPU, but this process sees 2 CUDA devices (cuda:0 to cuda:1)"
    with pytest.raises(ConfigError, match=r"^run.device=cuda gives rank 3 cuda:3 \(its LOCAL_RANK\), but this process "
                                          r"sees 2 CUDA devices"):
        resolve_device("cuda", DistInfo(rank=3, world_size=4, local_rank=3))


def test_yaml_errors_name_the_file_and_line_that_set_the_key(tmp_path):
    def refused(text: str) -> str:
        path = tmp_path / "mine.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_config(path)
        return str(e.value).replace(str(path), "mine.yaml")

    assert refused("base: adder\ntrain:\n  stesp: 3\n") == ("unknown key 'train.stesp' in mine.yaml:3; did you mean "
                                                          "'train.steps'?")
    assert refused("base: adder\noptim:\n  lr: -1\n") == "optim.lr must be >= 0, got -1.0 (from mine.yaml:3)"
    # a rule joining two keys: where each one a file set was set
    assert refused("model:\n  n_embd: 100\n  n_head: 8\n") == ("model.n_embd=100 must be divisible by model.n_head=8 "
                                                               "(model.n_embd from mine.yaml:2, model.n_head from "
                                                               "mine.yaml:3)")
    assert refused("model:\n  n_head: 3\n") == ("model.n_embd=256 must be divisible by model.n_head=3 (model.n_head "
                                              "from mine.yaml:2)")
    assert refused("base: nothere\n").startswith("mine.yaml:1: base: unknown preset 'nothere'")
    # on the command line the value is in sight: no source added
    with pytest.raises(ConfigError) as e:
        load_config("adder", ["optim.lr=-1"])
    assert str(e.value) == "optim.lr must be >= 0, got -1.0"


@pytest.mark.parametrize("override, message", [
    ("lora.peft={use_rslor: true}", "lora.peft: use_rslor is not an argument of peft.LoraConfig"),
    ("lora.peft={r: 4, lora_alpha: 8}", "lora.peft sets lora_alpha, r: use lora.r, lora.alpha"),
])
def test_lora_peft_arguments_are_peft_loraconfigs_own_and_none_doubles_a_lora_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("math-grpo-smollm2", [override])
    assert load_config("math-grpo-smollm2", ["lora.peft={use_rslora: true}"]).lora.peft == {"use_rslora": True}


def test_a_saved_run_config_holding_keys_its_run_never_read_still_loads(tmp_path):
    saved = tmp_path / "config.yaml"  # as an older lmrl saved an adder run without its warm-up
    saved.write_text("run:\n  trainer: rl\nsft:\n  steps: 0\n  warmup_steps: 10\ndata:\n  max_length: 3\n")
    with pytest.raises(ConfigError, match="data.max_length=3 is for the offline trainers"):
        load_config(saved)
    cfg = load_config(saved, saved_run=True)  # lmrl eval / export / generate of that run
    assert cfg.sft.warmup_steps == SFTConfig().warmup_steps and cfg.data.max_length == DataConfig().max_length


def test_a_preset_dataclass_edited_from_python_is_not_refused_for_the_keys_it_leaves_unread():
    from lmrl.config import validate

    cfg = AdderRLConfig()
    cfg.sft.steps = 0  # the preset's label budget and warm-up LR stay as they were, unread: that is the user's call
    validate(cfg)
    with pytest.raises(ConfigError, match="sft.examples=7 sets the supervised warm-up before RL"):
        load_config("adder", ["sft.steps=0", "sft.examples=7"])  # written in the same layer: refused
