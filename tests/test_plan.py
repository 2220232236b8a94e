"""`lmrl plan`: parameter counts equal the built models' (LoRA: only the adapter has gradients and
optimizer state), the KV cache and the activations a training pass keeps are what torch really holds
(measured here on a tiny model), FSDP and vLLM are accounted for, and the CLI prints the plan, says when
it does not fit and refuses bad input in one line. The measured comparison with whole runs (peak RSS of
SmolLM2 GRPO and DPO) is benchmarks/plan_vs_measured.py, in docs/results.md."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from lmrl.cli import main
from lmrl.config import ConfigError, load_config
from lmrl.models import build_model
from lmrl.train.plan import GiB, plan
from lmrl.tasks.word_problems import write_addition_chat

GPU_CHECK = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer (scripts/gpu_check_assets), random fp32 weights, and
    addition-chat prompts."""
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    root = tmp_path_factory.mktemp("plan")
    model_dir = gpu_check.random_model_dir("smollm2", root, cpu=True)
    write_addition_chat(root / "data", n_train=32, n_test=8, seed=0)
    return root, model_dir


def _hf_config(tiny_dir, *overrides):
    root, model_dir = tiny_dir
    return load_config("math-grpo-smollm2", [f"model.path={model_dir}", f"task.train_file={root / 'data/train.jsonl'}",
                                             f"task.test_file={root / 'data/test.jsonl'}", "run.device=cpu",
                                             *overrides])


def test_the_adders_gpt_is_counted_as_built(tmp_path):
    cfg = load_config("adder")
    p = plan(cfg, device="cpu")
    from lmrl.tasks import build_task

    model = build_model(cfg.model, build_task(cfg, tokenizer=None, device="cpu").tokenizer.vocab_size)
    assert p.model.parameters == sum(t.numel() for t in model.parameters())
    assert p.held["weights"] == 4 * p.model.parameters
    assert p.held["optimizer state (AdamW, 2 moments)"] == 8 * p.model.parameters
    assert p.lengths.prompt == 8 and p.lengths.completion == 4  # "123+456=" and a 4-digit answer


def test_a_lora_policy_is_counted_as_built_and_only_the_adapter_trains(tiny_dir):
    cfg = _hf_config(tiny_dir)
    p = plan(cfg, device="cpu")
    policy = build_model(cfg.model, lora=cfg.lora)
    params = list(policy.parameters())
    trainable = [t for t in params if t.requires_grad]
    assert p.model.parameters == sum(t.numel() for t in params)
    assert p.model.trainable == sum(t.numel() for t in trainable) < p.model.parameters / 10
    assert p.update["gradients (trainable)"] == 4 * p.model.trainable
    assert p.held["optimizer state (AdamW, 2 moments)"] == 8 * p.model.trainable

    full = plan(_hf_config(tiny_dir, "lora.r=0"), device="cpu")
    assert full.model.trainable == full.model.parameters  # every weight trains
    assert full.held["optimizer state (AdamW, 2 moments)"] == 8 * full.model.parameters


def test_prompt_lengths_come_from_the_rendered_data(tiny_dir):
    cfg = _hf_config(tiny_dir)
    p = plan(cfg, device="cpu")
    from lmrl.tasks.math_task import MathTask

    policy = build_model(cfg.model)
    task = MathTask(cfg.task.train_file, cfg.task.test_file, policy.tokenizer, prompt_template=cfg.task.prompt_template,
                    reward=object())
    longest = max(len(policy.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in task.prompt_texts[:32])
    assert p.lengths.prompt == longest and p.lengths.completion == cfg.task.max_new_tokens


def test_the_kv_cache_is_what_a_cached_forward_holds(tiny_dir):
    cfg = _hf_config(tiny_dir, "lora.r=0", "train.rollout_size=8", "algo.name=reinforce", "algo.group_size=1",
                     "eval.batch_size=4")
    p = plan(cfg, device="cpu")
    [(name, planned)] = p.sampling.items()
    assert name.startswith("KV cache (8 rows")
    model = build_model(cfg.model).hf_model
    tokens = p.lengths.prompt + p.lengths.completion
    with torch.no_grad():
        cache = model(input_ids=torch.randint(100, (8, tokens)), use_cache=True).past_key_values
    held = sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)
    assert planned == held


def _saved_bytes(model, ids, n_scored: int) -> int:
    """Bytes autograd keeps for backward in one forward pass of `model` (weights left out), counted with
    saved-tensor hooks, each storage once."""
    weights = {t.untyped_storage().data_ptr() for t in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, logits_to_keep=n_scored).logits.sum().backward()
    return sum(saved.values())


@pytest.mark.parametrize("checkpointing,weights,autocast", [(False, "fp32", False), (True, "fp32", False),
                                                         (False, "bf16", False), (False, "fp32", True),
                                                         (False, "bf16", True), (True, "bf16", False)])
def test_activations_are_close_to_what_backward_keeps(tiny_dir, checkpointing, weights, autocast):
    """A LoRA policy's micro-batch (every row its own prompt): the plan's activations (and, under autocast,
    the bf16 weight copies) against the bytes autograd saves, for fp32 and bf16 weights with and without
    autocast: on bf16 weights peft casts each adapter's input to fp32, under autocast each layer casts its
    input and weight to bf16, and every such copy is saved. Under gradient checkpointing the pass saves
    the blocks' inputs, and its backward recomputes one block at a time, whose saves are measured on the
    same pass without checkpointing (within 15%: the plan counts one block's saves and every layer's
    input; otherwise within 10%)."""
    cfg = _hf_config(tiny_dir, "train.rollout_size=8", "algo.name=reinforce", "algo.group_size=1", "train.ga_steps=2",
                     f"model.gradient_checkpointing={str(checkpointing).lower()}", f"model.dtype={weights}",
                     f"run.mixed_precision={'bf16' if autocast else ''}")
    p = plan(cfg, device="cpu")
    planned = sum(v for k, v in p.update.items() if k.startswith(("activations", "weights cast")))
    model = build_model(cfg.model, lora=cfg.lora).hf_model.train()
    ids = torch.randint(100, (8 // 2, p.lengths.prompt + p.lengths.completion))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        measured = _saved_bytes(model, ids, p.lengths.completion)
        if checkpointing:
            model.gradient_checkpointing_disable()
            measured += _saved_bytes(model, ids, p.lengths.completion) // p.model.layers
    assert abs(planned / measured - 1) < (0.15 if checkpointing else 0.1), (planned, measured)


def test_fsdp_shards_what_is_held_and_vllm_takes_its_share(tiny_dir):
    one = plan(_hf_config(tiny_dir, "lora.r=0"), device="h100")
    two = plan(_hf_config(tiny_dir, "lora.r=0", "distributed.strategy=fsdp"), device="h100", world_size=2)
    assert two.held["weights"] == one.held["weights"] // 2
    assert two.sampling["whole policy, gathered"] == one.held["weights"] - two.held["weights"]
    vllm = plan(_hf_config(tiny_dir, "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.3"), device="h100",
                device_memory_gb=80)
    assert vllm.held["vLLM (rollout.gpu_memory_utilization)"] == int(0.3 * 80e9)
    assert not any(k.startswith("KV cache (") and "evaluation" not in k for k in vllm.sampling)


def test_the_cli_prints_the_plan_and_says_when_it_does_not_fit(tiny_dir, capsys):
    root, model_dir = tiny_dir
    args = ["plan", "math-grpo-smollm2", f"model.path={model_dir}", f"task.train_file={root / 'data/train.jsonl'}",
            f"task.test_file={root / 'data/test.jsonl'}", "--device", "h100"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "peak" in out and "of 80 GB: fits" in out and "KV cache" in out and "step time estimate" in out
    assert main(args + ["--device-memory", "0.5"]) == 3
    assert "does NOT fit" in capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["peak_bytes"] == sum(found["held_bytes"].values()) + max(sum(found["update_bytes"].values()),
                                                                         sum(found["sampling_bytes"].values()))
    assert found["peak_bytes"] > 0.5 * GiB  # the CUDA context alone


@pytest.mark.parametrize("flag, message", [(["--device", "tpu"], "--device 'tpu' is not one plan knows"),
                                           (["--world-size", "0"], "--world-size must be at least 1"),
                                           (["--device-memory", "-1"], "--device-memory must be a positive number"),
                                           (["model.path=/nonexistent/model"], "model.path=/nonexistent/model")])
def test_bad_input_is_one_line_naming_it(flag, message, capsys):
    config = "math-grpo-smollm2" if flag[0].startswith("model.") else "adder"
    assert main(["plan", config, *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_plan_refuses_an_unknown_device_from_python():
    with pytest.raises(ConfigError, match="h100, h200, a100, cpu"):
        plan(load_config("adder"), device="tpu")


ALL_SEVEN = "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


def test_a_gpu_decode_step_costs_its_counted_operations_eager_or_replayed_as_a_graph(tiny_dir):
    """2 layers x 97.6 operations (LoRA on all seven projections) + 63 for sampling: eager at 17 us each
    on an h100 (4389.4 us), or the layers' at 1 us in a CUDA graph (195.2 + 1071 = 1266.2 us)."""
    from lmrl.train.plan import _decode_launch

    eager = _hf_config(tiny_dir, ALL_SEVEN, "run.mixed_precision=bf16")  # under autocast the loop keeps no graph
    graphed = _hf_config(tiny_dir, ALL_SEVEN, "run.mixed_precision=")
    no_lora = _hf_config(tiny_dir, "lora.r=0", "run.mixed_precision=bf16")
    assert _decode_launch(eager, plan(eager, device="h100")) == pytest.approx(4389.4e-6)
    assert _decode_launch(graphed, plan(graphed, device="h100")) == pytest.approx(1266.2e-6)
    assert _decode_launch(no_lora, plan(no_lora, device="h100")) == pytest.approx((2 * 61.5 + 63) * 17e-6)
    assert _decode_launch(eager, plan(eager, device="cpu")) == 0  # a CPU's time is its work


def test_a_gpu_update_is_never_faster_than_launching_its_micro_batches(tiny_dir):
    """LoRA on all seven projections, 2 layers: shared prompts 2 x 1426.2 + 500 = 3352.4 operations a
    micro-batch at 17 us = 56.99 ms; a tiny model on a GPU does not share (the prompt work saved is far
    below the extra passes' launches), so it runs one pass, 2 x 453.2 + 500 = 1406.4, x 4 micro-batches;
    checkpointed: 2 x 668.2 + 500 = 1836.4."""
    from lmrl.train.plan import _update_launch

    cfg = _hf_config(tiny_dir, ALL_SEVEN, "train.rollout_size=16", "algo.group_size=4", "train.ga_steps=4")
    p = plan(cfg, device="h100")
    assert _update_launch(cfg, p, "shared prompts") == pytest.approx(56990.8e-6)
    assert p.step_seconds["update"] == pytest.approx(4 * 1406.4 * 17e-6)  # a tiny model: launch-bound
    assert any("shared-prompt pass is off under this GPU" in note for note in p.notes)
    gc = _hf_config(tiny_dir, ALL_SEVEN, "train.rollout_size=16", "algo.group_size=4", "train.ga_steps=4",
                    "model.gradient_checkpointing=true")
    assert plan(gc, device="h100").step_seconds["update"] == pytest.approx(4 * 1836.4 * 17e-6)


def test_remax_plans_the_greedy_decode_of_each_prompt_beside_the_sampled_batch(tiny_dir):
    """On a GPU a tiny model's decode step is launch-bound: the same time for 16 rows or 4, so ReMax's
    greedy pass of the 4 prompts doubles the decode steps; its prefill is the sampled batch's again."""
    grpo = _hf_config(tiny_dir, ALL_SEVEN, "train.rollout_size=16", "algo.group_size=4", "algo.name=grpo")
    remax = _hf_config(tiny_dir, ALL_SEVEN, "train.rollout_size=16", "algo.group_size=4", "algo.name=remax")
    g, r = plan(grpo, device="h100").step_seconds, plan(remax, device="h100").step_seconds
    assert r["sampling"] == pytest.approx(2 * g["sampling"])
    assert r["update"] == pytest.approx(g["update"])
