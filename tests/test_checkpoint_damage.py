"""Damaged checkpoints: for each file a checkpoint holds, truncated, empty, missing or overwritten
with garbage, what `check_checkpoint` says, which checkpoint a resume falls back to, and that the
damaged one is kept on disk (moved aside, byte for byte) rather than deleted."""

import json
import os
import random

import pytest
import torch

from lmrl.checkpoint import (
    MANIFEST_FILE,
    CheckpointError,
    check_checkpoint,
    find_resume_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    resume_checkpoint,
    save_checkpoint,
    save_weights,
)
from tests.test_checkpoint import TiedLM, make_training, train_steps

FILES = ["model.safetensors", "value.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt",
         "trainer_state.json", MANIFEST_FILE]
DAMAGE = ["truncated", "empty", "missing", "garbage"]


def save_two(ckpt_dir):
    """step_2 and step_4 of one training run, each with every file a trainer writes."""
    model, opt, sched = make_training()
    value = torch.nn.Linear(6, 1)
    for step in (2, 4):
        train_steps(model, opt, sched, 2, start=step - 2)
        save_checkpoint(ckpt_dir, step, model=model, optimizer=opt, scheduler=sched, modules={"value": value},
                        generators={"data": torch.Generator().manual_seed(step)}, trainer_state={"step": step})
    return ckpt_dir / "step_2", ckpt_dir / "step_4"


def damage(file, how):
    data = file.read_bytes()
    if how == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "missing":
        file.unlink()
    elif how == "garbage":  # same length, so only reading the file can tell
        file.write_bytes(bytes(random.Random(0).randrange(256) for _ in data))


# What check_checkpoint says about step_4 after `damage(step_4 / name, how)`; None: it still loads.
VERDICTS = {
    ("trainer_state.json", "truncated"): "trainer_state.json is not valid JSON",
    ("trainer_state.json", "empty"): "trainer_state.json is not valid JSON",
    ("trainer_state.json", "missing"): "trainer_state.json is missing",
    ("trainer_state.json", "garbage"): "trainer_state.json is not valid JSON",
    (MANIFEST_FILE, "truncated"): "manifest.json is not valid",
    (MANIFEST_FILE, "empty"): "manifest.json is not valid",
    (MANIFEST_FILE, "missing"): None,  # a checkpoint saved before manifests existed: the files are read instead
    (MANIFEST_FILE, "garbage"): "manifest.json is not valid",
}
for _name in FILES[:5]:
    VERDICTS[(_name, "truncated")] = f"{_name} is cut short: "
    VERDICTS[(_name, "empty")] = f"{_name} is empty: 0 bytes, manifest.json lists "
    VERDICTS[(_name, "missing")] = f"{_name} is missing (manifest.json lists it"
    VERDICTS[(_name, "garbage")] = f"{_name} does not load ("


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("name", FILES)
def test_each_damaged_file_is_named_and_resume_falls_back_to_the_previous_checkpoint(tmp_path, name, how):
    good, bad = save_two(tmp_path)
    damage(bad / name, how)
    expected = VERDICTS[(name, how)]
    verdict = check_checkpoint(bad)

    if expected is None:
        assert verdict is None
        assert find_resume_checkpoint(tmp_path) == (bad, [])
        return
    assert verdict.startswith(expected), verdict
    assert "\n" not in verdict
    assert check_checkpoint(good) is None
    assert find_resume_checkpoint(tmp_path) == (good, [(bad, verdict)])
    # load_checkpoint cannot load the damaged one either: a one-line error naming the file (it does
    # not read the manifest, and a dir without trainer_state.json is the "incomplete" error)
    model, opt, sched = make_training()
    if name != MANIFEST_FILE and (name, how) != ("trainer_state.json", "missing"):
        with pytest.raises(CheckpointError, match=f"{bad / name}") as err:
            load_checkpoint(bad, model=model, optimizer=opt, scheduler=sched, modules={"value": torch.nn.Linear(6, 1)},
                            generators={"data": torch.Generator()})
        assert "\n" not in str(err.value)

    before = {p.name: p.read_bytes() for p in bad.iterdir()}
    found, warnings = resume_checkpoint(tmp_path)
    assert found == good
    assert warnings == [f"skipped damaged checkpoint {bad}: {verdict}; moved to damaged-step_4 (not deleted); "
                        f"resuming from step_2"]
    assert not bad.exists()
    assert {p.name: p.read_bytes() for p in (tmp_path / "damaged-step_4").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged-step_4", "step_2"]


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage"])
@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt"])
def test_without_a_manifest_every_file_is_still_read(tmp_path, name, how):
    """Checkpoints saved before manifests existed: the same damage is found by reading the files."""
    good, bad = save_two(tmp_path)
    (bad / MANIFEST_FILE).unlink()
    damage(bad / name, how)
    verdict = check_checkpoint(bad)
    assert verdict.startswith(f"{name} is empty (0 bytes)" if how == "empty" else f"{name} does not load ("), verdict
    assert find_resume_checkpoint(tmp_path) == (good, [(bad, verdict)])


def test_without_a_manifest_only_the_model_file_is_known_to_be_required(tmp_path):
    good, bad = save_two(tmp_path)
    (bad / MANIFEST_FILE).unlink()
    (bad / "optimizer.pt").unlink()
    assert check_checkpoint(bad) is None  # a warm-up's boundary checkpoint has no optimizer either
    (bad / "model.safetensors").unlink()
    assert check_checkpoint(bad) == "model.safetensors is missing"


def test_trainer_state_must_hold_the_step_of_its_dir(tmp_path):
    good, bad = save_two(tmp_path)
    (bad / "trainer_state.json").write_text(json.dumps({"step": 3}))
    assert check_checkpoint(bad) == "trainer_state.json says step 3, the dir is step_4"
    (bad / "trainer_state.json").write_text(json.dumps({"stage": "rl"}))
    assert check_checkpoint(bad) == 'trainer_state.json holds no integer "step"'
    (bad / "trainer_state.json").write_text("[4]")
    assert check_checkpoint(bad) == 'trainer_state.json holds no integer "step"'


def test_an_extra_damaged_weights_file_is_found_even_if_unlisted(tmp_path):
    good, bad = save_two(tmp_path)
    (bad / "reference.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")  # header cut short
    assert check_checkpoint(bad).startswith("reference.safetensors does not load (SafetensorError")


def test_every_checkpoint_damaged_is_one_line_error_naming_the_dir_and_each_reason(tmp_path):
    good, bad = save_two(tmp_path)
    damage(good / "rng.pt", "empty")
    damage(bad / "model.safetensors", "missing")
    with pytest.raises(CheckpointError) as err:
        resume_checkpoint(tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"no checkpoint in {tmp_path} loads (step_4: model.safetensors is missing "
                              f"(manifest.json lists it")
    assert "; step_2: rng.pt is empty: 0 bytes" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_4"]  # nothing moved


def test_a_step_dir_without_trainer_state_counts_as_damaged_only_for_resume(tmp_path):
    good, bad = save_two(tmp_path)
    (bad / "trainer_state.json").unlink()
    assert latest_checkpoint(tmp_path) == good  # latest_checkpoint: complete dirs only, as before
    assert find_resume_checkpoint(tmp_path) == (good, [(bad, check_checkpoint(bad))])


def test_no_checkpoints_means_start_from_step_0(tmp_path):
    assert resume_checkpoint(tmp_path / "absent") == (None, [])
    (tmp_path / "best").mkdir()
    (tmp_path / ".tmp-step_2-123").mkdir()  # a save killed before its rename
    assert resume_checkpoint(tmp_path) == (None, [])


def test_set_aside_false_leaves_damaged_checkpoints_in_place(tmp_path):
    good, bad = save_two(tmp_path)
    damage(bad / "optimizer.pt", "truncated")
    found, warnings = resume_checkpoint(tmp_path, set_aside=False)
    assert found == good and bad.is_dir()
    assert warnings[0].endswith("; left in place (not deleted); resuming from step_2")


def test_set_aside_never_overwrites_an_earlier_damaged_copy(tmp_path):
    model = TiedLM()
    for step in (2, 4):
        save_checkpoint(tmp_path, step, model=model, trainer_state={"step": step}, keep=0)
    damage(tmp_path / "step_4" / "model.safetensors", "empty")
    resume_checkpoint(tmp_path)
    save_checkpoint(tmp_path, 4, model=model, trainer_state={"step": 4}, keep=0)
    damage(tmp_path / "step_4" / "model.safetensors", "garbage")
    found, warnings = resume_checkpoint(tmp_path)
    assert found == tmp_path / "step_2" and "moved to damaged-step_4-2" in warnings[0]
    assert (tmp_path / "damaged-step_4" / "model.safetensors").stat().st_size == 0
    # later saves prune and replace step dirs only: the damaged copies stay
    for step in (4, 6, 8):
        save_checkpoint(tmp_path, step, model=model, trainer_state={"step": step}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged-step_4", "damaged-step_4-2", "step_8"]


def test_falls_back_past_several_damaged_checkpoints(tmp_path):
    model = TiedLM()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, trainer_state={"step": step}, keep=0)
    damage(tmp_path / "step_3" / "rng.pt", "garbage")
    damage(tmp_path / "step_2" / "trainer_state.json", "truncated")
    found, skipped = find_resume_checkpoint(tmp_path)
    assert found == tmp_path / "step_1"
    assert [(p.name, why.split(" ")[0]) for p, why in skipped] == [("step_3", "rng.pt"),
                                                                    ("step_2", "trainer_state.json")]


def test_a_weights_only_save_passes_the_check(tmp_path):
    path = save_weights(tmp_path / "best", TiedLM(), trainer_state={"step": 7, "eval/accuracy": 0.5})
    assert check_checkpoint(path) is None
    assert json.loads((path / MANIFEST_FILE).read_text()) == {
        "files": {"model.safetensors": os.path.getsize(path / "model.safetensors")}}
