import errno
import json
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open

from lmrl.checkpoint import (
    CheckpointError,
    capture_rng_state,
    check_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_stale_temps,
    restore_rng_state,
    save_checkpoint,
    save_weights,
)
from lmrl.common.errors import TrainingError


class TiedLM(torch.nn.Module):
    """Embedding and lm_head share one weight, as in GPT-2."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.ln = torch.nn.LayerNorm(dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.emb.weight

    def forward(self, idx):
        return self.lm_head(self.ln(self.emb(idx)))


def make_training(seed=0):
    torch.manual_seed(seed)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def train_steps(model, opt, sched, steps, start):
    for s in range(start, start + steps):
        idx = torch.arange(s, s + 8) % 11
        loss = torch.nn.functional.cross_entropy(model(idx[:-1]), idx[1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def test_model_round_trip_keeps_tied_weights_tied(tmp_path):
    model, _, _ = make_training(seed=0)
    path = save_checkpoint(tmp_path, 1, model=model, trainer_state={"step": 1})

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert len([k for k in f.keys() if k.endswith("weight") and "ln" not in k]) == 1  # stored once

    fresh, _, _ = make_training(seed=1)
    assert not torch.equal(fresh.emb.weight, model.emb.weight)
    load_checkpoint(path, model=fresh)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    with torch.no_grad():
        fresh.emb.weight[0, 0] = 123.0
    assert fresh.lm_head.weight[0, 0].item() == 123.0


def test_resumed_adamw_and_lambdalr_match_uninterrupted_training_bit_for_bit(tmp_path):
    ref_model, ref_opt, ref_sched = make_training()
    train_steps(ref_model, ref_opt, ref_sched, 6, start=0)

    model, opt, sched = make_training()
    train_steps(model, opt, sched, 3, start=0)
    path = save_checkpoint(tmp_path, 3, model=model, optimizer=opt, scheduler=sched,
                           trainer_state={"step": 3})
    model, opt, sched = make_training(seed=7)
    assert load_checkpoint(path, model=model, optimizer=opt, scheduler=sched) == {"step": 3}
    assert sched.last_epoch == 3
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    train_steps(model, opt, sched, 3, start=3)

    for (k, v), ref in zip(model.state_dict().items(), ref_model.state_dict().values()):
        assert torch.equal(v, ref), k
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]


def test_rng_restore_repeats_python_numpy_torch_and_named_generator_draws(tmp_path):
    gen = torch.Generator().manual_seed(42)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.seed(3)
    np.random.randn()  # and in numpy's
    path = save_checkpoint(tmp_path, 5, model=TiedLM(), generators={"sampler": gen}, trainer_state={})

    def draws():
        return (torch.rand(3).tolist(), random.random(), random.gauss(0, 1), np.random.rand(2).tolist(),
                np.random.randn(), torch.rand(3, generator=gen).tolist())

    expected = draws()
    draws()
    load_checkpoint(path, model=TiedLM(), generators={"sampler": gen})
    assert draws() == expected


def test_capture_and_restore_rng_state_work_without_a_checkpoint():
    gen = torch.Generator().manual_seed(1)
    state = capture_rng_state({"g": gen})
    expected = (torch.rand(2).tolist(), torch.rand(2, generator=gen).tolist())
    restore_rng_state(state, {"g": gen})
    assert (torch.rand(2).tolist(), torch.rand(2, generator=gen).tolist()) == expected


def test_restore_rng_state_rejects_a_generator_it_has_no_state_for():
    with pytest.raises(CheckpointError, match="other"):
        restore_rng_state(capture_rng_state({"g": torch.Generator()}), {"other": torch.Generator()})


def test_prune_keeps_the_newest_steps_numerically_and_never_best(tmp_path):
    model = TiedLM()
    save_weights(tmp_path / "best", model, trainer_state={"reward": 1.0})
    for step in [1, 2, 9, 10]:
        save_checkpoint(tmp_path, step, model=model, trainer_state={"step": step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_9", "step_10"]
    assert (tmp_path / "best" / "trainer_state.json").is_file()
    assert load_checkpoint(tmp_path / "best", model=TiedLM(), restore_rng=False) == {"reward": 1.0}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_keep_zero_keeps_everything(tmp_path):
    for step in range(4):
        save_checkpoint(tmp_path, step, model=TiedLM(), trainer_state={}, keep=0)
    assert len(list_checkpoints(tmp_path)) == 4


def test_prune_never_removes_the_checkpoint_just_written(tmp_path):
    for step in [100, 200, 5]:  # a run restarted from scratch into an old dir
        save_checkpoint(tmp_path, step, model=TiedLM(), trainer_state={}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_5", "step_200"]


def test_latest_checkpoint_ignores_stale_temp_and_incomplete_step_dirs(tmp_path):
    assert latest_checkpoint(tmp_path / "absent") is None
    save_checkpoint(tmp_path, 3, model=TiedLM(), trainer_state={"step": 3})
    stale = tmp_path / ".tmp-step_7-99999"
    stale.mkdir()
    (stale / "trainer_state.json").write_text("{}")
    (tmp_path / "step_8").mkdir()  # no trainer_state.json: incomplete
    assert latest_checkpoint(tmp_path) == tmp_path / "step_3"
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(tmp_path / "step_8", model=TiedLM())

    save_checkpoint(tmp_path, 4, model=TiedLM(), trainer_state={"step": 4})
    assert not stale.exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_4"


def test_a_save_killed_between_its_two_renames_gets_the_old_checkpoint_back(tmp_path):
    # write_atomically replacing best/: best -> .tmp-best-<pid>-old, then .tmp-best-<pid> -> best; a kill between
    # the two leaves no best/, which the next save must put back before clearing stale temp dirs
    save_weights(tmp_path / "best", TiedLM(), trainer_state={"step": 2})
    save_weights(tmp_path / "elsewhere", TiedLM(), trainer_state={"step": 6})
    (tmp_path / "best").rename(tmp_path / ".tmp-best-4242-old")  # the first rename done...
    (tmp_path / "elsewhere").rename(tmp_path / ".tmp-best-4242")  # ...the second not
    save_checkpoint(tmp_path, 8, model=TiedLM(), trainer_state={"step": 8})  # the next save cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_8"]
    assert json.loads((tmp_path / "best" / "trainer_state.json").read_text()) == {"step": 2}
    assert check_checkpoint(tmp_path / "best") is None
    # an old copy whose checkpoint is there is a leftover like any other
    save_weights(tmp_path / "spare", TiedLM(), trainer_state={"step": 1})
    (tmp_path / "spare").rename(tmp_path / ".tmp-step_8-77-old")
    assert remove_stale_temps(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_8"]
    assert json.loads((tmp_path / "step_8" / "trainer_state.json").read_text()) == {"step": 8}


def test_saving_the_same_step_again_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 2, model=TiedLM(), optimizer=make_training()[1], trainer_state={"v": 1})
    model = TiedLM()
    path = save_checkpoint(tmp_path, 2, model=model, trainer_state={"v": 2})
    fresh = TiedLM()
    assert load_checkpoint(path, model=fresh) == {"v": 2}
    assert torch.equal(fresh.emb.weight, model.emb.weight)
    assert not (path / "optimizer.pt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2"]


def test_failed_save_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path, 1, model=TiedLM(), trainer_state={"loss": torch.tensor(1.0)})

    class Boom(torch.nn.Module):
        def state_dict(self, *a, **k):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path, 1, model=Boom(), trainer_state={})
    assert list(tmp_path.iterdir()) == []


def test_missing_model_key_error_names_the_file_and_key(tmp_path):
    path = save_checkpoint(tmp_path, 1, model=TiedLM(), trainer_state={})

    class Bigger(TiedLM):
        def __init__(self):
            super().__init__()
            self.extra = torch.nn.Linear(2, 2)

    with pytest.raises(CheckpointError, match=r"model\.safetensors.*extra\.weight"):
        load_checkpoint(path, model=Bigger())


def test_missing_optimizer_file_is_a_clear_error(tmp_path):
    path = save_checkpoint(tmp_path, 1, model=TiedLM(), trainer_state={})
    model, opt, _ = make_training()
    with pytest.raises(CheckpointError, match="optimizer.pt not found"):
        load_checkpoint(path, model=model, optimizer=opt)


def test_trainer_state_is_plain_json_on_disk(tmp_path):
    state = {"step": 4, "stage": "rl", "history": [{"reward": 0.5}], "baseline": None}
    path = save_checkpoint(tmp_path, 4, model=TiedLM(), trainer_state=state)
    assert json.loads((path / "trainer_state.json").read_text()) == state


# --- a full disk (issue 45) ---------------------------------------------------------------------------

def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _torch_save_on_a_full_disk(*args, **kwargs):
    try:  # what torch.save raises when the file's write fails: its own error, the OSError as its context
        _no_space()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")


@pytest.mark.parametrize("target, writer", [("lmrl.checkpoint.formats.save_model", _no_space),
                                            ("lmrl.checkpoint.atomic.torch.save", _torch_save_on_a_full_disk)],
                         ids=["safetensors", "torch.save"])
def test_a_full_disk_while_checkpointing_is_one_line_and_the_previous_checkpoint_stays(tmp_path, monkeypatch,
                                                                                       target, writer):
    model, opt, sched = make_training()
    previous = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sched, trainer_state={"step": 1})
    monkeypatch.setattr(target, writer)
    with pytest.raises(TrainingError) as raised:
        save_checkpoint(tmp_path, 2, model=model, optimizer=opt, scheduler=sched, trainer_state={"step": 2})
    message = str(raised.value)
    assert message == (f"no space left on device writing checkpoint {tmp_path / 'step_2'}: the previous checkpoint "
                       f"{previous} is intact; free space and run again with --resume")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]  # the temporary folder is gone
    assert check_checkpoint(previous) is None


def test_a_full_disk_before_any_checkpoint_says_there_is_none(tmp_path, monkeypatch):
    model, _, _ = make_training()
    monkeypatch.setattr("lmrl.checkpoint.formats.save_model", _no_space)
    with pytest.raises(TrainingError, match=r"writing checkpoint .*step_1: no earlier checkpoint exists; free space"):
        save_checkpoint(tmp_path, 1, model=model, trainer_state={"step": 1})
    assert list(tmp_path.iterdir()) == []
