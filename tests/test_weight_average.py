"""`train.ema_decay`: an exponential moving average of the trained weights is what a run evaluates,
keeps as best, exports and resumes, while the weights themselves train (lmrl/train/weight_average.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmrl import checkpoint as ckpt
from lmrl.config import load_config
from lmrl.common.errors import ConfigError
from lmrl.train.inspect import load_run
from lmrl.train.rl_trainer import RLTrainer
from lmrl.train.sft_trainer import SFTTrainer
from lmrl.train.weight_average import WeightAverage


FC = "h.0.mlp.c_fc.weight"  # one of the tiny GPT's weights, by its name in a checkpoint


def two_layers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].requires_grad_(False)  # frozen: never averaged
    return model


def test_the_average_moves_by_one_minus_decay_towards_the_weights():
    model = two_layers()
    average = WeightAverage(model, decay=0.75)
    assert average.names == ["0.weight", "0.bias"]
    start = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    average.update()
    torch.testing.assert_close(average.state_dict()["0.weight"], 0.75 * start + 0.25)
    with torch.no_grad():
        model[0].weight.fill_(-1.0)
    average.update()
    torch.testing.assert_close(average.state_dict()["0.weight"], 0.75 * (0.75 * start + 0.25) - 0.25)


def test_the_model_holds_the_average_inside_the_block_and_its_own_weights_after_it():
    model = two_layers()
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    average.update()
    own = model[0].weight.detach().clone()
    with pytest.raises(RuntimeError, match="inside"):
        with average.swapped_in():
            torch.testing.assert_close(model[0].weight, own - 0.5)
            raise RuntimeError("inside")
    assert torch.equal(model[0].weight, own)
    average.copy_to_model()
    torch.testing.assert_close(model[0].weight, own - 0.5)


def test_the_average_loads_back_and_a_file_for_other_weights_is_named_in_the_error(tmp_path):
    model = two_layers()
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model[0].weight.mul_(3.0)
    average.update()
    save_file(average.state_dict(), str(tmp_path / "ema.safetensors"))
    fresh = WeightAverage(two_layers(), decay=0.5)
    fresh.load(tmp_path / "ema.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(fresh.averages, average.averages))
    save_file({"0.weight": torch.zeros(2, 3)}, str(tmp_path / "short.safetensors"))
    with pytest.raises(ckpt.CheckpointError, match=r"short.safetensors .*missing keys \['0.bias'\]"):
        fresh.load(tmp_path / "short.safetensors")
    save_file({"0.weight": torch.zeros(3, 3), "0.bias": torch.zeros(2)}, str(tmp_path / "wide.safetensors"))
    with pytest.raises(ckpt.CheckpointError, match=r"0.weight has shape \(3, 3\)"):
        fresh.load(tmp_path / "wide.safetensors")


def test_rl_evaluates_and_keeps_the_average_while_the_weights_train(tiny_config, monkeypatch):
    cfg = tiny_config("train.ema_decay=0.5", "train.eval_every=3", "train.ckpt_every=3", "train.keep_checkpoints=0")
    trainer = RLTrainer(cfg)
    seen = []
    evaluate = trainer.evaluate

    def recording_evaluate():
        if trainer.average is not None:  # RL's evaluations (the warm-up's last one has no average)
            seen.append((trainer.state["step"], [p.detach().clone() for p in trainer.average.params],
                         [a.clone() for a in trainer.average.averages]))
        return {**evaluate(), "eval/accuracy": trainer.state["step"] / 100}  # each evaluation the best so far

    monkeypatch.setattr(trainer, "evaluate", recording_evaluate)
    summary = trainer.train()
    assert [step for step, _, _ in seen] == [7, 10]  # RL steps 3 and 6 after 4 warm-up steps
    for step, held, averages in seen:
        assert all(torch.equal(h, a) for h, a in zip(held, averages))  # evaluated: the average
        weights = load_file(str(cfg.run_dir / "checkpoints" / f"step_{step}" / "model.safetensors"))
        saved = load_file(str(cfg.run_dir / "checkpoints" / f"step_{step}" / "ema.safetensors"))
        assert all(torch.equal(saved[n], a) for n, a in zip(trainer.average.names, averages))
        assert not torch.equal(weights[FC], saved[FC])  # the trained weights, not the average
    last_average = dict(zip(trainer.average.names, seen[-1][2]))[FC]
    assert json.loads((cfg.run_dir / "checkpoints" / "best" / "trainer_state.json").read_text())["step"] == 10
    assert torch.equal(load_file(str(cfg.run_dir / "checkpoints" / "best" / "model.safetensors"))[FC], last_average)
    # after training, the model holds its trained weights (the RL trainer exports nothing)
    last = load_file(str(cfg.run_dir / "checkpoints" / "step_10" / "model.safetensors"))
    assert torch.equal(trainer.model.h[0].mlp.c_fc.weight.detach(), last[FC])
    # `lmrl eval` on the run loads the average it evaluated, and measures what the run reported
    run = load_run(cfg.run_dir, "latest")
    assert torch.equal(run.model.h[0].mlp.c_fc.weight, last_average)
    assert run.evaluate()["eval/reward"] == summary["final_eval"]["eval/reward"]


def test_a_resumed_run_continues_its_average_exactly(tiny_config, tmp_path):
    args = ("train.ema_decay=0.5", "train.ckpt_every=2")
    full = RLTrainer(tiny_config(*args, dir=tmp_path / "full"))
    full.train()
    stopped = RLTrainer(tiny_config(*args, dir=tmp_path / "part"))
    end_step = stopped.end_step

    def end_step_then_stop(*a, **kw):  # Ctrl-C during RL step 2 (global step 6): the step ends, a checkpoint is saved
        end_step(*a, **kw)
        if stopped.state["step"] == 6:
            stopped.request_stop()

    stopped.end_step = end_step_then_stop
    assert stopped.train()["interrupted"]
    resumed = RLTrainer(tiny_config(*args, "run.resume=auto", dir=tmp_path / "part"))
    resumed.train()
    assert all(torch.equal(a, b) for a, b in zip(resumed.average.averages, full.average.averages))
    assert torch.equal(resumed.model.h[0].mlp.c_fc.weight, full.model.h[0].mlp.c_fc.weight)


def test_resuming_with_an_average_from_a_checkpoint_without_one_is_refused(tiny_config, tmp_path):
    RLTrainer(tiny_config("train.steps=2", "train.ckpt_every=1", "train.ema_decay=0", dir=tmp_path / "run")).train()
    again = RLTrainer(tiny_config("train.steps=4", "train.ckpt_every=1", "train.ema_decay=0.9", "run.resume=auto",
                                  dir=tmp_path / "run"))
    with pytest.raises(ckpt.CheckpointError, match=r"step_6 holds no weight average \(ema.safetensors\).*"
                                                   r"train.ema_decay=0"):
        again.train()


def test_an_offline_trainer_exports_the_average(tmp_path):
    rows = [{"prompt": f"{a}{b}=", "response": f"{b}{a}"} for a in range(10) for b in range(10)]
    (tmp_path / "chars.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, ["run.trainer=sft", f"run.dir={tmp_path / 'run'}", "model.type=gpt", "model.n_layer=1",
                             "model.n_head=2", "model.n_embd=32", "model.n_position=16", "data.max_length=16",
                             f"data.train_file={tmp_path / 'chars.jsonl'}", f"data.eval_file={tmp_path / 'chars.jsonl'}",
                             "data.batch_size=16", "train.max_steps=4", "train.eval_every=100", "optim.lr=3e-3",
                             "train.ema_decay=0.5", "run.progress=false", "run.tensorboard=false", "run.threads=1"])
    trainer = SFTTrainer(cfg)
    summary = trainer.train()
    exported = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    trained = load_file(str(tmp_path / "run" / "checkpoints" / "step_4" / "model.safetensors"))
    average = load_file(str(tmp_path / "run" / "checkpoints" / "step_4" / "ema.safetensors"))
    shared = [n for n in average if n in exported]  # all but the tied embedding, saved once as lm_head.weight
    assert summary["exported"] and len(shared) == len(average) - 1
    assert all(torch.equal(exported[n], average[n]) for n in shared)
    assert torch.equal(exported["lm_head.weight"], average["wte.weight"])
    assert not torch.equal(exported[FC], trained[FC])


@pytest.mark.parametrize("preset, overrides, message", [
    ("adder", ["train.ema_decay=1.0"], "train.ema_decay"),
    ("math-grpo-smollm2", ["train.ema_decay=0.9", "distributed.strategy=fsdp"],
     "train.ema_decay=0.9 averages whole weights, which FSDP holds in shards"),
    ("sql-sft-smollm2", ["train.ema_decay=0.9", "distributed.strategy=fsdp"], "train.ema_decay=0.9 averages"),
])
def test_ema_decay_out_of_range_or_with_fsdp_is_a_config_error(preset, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(preset, overrides)
