"""The command line: train / eval / generate / presets, flags mixed with overrides, and errors
that take one line and a non-zero exit status."""

import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from lmrl.cli import main

from .conftest import TINY


def test_train_then_eval_and_generate(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "adder", *TINY, f"run.dir={run}", "--no-wandb"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["wandb"] is False
    capsys.readouterr()

    assert main(["eval", str(run), "--size", "20"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["heldout_problems"] == 20 and 0 <= report["eval/accuracy"] <= 1
    assert report["checkpoint"].endswith("step_10")

    assert main(["eval", str(run), "--checkpoint", "step_8"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"].endswith("step_8")

    assert main(["generate", str(run), "12+34=", "99+99="]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0][:6] for line in lines] == ["12+34=", "99+99="]
    assert all("(answer " in line for line in lines)


def test_generate_rejects_a_prompt_the_task_cannot_read(tmp_path, capsys):
    run = tmp_path / "run"
    main(["train", "adder", *TINY, "sft.steps=1", "train.steps=1", f"run.dir={run}"])
    capsys.readouterr()
    assert main(["generate", str(run), "12+3="]) == 1
    assert "prompts must look like '23+45='" in capsys.readouterr().err
    assert main(["generate", str(run), "1a+45="]) == 1  # the right length, a character outside the alphabet
    assert capsys.readouterr().err == ("lmrl generate: error: character 'a' in prompt '1a+45=' is not in the model's "
                                       "alphabet '0123456789+='; prompts must look like '23+45='\n")
    for temperature in ("-1", "nan", "inf"):
        assert main(["generate", str(run), "12+34=", "--temperature", temperature]) == 2
        assert capsys.readouterr().err == (f"lmrl generate: error: --temperature must be a finite number >= 0 (0: "
                                           f"greedy), got {float(temperature)}\n")


def test_eval_size_is_at_least_one_and_reports_the_problems_evaluated(tmp_path, capsys):
    run = tmp_path / "run"
    main(["train", "adder", *TINY, "sft.steps=1", "train.steps=1", f"run.dir={run}"])
    capsys.readouterr()
    for size in ("0", "-5"):
        assert main(["eval", str(run), "--size", size]) == 2
        assert capsys.readouterr().err == f"lmrl eval: error: --size must be at least 1, got {size}\n"
    assert main(["eval", str(run), "--size", "5000"]) == 0
    assert json.loads(capsys.readouterr().out)["heldout_problems"] == 100  # every held-out problem there is


def test_debug_runs_every_stage_of_the_real_preset_in_seconds(tmp_path):
    run = tmp_path / "debug"
    assert main(["train", "adder", "--debug", f"run.dir={run}", "run.progress=false", "run.tensorboard=false"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sft_steps"] > 0 and summary["rl_steps"] > 0
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["n_layer"] == 4  # the preset's model


def test_resume_flag_continues_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    main(["train", "adder", *TINY, f"run.dir={run}"])
    first = (run / "metrics.jsonl").read_text()
    assert main(["train", "adder", *TINY, f"run.dir={run}", "--resume"]) == 0  # already finished: no new steps
    assert (run / "metrics.jsonl").read_text() == first
    assert "resumed from" in (run / "train.log").read_text()


def test_presets_lists_the_named_configs(capsys):
    assert main(["presets"]) == 0
    assert {"adder", "multiplier"} <= set(capsys.readouterr().out.split())


@pytest.mark.parametrize("args, message, status", [
    (["train", "adderr"], "unknown preset 'adderr'; did you mean 'adder'?", 2),
    (["train", "adder", "train.setps=3"], "unknown key 'train.setps' in override train.setps=3; did you mean "
                                          "'train.steps'?", 2),
    (["train", "adder", "task.ndigit=9", "model.n_position=16"], "task.ndigit=9 needs 30 positions but "
                                                                 "model.n_position is 16", 2),
    (["eval", "/nonexistent/run"], "/nonexistent/run is not a run dir (no config.yaml)", 1),
])
def test_bad_input_is_one_line_on_stderr_before_any_training(args, message, status, tmp_path):
    run_dir = [f"run.dir={tmp_path / 'r'}"] if args[0] == "train" else []
    proc = subprocess.run([sys.executable, "-m", "lmrl", *args, *run_dir], capture_output=True, text=True, timeout=120)
    assert proc.returncode == status
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith(f"lmrl {args[0]}: error: {message}")
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_wandb_without_its_extra_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", "adder", "run.wandb=true", f"run.dir={tmp_path / 'r'}"]) == 2
    assert "needs the 'wandb' extra: pip install 'lmrl[wandb]'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_offline_commands_write_data_train_and_plot(tmp_path, capsys):
    """`lmrl data preferences`, then `lmrl train` with run.trainer=sft on the built-in GPT, then `lmrl plot`."""
    assert main(["data", "preferences-sft", str(tmp_path / "data"), "--train", "40", "--test", "8"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and set(rows[0]) == {"prompt", "response"}
    run = tmp_path / "run"
    assert main(["train", "run.trainer=sft", f"run.dir={run}", f"data.train_file={tmp_path / 'data' / 'train.jsonl'}",
                 f"data.eval_file={tmp_path / 'data' / 'test.jsonl'}", "model.n_position=256", "model.n_layer=1",
                 "model.n_embd=32", "model.n_head=2", "data.batch_size=8", "train.max_steps=4", "train.eval_every=2",
                 "run.progress=false", "run.tensorboard=false"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trainer"] == "sft" and summary["steps_done"] == 4 and summary["best"]["step"] in (2, 4)
    assert main(["plot", str(run)]) == 0
    assert {p.name for p in (run / "plots").glob("*.png")} >= {"loss.png", "lr.png", "eval.png"}
    capsys.readouterr()
    assert main(["prepare-data", "--datasets", "hh-rlhf", "--from", str(tmp_path / "missing"),
                 "--output-dir", str(tmp_path / "out")]) == 1
    assert "missing" in capsys.readouterr().err


# -- the seed system's flags and TRL's names --------------------------------------------------------
def test_seed_system_flags_train_with_the_preset_they_name(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config_name", "AdderRLConfig", "--no_wandb", "--device", "cpu", *TINY,
                 "learning_rate=1e-3", f"run.dir={run}"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["run"]["name"], saved["run"]["wandb"], saved["run"]["device"]) == ("adder", False, "cpu")
    assert saved["optim"]["lr"] == 1e-3
    assert "lmrl train: learning_rate is TRL's name for optim.lr: set optim.lr=0.001" in capsys.readouterr().err


def test_config_path_algorithm_device_and_resume_from_checkpoint_are_overrides(tmp_path, monkeypatch):
    import lmrl.train.trainers

    trained = []  # the configs `lmrl train` hands to build_trainer, recorded in place of training them
    monkeypatch.setattr(lmrl.train.trainers, "build_trainer",
                        lambda cfg: SimpleNamespace(train=lambda: trained.append(cfg) or {}))
    path = tmp_path / "config.yaml"
    path.write_text("base: adder-grpo\ntrain:\n  steps: 3\n")
    ckpt = str(tmp_path / "runs" / "x" / "checkpoints" / "step_2")
    assert main(["train", "--config", str(path), "--algorithm", "rloo", "--device", "cuda:0",
                 "--resume_from_checkpoint", ckpt, "num_generations=8"]) == 0
    assert main(["train", "--config_name", "multiplier"]) == 0
    assert main(["train", "--no-wandb", "--resume"]) == 0  # lmrl's own spellings still work
    cfg, multiplier, resumed = trained
    assert (cfg.run.name, cfg.train.steps, cfg.algo.name, cfg.run.device) == ("adder-grpo", 3, "rloo", "cuda:0")
    assert (cfg.run.resume, cfg.run.resume_from, cfg.algo.group_size) == ("auto", ckpt, 8)
    assert multiplier.task.name == "multiplication"
    assert resumed.run.resume == "auto"


def test_a_config_named_twice_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", "adder", "--config_name", "multiplier", f"run.dir={tmp_path / 'r'}"]) == 2
    assert capsys.readouterr().err == ("lmrl train: error: the config is named twice: 'adder' and --config "
                                       "'multiplier'; give one\n")
    assert not (tmp_path / "r").exists()


def test_train_help_lists_every_config_key_with_its_default(capsys):
    from lmrl.config import Config, config_to_dict

    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--config_name" in out and "--resume_from_checkpoint" in out and "--algorithm" in out
    reference = out.split("with their defaults:\n\n", 1)[1]
    assert yaml.safe_load(reference) == config_to_dict(Config())
    assert "  top_p: 1.0 " in reference and "#   num_generations " in reference


def test_config_command_prints_a_presets_values_as_yaml_that_loads_back(tmp_path, capsys):
    from lmrl.config import config_to_dict, load_config

    assert main(["config", "adder-grpo", "num_generations=8"]) == 0
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    assert printed == config_to_dict(load_config("adder-grpo", ["algo.group_size=8"]))
    assert printed["algo"]["group_size"] == 8 and printed["algo"]["clip_range_right"] == 0.28
    assert captured.err == "lmrl config: num_generations is TRL's name for algo.group_size: set algo.group_size=8\n"
    (tmp_path / "mine.yaml").write_text(captured.out)
    assert config_to_dict(load_config(tmp_path / "mine.yaml")) == printed
