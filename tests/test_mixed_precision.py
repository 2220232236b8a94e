"""`run.mixed_precision=bf16`: training steps and rollouts under bfloat16 autocast with fp32 weights,
held-out evaluation outside it; the built-in GPT's forward, backward and KV-cache sampling under it."""

from __future__ import annotations

import pytest
import torch

from lmrl.config import ConfigError
from lmrl.models.gpt import GPT, GPTConfig, sequence_logprobs
from lmrl.engines.local import ThreadEngine
from lmrl.train.rl_trainer import RLTrainer
from lmrl.generation.sampling import Sampling


class _Recording(RLTrainer):
    """Notes whether autocast is on where a rollout, an update and an evaluation run."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = {"rollout": set(), "evaluate": set(), "update": set()}
        task_rollout = self.task.rollout

        def rollout(*args, **kwargs):  # evaluation decodes greedily, RL samples
            self.seen["rollout"].add((kwargs.get("greedy", False), torch.is_autocast_enabled("cpu")))
            return task_rollout(*args, **kwargs)

        self.task.rollout = rollout

    def optimizer_step(self, loss):
        self.seen["update"].add((torch.is_autocast_enabled("cpu"), loss.dtype))
        return super().optimizer_step(loss)

    def evaluate(self):
        self.seen["evaluate"].add(torch.is_autocast_enabled("cpu"))
        return super().evaluate()


def test_bf16_runs_steps_and_rollouts_under_autocast_and_evaluates_without_it(tiny_config):
    trainer = _Recording(tiny_config("run.mixed_precision=bf16"))
    summary = trainer.train()
    assert trainer.seen["rollout"] == {(False, True), (True, False)}  # RL's samples under it, evaluation's not
    assert trainer.seen["update"] == {(True, torch.float32)}  # the loss itself stays fp32
    assert trainer.seen["evaluate"] == {False}
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert torch.isfinite(torch.tensor(summary["final_accuracy"]))
    assert not torch.is_autocast_enabled("cpu")  # nothing leaks out of train()


def test_without_mixed_precision_an_enclosing_autocast_is_left_alone(tiny_config):
    trainer = _Recording(tiny_config("train.steps=3"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trainer.train()
    assert trainer.seen["rollout"] == {(False, True), (True, True)} and trainer.seen["evaluate"] == {True}


def test_mixed_precision_takes_bf16_or_nothing(tiny_config):
    with pytest.raises(ConfigError, match=r"run.mixed_precision='fp16' is not one of '' \(empty\), bf16"):
        tiny_config("run.mixed_precision=fp16")


def test_thread_engine_samples_under_the_submitting_threads_autocast(tiny_config):
    trainer = RLTrainer(tiny_config("sft.steps=0"))
    ids = trainer.task.sample_train_ids(4, torch.Generator().manual_seed(0))
    engine = ThreadEngine(trainer.task, trainer.model)
    seen = []
    task_rollout = trainer.task.rollout

    def rollout(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return task_rollout(*args, **kwargs)

    trainer.task.rollout = rollout
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            engine.submit(ids, sampling=Sampling(), generator=torch.Generator()).result()
        engine.submit(ids, sampling=Sampling(), generator=torch.Generator()).result()
    finally:
        engine.close()
    assert seen == [True, False]


def _gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, n_position=32, n_layer=2, n_head=4, n_embd=64))


def test_gpt_gradients_under_bf16_autocast_are_close_to_fp32(one_thread):
    model = _gpt()
    ids = torch.randint(0, 16, (8, 12), generator=torch.Generator().manual_seed(1))
    adv = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))

    def grads(bf16: bool) -> torch.Tensor:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logp, _ = sequence_logprobs(model, ids, 4)
        assert logp.dtype == torch.float32
        (-(logp * adv).mean()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    full, mixed = grads(False), grads(True)
    assert torch.isfinite(mixed).all()
    cosine = torch.nn.functional.cosine_similarity(full, mixed, dim=0)
    assert cosine > 0.99, f"bf16 gradient direction differs from fp32's: cosine {cosine:.4f}"
    assert (mixed.norm() / full.norm() - 1).abs() < 0.05


def test_gpt_samples_under_bf16_autocast_with_a_bf16_cache(one_thread):
    model = _gpt().eval()
    prompt = torch.randint(0, 16, (16, 8), generator=torch.Generator().manual_seed(3))
    tokens, logps = model.generate(prompt, 4, generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, mixed = model.generate(prompt, 4, greedy=False, generator=torch.Generator().manual_seed(4))
        cached_tokens, cached = model.generate(prompt, 4, greedy=True)
        recomputed_tokens, recomputed = model.generate(prompt, 4, greedy=True, use_cache=False)
    assert mixed.dtype == torch.float32 and torch.isfinite(mixed).all()
    # the log-probs of fp32's own samples, teacher-forced under autocast: within bf16's rounding
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        forced, _ = sequence_logprobs(model, torch.cat([prompt, tokens], 1), 4)
    assert torch.allclose(forced, logps, atol=0.05)
    # the bf16 KV cache gives what recomputing every prefix under autocast gives
    assert torch.equal(cached_tokens, recomputed_tokens)
    assert torch.allclose(cached, recomputed, atol=0.05)
