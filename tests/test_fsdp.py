"""FSDP on CPU (`distributed.strategy=fsdp`): two torchrun processes (gloo) run GRPO on a tiny Llama
built here, sharded with torch's `fully_shard`. Sampling runs on gathered weights (rows finish at
different times on each rank), updates equal DDP's, checkpoints hold whole tensors in the usual
layout (a LoRA policy's adapter only) that one process loads, and a 2-rank run resumes from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmrl.config import ConfigError, load_config
from lmrl.tasks.word_problems import write_addition_chat
from lmrl import checkpoint as ckpt
from lmrl.train.inspect import load_run
from tests.test_hf import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]

# Each rank trains, then gathers the whole parameters for itself and saves them for the test to compare.
WORKER = """
import sys
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from lmrl.config import load_config
from lmrl.parallel.ddp import shutdown
from lmrl.train.rl_trainer import RLTrainer

if __name__ == "__main__":  # MathReward's checker processes are spawned: they import this file
    trainer = RLTrainer(load_config("math-grpo-smollm2", sys.argv[1:]))
    trainer.train()
    state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).clone()
             for k, v in trainer.module.state_dict().items()}
    save_file(state, f"{trainer.run_dir}/params_rank{trainer.dist.rank}.safetensors")
    shutdown()
"""


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    save_tiny_llama(root / "model", max_positions=256)
    write_addition_chat(root / "data", n_train=40, n_test=8, seed=0)
    (root / "worker.py").write_text(WORKER)
    return root


def _overrides(root, run_dir, *extra):
    return [f"model.path={root / 'model'}", f"task.train_file={root / 'data' / 'train.jsonl'}",
            f"task.test_file={root / 'data' / 'test.jsonl'}", f"run.dir={run_dir}",
            "lora.r=4", "lora.target_modules=[all-linear]", "task.max_new_tokens=6", "train.steps=3",
            "train.rollout_size=16", "algo.group_size=4", "algo.kl_coef=0.05", "train.ga_steps=2",
            # 5 held-out problems: rank 0 decodes 2 batches, rank 1 one
            "train.eval_every=2", "eval.size=5", "eval.batch_size=2",
            "train.ckpt_every=1", "train.keep_checkpoints=0", "run.progress=false", "run.tensorboard=false",
            "run.threads=1", "optim.lr=1e-2", "reward.cls=tests.test_hf_training:LengthReward", *extra]


def _torchrun(root, run_dir, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # reward.cls lives in tests/
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(root / "worker.py"), *_overrides(root, run_dir, *extra)],
                          capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [load_file(run_dir / f"params_rank{r}.safetensors") for r in (0, 1)]


def _steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_close(a: dict, b: dict, atol=1e-5):
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"largest difference {worst}"


@pytest.fixture(scope="module")
def lora_run(tiny_hf):
    """One GRPO + LoRA run under FSDP: (run dir, each rank's gathered parameters)."""
    run = tiny_hf / "lora"
    return run, _torchrun(tiny_hf, run, "distributed.strategy=fsdp")


@pytest.mark.slow
def test_grpo_with_lora_under_fsdp_writes_whole_adapter_checkpoints_one_process_loads(tiny_hf, lora_run):
    run, (p0, p1) = lora_run
    _assert_close(p0, p1, atol=0.0)  # both ranks hold the same model
    assert "world size 2" in (run / "train.log").read_text()
    assert _steps(run) == [1, 2, 3]  # rank 0 alone writes metrics
    assert json.loads((run / "summary.json").read_text())["steps_done"] == 3

    step_3 = run / "checkpoints" / "step_3"
    assert (step_3 / ckpt.ADAPTER_CONFIG_FILE).is_file() and not (step_3 / ckpt.MODEL_FILE).exists()
    saved = load_file(step_3 / ckpt.ADAPTER_FILE)  # PEFT's layout and names, as without FSDP
    assert saved and all("lora_" in k for k in saved), "a LoRA checkpoint holds the adapter only"
    lora = {k: v for k, v in p0.items() if "lora_" in k}
    assert len(saved) == len(lora)
    assert sorted(v.sum().item() for v in saved.values()) == sorted(v.sum().item() for v in lora.values())
    untrained = load_file(run / "checkpoints" / "step_1" / ckpt.ADAPTER_FILE)
    assert any((saved[k] != untrained[k]).any() for k in saved), "training did not change the adapter"
    for step in ("step_1", "step_3", "best"):
        assert ckpt.check_checkpoint(run / "checkpoints" / step) is None

    loaded = load_run(run, "step_3")  # one process, no process group
    state = loaded.model.state_dict()
    _assert_close({k: state[k] for k in p0}, p0, atol=0.0)
    optimizer = torch.optim.AdamW([p for p in loaded.model.parameters() if p.requires_grad])
    ckpt.load_checkpoint(run / "checkpoints" / "step_3", model=loaded.model, optimizer=optimizer, restore_rng=False)
    assert len(optimizer.state) == len(saved)  # Adam's moments for every adapter weight, whole


@pytest.mark.slow
def test_a_resumed_fsdp_run_continues_from_the_checkpoint_as_ddp_does(tiny_hf, lora_run):
    run, _ = lora_run
    resumed = {}
    for strategy in ("fsdp", "ddp"):  # the FSDP checkpoint resumes under either strategy
        part = tiny_hf / f"resumed-{strategy}"
        shutil.copytree(run, part)
        shutil.rmtree(part / "checkpoints" / "step_3")
        lines = (part / "metrics.jsonl").read_text().splitlines()
        (part / "metrics.jsonl").write_text("\n".join(l for l in lines if json.loads(l)["step"] <= 2) + "\n")
        resumed[strategy] = _torchrun(tiny_hf, part, f"distributed.strategy={strategy}", "run.resume=auto")[0]
        assert f"resumed from {part / 'checkpoints' / 'step_2'}" in (part / "train.log").read_text()
        assert _steps(part) == [1, 2, 3]
    # every rank reseeds from (seed, rank, step) on resume: the same step 3 under both strategies
    _assert_close(resumed["fsdp"], resumed["ddp"])


@pytest.mark.slow
def test_full_finetuning_under_fsdp_matches_ddp(tiny_hf):
    runs = {s: _torchrun(tiny_hf, tiny_hf / f"full-{s}", f"distributed.strategy={s}", "lora.r=0", "optim.lr=1e-3")
            for s in ("fsdp", "ddp")}
    (f0, f1), (d0, _) = runs["fsdp"], runs["ddp"]
    _assert_close(f0, f1, atol=0.0)
    _assert_close(f0, d0)  # sharded gradients, clipping and AdamW give DDP's update
    untrained = load_file(tiny_hf / "model" / "model.safetensors")
    assert any((f0["model." + k] != v).any() for k, v in untrained.items() if "model." + k in f0)
    step = tiny_hf / "full-fsdp" / "checkpoints" / "step_3"
    for name in ("model", "reference"):  # the frozen KL reference copy is sharded and saved too
        ours, theirs = (load_file(tiny_hf / f"full-{s}" / "checkpoints" / "step_3" / f"{name}.safetensors")
                        for s in ("fsdp", "ddp"))
        assert ours.keys() == theirs.keys()  # the same layout: the tied embedding once
        _assert_close(ours, theirs)
    loaded = load_run(tiny_hf / "full-fsdp", "step_3")
    _assert_close({k: v for k, v in loaded.model.state_dict().items()}, f0, atol=0.0)
    assert (step / ckpt.OPTIMIZER_FILE).is_file()


def test_fsdp_refuses_samplers_that_copy_the_policy():
    base = ["model.path=unused", "distributed.strategy=fsdp"]
    for bad in ("rollout.overlap=true", "rollout.engine=vllm"):
        with pytest.raises(ConfigError, match="distributed.strategy=fsdp samples with the sharded policy"):
            load_config("math-grpo-smollm2", base + [bad])


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank, in this process: FSDP's mechanics without torchrun."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sharded_policy_samples_like_the_whole_one_and_round_trips_checkpoints(tiny_hf, one_rank_group, tmp_path):
    from torch.distributed.tensor import DTensor

    from lmrl.parallel import fsdp
    from lmrl.models.hf import load_hf_policy
    from lmrl.models.lora import add_lora

    def policy():
        torch.manual_seed(0)
        return add_lora(load_hf_policy(str(tiny_hf / "model"))[0], r=4, alpha=8)

    whole, sharded = policy(), fsdp.shard(policy())
    trainable = [p for p in sharded.parameters() if p.requires_grad]
    assert trainable and all(isinstance(p, DTensor) for p in trainable)
    assert {n for n, p in sharded.named_parameters() if p.requires_grad} == set(ckpt.weights_to_save(whole))
    ids, mask = whole.encode(["What is 1 + 2?", "Hi"])
    out = [p.generate_ids(ids, mask, 5, greedy=True) for p in (whole, sharded)]
    assert all(torch.equal(a, b) for a, b in zip(out[0][:2], out[1][:2]))
    assert all(isinstance(p, DTensor) for p in trainable), "sampling left the weights gathered"

    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    sharded(ids, attention_mask=mask).float().pow(2).mean().backward()
    optimizer.step()
    ckpt.save_checkpoint(tmp_path / "ckpt", 1, model=fsdp.full_state_dict(sharded, ckpt.weights_to_save(sharded)),
                         optimizer=fsdp.full_optimizer_state(optimizer), trainer_state={"step": 1})
    step = tmp_path / "ckpt" / "step_1"
    ckpt.load_checkpoint(step, model=whole, restore_rng=False)  # one process, no FSDP
    state = whole.state_dict()
    _assert_close({n: state[n] for n in ckpt.weights_to_save(whole)},
                  fsdp.full_state_dict(sharded, ckpt.weights_to_save(sharded)), atol=0.0)
    again = fsdp.shard(policy())
    again_opt = torch.optim.AdamW([p for p in again.parameters() if p.requires_grad], lr=1e-2)
    ckpt.load_checkpoint(step, model=again, optimizer=again_opt, restore_rng=False)
    for a, b in zip(again_opt.state.values(), optimizer.state.values()):
        assert torch.equal(a["exp_avg"].full_tensor(), b["exp_avg"].full_tensor())
