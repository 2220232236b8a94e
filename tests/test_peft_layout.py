"""A LoRA policy's checkpoints are in PEFT's own layout (adapter_config.json + adapter_model.safetensors,
optimizer and trainer state beside them), so `PeftModel.from_pretrained(base, step_dir)` loads them
with the training policy's logits; lmrl resumes from them exactly, still reads checkpoints that hold
the adapter in model.safetensors, and falls back past a damaged adapter file. A tiny Llama built
here, no hub."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lmrl import checkpoint as ckpt
from lmrl.models.hf import load_hf_policy
from lmrl.models.lora import add_lora, save_adapter
from lmrl.train.inspect import export_run, load_run, resolve_checkpoint
from lmrl.train.sft_trainer import SFTTrainer
from tests.test_checkpoint_damage import damage
from tests.test_offline_trainers import _cfg, _metrics, data  # noqa: F401  (data: the module fixture)

PROMPTS = ["What is 1+2?", "What is 3+0? Tell me"]


def _lora_sft(data, run_dir, *overrides):
    return SFTTrainer(_cfg(data, run_dir, "sft", "lora.r=4", "lora.alpha=8", "train.max_steps=2",
                           "train.eval_every=2", "train.ckpt_every=1", "train.keep_checkpoints=0", *overrides))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A 2-step SFT run with LoRA (checkpoints at steps 1 and 2, best = step 2) and its trainer."""
    run_dir = tmp_path_factory.mktemp("peft") / "run"
    trainer = _lora_sft(data, run_dir)
    trainer.train()
    trainer.model.eval()
    return run_dir, trainer


def _policy_logits(policy, prompts=PROMPTS):
    ids, mask = policy.encode(prompts)
    with torch.no_grad():
        return policy(ids, attention_mask=mask), ids, mask


def _peft_logits(data, ckpt_dir, ids, mask):
    base = AutoModelForCausalLM.from_pretrained(data / "model")
    model = PeftModel.from_pretrained(base, str(ckpt_dir)).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _lora_policy(data, r=4):
    torch.manual_seed(0)
    return add_lora(load_hf_policy(str(data / "model"))[0], r=r, alpha=8)


def _old_layout(step_dir, policy):
    """Rewrite `step_dir` as checkpoints were saved before PEFT's layout: the adapter in
    model.safetensors under the policy's parameter names, and a manifest listing it."""
    ckpt.load_checkpoint(step_dir, model=policy, restore_rng=False)
    (step_dir / ckpt.ADAPTER_FILE).unlink()
    (step_dir / ckpt.ADAPTER_CONFIG_FILE).unlink()
    ckpt.save_weights_file(policy, step_dir / ckpt.MODEL_FILE)
    files = [p for p in step_dir.iterdir() if p.name not in (ckpt.MANIFEST_FILE, ckpt.TRAINER_STATE_FILE)]
    (step_dir / ckpt.MANIFEST_FILE).write_text(json.dumps({"files": {p.name: p.stat().st_size for p in files}}))


# --- PEFT reads what lmrl writes ------------------------------------------------------------------

def test_every_lora_checkpoint_is_in_peft_layout_beside_the_training_state(data, run):
    run_dir, _ = run
    for name in ("step_1", "step_2", "best"):
        files = {p.name for p in (run_dir / "checkpoints" / name).iterdir()}
        assert {ckpt.ADAPTER_FILE, ckpt.ADAPTER_CONFIG_FILE, ckpt.TRAINER_STATE_FILE, ckpt.MANIFEST_FILE} <= files
        assert ckpt.MODEL_FILE not in files, "the frozen base is not saved"
    files = {p.name for p in (run_dir / "checkpoints" / "step_2").iterdir()}
    assert {ckpt.OPTIMIZER_FILE, ckpt.SCHEDULER_FILE, ckpt.RNG_FILE} <= files
    manifest = json.loads((run_dir / "checkpoints" / "step_2" / ckpt.MANIFEST_FILE).read_text())["files"]
    assert {ckpt.ADAPTER_FILE, ckpt.ADAPTER_CONFIG_FILE} <= set(manifest)
    config = json.loads((run_dir / "checkpoints" / "step_2" / ckpt.ADAPTER_CONFIG_FILE).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["base_model_name_or_path"] == str(data / "model")


@pytest.mark.parametrize("which", ["step_2", "best"])
def test_peft_from_pretrained_on_a_checkpoint_gives_the_training_policys_logits(data, run, which):
    run_dir, trainer = run
    assert trainer.state["best"]["step"] == 2  # so best/ holds the policy's final weights too
    ours, ids, mask = _policy_logits(trainer.model)
    theirs = _peft_logits(data, run_dir / "checkpoints" / which, ids, mask)
    assert torch.allclose(theirs, ours, atol=1e-6, rtol=0)
    base = AutoModelForCausalLM.from_pretrained(data / "model").eval()
    with torch.no_grad():  # and the adapter trained: the base alone differs
        assert not torch.allclose(base(input_ids=ids, attention_mask=mask).logits, ours, atol=1e-4)


def test_the_adapter_file_holds_what_peft_save_pretrained_writes(run, tmp_path):
    run_dir, trainer = run
    save_adapter(trainer.model, tmp_path / "peft")  # peft's own PeftModel.save_pretrained
    ours = load_file(run_dir / "checkpoints" / "step_2" / ckpt.ADAPTER_FILE)
    theirs = load_file(tmp_path / "peft" / ckpt.ADAPTER_FILE)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ours_cfg = json.loads((run_dir / "checkpoints" / "step_2" / ckpt.ADAPTER_CONFIG_FILE).read_text())
    theirs_cfg = json.loads((tmp_path / "peft" / ckpt.ADAPTER_CONFIG_FILE).read_text())
    for cfg in (ours_cfg, theirs_cfg):
        cfg["target_modules"] = sorted(cfg["target_modules"])  # a set in peft, written in no fixed order
    assert ours_cfg == theirs_cfg


def test_lmrl_loads_an_adapter_peft_saved(data, run, tmp_path):
    _, trainer = run
    save_adapter(trainer.model, tmp_path / "peft")
    policy = _lora_policy(data)
    ckpt.load_weights(policy, tmp_path / "peft" / ckpt.ADAPTER_FILE)
    policy.eval()
    assert torch.equal(_policy_logits(policy)[0], _policy_logits(trainer.model)[0])


# --- lmrl reads it back ---------------------------------------------------------------------------

def test_lmrl_eval_generate_and_export_load_a_peft_layout_run(data, run, tmp_path):
    run_dir, trainer = run
    assert resolve_checkpoint(run_dir, "best") == run_dir / "checkpoints" / "best"
    loaded = load_run(run_dir, "step_2")
    assert torch.equal(_policy_logits(loaded.model)[0], _policy_logits(trainer.model)[0])
    out = export_run(run_dir, tmp_path / "export", "best")
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ours, ids, mask = _policy_logits(trainer.model)
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids, attention_mask=mask).logits, ours, atol=1e-5)


def test_a_resumed_run_from_a_peft_layout_checkpoint_writes_the_same_metrics(data, run, tmp_path):
    full = _lora_sft(data, tmp_path / "full", "train.max_steps=4")
    full.train()
    part = tmp_path / "part"
    _lora_sft(data, part, "train.max_steps=4").train()
    for name in ("step_3", "step_4"):
        shutil.rmtree(part / "checkpoints" / name)
    lines = (part / "metrics.jsonl").read_text().splitlines()
    (part / "metrics.jsonl").write_text("\n".join(l for l in lines if json.loads(l)["step"] <= 2) + "\n")
    assert (part / "checkpoints" / "step_2" / ckpt.ADAPTER_FILE).is_file()
    resumed = _lora_sft(data, part, "train.max_steps=4", "run.resume=auto")
    resumed.train()
    assert f"resumed from {part / 'checkpoints' / 'step_2'}" in (part / "train.log").read_text()

    def comparable(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/"))} for r in _metrics(run_dir)]

    assert comparable(part) == comparable(tmp_path / "full")
    for name in ("step_3", "step_4"):
        a, b = (load_file(d / "checkpoints" / name / ckpt.ADAPTER_FILE) for d in (part, tmp_path / "full"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_holding_the_adapter_in_model_safetensors_still_loads_and_resumes(data, run, tmp_path):
    run_dir, trainer = run
    part = tmp_path / "run"
    shutil.copytree(run_dir, part)
    shutil.rmtree(part / "checkpoints" / "step_2")
    _old_layout(part / "checkpoints" / "step_1", _lora_policy(data))
    assert ckpt.check_checkpoint(part / "checkpoints" / "step_1") is None
    assert ckpt.weights_file(part / "checkpoints" / "step_1").name == ckpt.MODEL_FILE
    ours = _lora_policy(data)
    ckpt.load_checkpoint(run_dir / "checkpoints" / "step_1", model=ours, restore_rng=False)
    old = load_run(part, "step_1").model
    assert torch.equal(_policy_logits(old)[0], _policy_logits(ours.eval())[0])

    lines = (part / "metrics.jsonl").read_text().splitlines()
    (part / "metrics.jsonl").write_text("\n".join(l for l in lines if json.loads(l)["step"] <= 1) + "\n")
    resumed = _lora_sft(data, part, "run.resume=auto")
    resumed.train()
    assert f"resumed from {part / 'checkpoints' / 'step_1'}" in (part / "train.log").read_text()
    resumed.model.eval()
    assert torch.equal(_policy_logits(resumed.model)[0], _policy_logits(trainer.model)[0])
    assert (part / "checkpoints" / "step_2" / ckpt.ADAPTER_FILE).is_file()  # new saves are in PEFT's layout


# --- damage and mismatches ------------------------------------------------------------------------

@pytest.fixture
def two_lora_checkpoints(data, tmp_path):
    """step_1 and step_2 of a LoRA policy, each in PEFT's layout with an optimizer."""
    policy = _lora_policy(data)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = policy.encode(PROMPTS)
    for step in (1, 2):
        policy(ids, attention_mask=mask).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.save_checkpoint(tmp_path / "ckpt", step, model=policy, optimizer=opt, trainer_state={"step": step}, keep=0)
    return tmp_path / "ckpt" / "step_1", tmp_path / "ckpt" / "step_2"


@pytest.mark.parametrize("name, how, verdict", [
    (ckpt.ADAPTER_FILE, "truncated", "adapter_model.safetensors is cut short"),
    (ckpt.ADAPTER_FILE, "garbage", "adapter_model.safetensors does not load ("),
    (ckpt.ADAPTER_FILE, "missing", "adapter_model.safetensors is missing (manifest.json lists it"),
    (ckpt.ADAPTER_CONFIG_FILE, "missing", "adapter_config.json is missing (manifest.json lists it"),
    (ckpt.ADAPTER_CONFIG_FILE, "garbage", "adapter_config.json is not valid JSON ("),
])
def test_a_damaged_adapter_checkpoint_is_set_aside_and_resume_falls_back(two_lora_checkpoints, name, how, verdict):
    good, bad = two_lora_checkpoints
    damage(bad / name, how)
    assert ckpt.check_checkpoint(bad).startswith(verdict), ckpt.check_checkpoint(bad)
    found, lines = ckpt.resume_checkpoint(bad.parent)
    assert found == good
    assert lines == [f"skipped damaged checkpoint {bad}: {ckpt.check_checkpoint(bad.parent / 'damaged-step_2')}; "
                     f"moved to damaged-step_2 (not deleted); resuming from step_1"]


@pytest.mark.parametrize("name", [ckpt.ADAPTER_FILE, ckpt.ADAPTER_CONFIG_FILE])
def test_without_a_manifest_each_adapter_file_is_still_required(two_lora_checkpoints, name):
    _, bad = two_lora_checkpoints
    (bad / ckpt.MANIFEST_FILE).unlink()
    assert ckpt.check_checkpoint(bad) is None
    (bad / name).unlink()
    other = ({ckpt.ADAPTER_FILE, ckpt.ADAPTER_CONFIG_FILE} - {name}).pop()
    assert ckpt.check_checkpoint(bad) == f"{name} is missing ({other} is there)"


def test_an_adapter_config_that_is_not_peft_s_is_refused(two_lora_checkpoints):
    _, bad = two_lora_checkpoints
    (bad / ckpt.MANIFEST_FILE).unlink()
    (bad / ckpt.ADAPTER_CONFIG_FILE).write_text("[1, 2]")
    assert ckpt.check_checkpoint(bad) == 'adapter_config.json holds no "peft_type" (not a PEFT adapter config)'


def test_an_adapter_checkpoint_into_the_wrong_model_is_one_line_naming_the_file(data, two_lora_checkpoints):
    _, step = two_lora_checkpoints
    file = step / ckpt.ADAPTER_FILE
    plain = load_hf_policy(str(data / "model"))[0]
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.load_checkpoint(step, model=plain, restore_rng=False)
    assert str(e.value) == (f"{file} holds a LoRA adapter, and HFPolicy has none to load it into (build the policy "
                            f"with the LoRA settings of the run that saved it)")
    with pytest.raises(ckpt.CheckpointError, match=rf"^{file}: model\.base_model\.\S+\.lora_A\.default\.weight has shape "
                                                   rf"\(4, (\d+)\), the model's is \(8, \1\) \(saved with another lora.r\?\)$"):
        ckpt.load_checkpoint(step, model=_lora_policy(data, r=8), restore_rng=False)
    other = add_lora(load_hf_policy(str(data / "model"))[0], r=4, target_modules=["q_proj"])
    with pytest.raises(ckpt.CheckpointError, match=rf"^{file} does not match the LoRA adapter of HFPolicy: missing "
                                                   rf"keys \[\], unexpected keys \['base_model.model.model.layers.0.mlp"):
        ckpt.load_checkpoint(step, model=other, restore_rng=False)


def test_init_from_a_peft_layout_checkpoint_dir_loads_its_adapter(data, two_lora_checkpoints):
    _, step = two_lora_checkpoints
    saved, fresh = _lora_policy(data), _lora_policy(data)
    ckpt.load_checkpoint(step, model=saved, restore_rng=False)
    ckpt.load_initial_weights(fresh, str(step), "cpu")
    assert torch.equal(_policy_logits(fresh.eval())[0], _policy_logits(saved.eval())[0])


# --- FSDP: gathered weights are saved in PEFT's layout too ----------------------------------------

@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank, in this process: FSDP's mechanics without torchrun."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_sharded_lora_policys_gathered_weights_are_saved_in_peft_layout(data, one_rank_group, tmp_path):
    from lmrl.parallel import fsdp

    sharded = fsdp.shard(_lora_policy(data))
    opt = torch.optim.AdamW([p for p in sharded.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = sharded.encode(PROMPTS)
    sharded(ids, attention_mask=mask).float().pow(2).mean().backward()
    opt.step()
    weights = ckpt.gathered_weights(sharded, fsdp.full_state_dict(sharded, ckpt.weights_to_save(sharded)))
    assert isinstance(weights, ckpt.AdapterWeights)
    step = ckpt.save_checkpoint(tmp_path / "ckpt", 1, model=weights, optimizer=fsdp.full_optimizer_state(opt),
                                trainer_state={"step": 1})
    assert ckpt.check_checkpoint(step) is None and not (step / ckpt.MODEL_FILE).exists()
    sharded.eval()
    with torch.no_grad():
        ours = sharded(ids, attention_mask=mask)
    assert torch.allclose(_peft_logits(data, step, ids, mask), ours, atol=1e-6, rtol=0)
    again = fsdp.shard(_lora_policy(data))  # each rank takes its shard of the adapter back
    ckpt.load_checkpoint(step, model=again, restore_rng=False)
    again.eval()
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask), ours)
    tensors = {"x": torch.zeros(1)}  # anything but a LoRA policy: the tensors as they are, for model.safetensors
    assert ckpt.gathered_weights(load_hf_policy(str(data / "model"))[0], tensors) is tensors


# --- a LoRA reward model ---------------------------------------------------------------------------

def test_a_lora_reward_models_checkpoints_are_peft_adapters_holding_its_score_head(data, tmp_path):
    # the adapter and the score head only, under peft's own names: no frozen base weights
    from safetensors.torch import save_model
    from transformers import AutoModelForSequenceClassification

    from lmrl.train.reward_trainer import RewardTrainer

    def rm_config(run_dir, *overrides):
        return _cfg(data, run_dir, "reward", "lora.r=4", "lora.alpha=8", "train.max_steps=2", "train.eval_every=2",
                    "train.ckpt_every=1", "train.keep_checkpoints=0", *overrides)

    trainer = RewardTrainer(rm_config(tmp_path / "rm"))
    trainer.train()
    ckpts = tmp_path / "rm" / "checkpoints"
    for name in ("step_1", "step_2", "best"):
        files = {p.name for p in (ckpts / name).iterdir()}
        assert {ckpt.ADAPTER_FILE, ckpt.ADAPTER_CONFIG_FILE} <= files and ckpt.MODEL_FILE not in files
    saved = load_file(ckpts / "step_2" / ckpt.ADAPTER_FILE)
    assert "base_model.model.score.weight" in saved and all("lora_" in k or k.endswith("score.weight") for k in saved)

    ckpt.load_checkpoint(ckpts / "step_2", model=trainer.model, restore_rng=False)
    trainer.model.eval()
    ids = torch.tensor([[1, 5, 9, 12, 7], [1, 6, 6, 3, 2]])
    mask = torch.ones_like(ids)
    base = AutoModelForSequenceClassification.from_pretrained(data / "model", num_labels=1, pad_token_id=0)
    peft = PeftModel.from_pretrained(base, str(ckpts / "step_2")).eval()
    with torch.no_grad():
        assert torch.allclose(peft(input_ids=ids, attention_mask=mask).logits[:, 0], trainer.model(ids, mask),
                              atol=1e-6)

    resumed = RewardTrainer(rm_config(tmp_path / "again", "run.resume=auto", f"run.resume_from={ckpts / 'step_1'}"))
    resumed.train()
    volatile = ("perf/", "time/")
    rows = [[{k: v for k, v in r.items() if not k.startswith(volatile)} for r in _metrics(d) if r["step"] == 2]
            for d in (tmp_path / "rm", tmp_path / "again")]
    assert rows[0] == rows[1]

    # a checkpoint saved before this layout held the whole model in model.safetensors: it still loads
    old = tmp_path / "old.safetensors"
    save_model(trainer.model, str(old))
    ckpt.load_weights(resumed.model, old)
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.state_dict().values(), trainer.model.state_dict().values()))
