"""Sampling options as TRL and transformers have them: temperature, top-k and top-p (nucleus) warp
the logits exactly as transformers' warpers do, in every sampler; `algo.mask_truncated_completions`
leaves completions cut off at the length limit out of the loss."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from lmrl.config import ConfigError, load_config
from lmrl.generation.rollout import sample_text
from lmrl.generation.sampling import warp_logits
from lmrl.engines.vllm_engine import assemble_rollout
from lmrl.train.rl_trainer import RLTrainer
from tests.test_gpt import next_token_logits, prompts, tiny_model
from tests.test_reward_functions import _math_config, tiny_math  # noqa: F401  (the fixture)


def hf_warped(logits, temperature, top_k, top_p):
    """What `generate(do_sample=True, temperature=, top_k=, top_p=)` samples from (its warpers' order)."""
    if temperature != 1.0:
        logits = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        logits = TopKLogitsWarper(top_k)(None, logits)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(None, logits)
    return logits


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 10, 1.0), (1.3, 10, 0.5),
                                                       (1.0, 0, 0.05), (0.5, 3, 0.99)])
def test_warp_logits_equals_transformers_warpers(temperature, top_k, top_p):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0)) * 3
    ours = warp_logits(logits, temperature, top_k, top_p)
    theirs = hf_warped(logits.clone(), temperature, top_k, top_p)
    assert torch.equal(ours.isinf(), theirs.isinf())
    assert torch.equal(ours, theirs)
    kept = (~ours.isinf()).sum(-1)
    assert kept.min() >= 1 and (top_p == 1.0 and not top_k or kept.max() < 50)


def test_top_p_keeps_the_smallest_set_of_most_likely_tokens_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = lambda p: (~warp_logits(probs.log(), top_p=p).isinf()).int().tolist()  # noqa: E731
    assert kept(0.5) == [[1, 0, 0, 0]]
    assert kept(0.6) == [[1, 1, 0, 0]]
    assert kept(0.9) == [[1, 1, 1, 0]]
    assert kept(0.01) == [[1, 0, 0, 0]]  # the most likely token always stays


@pytest.mark.parametrize("bad, message", [(dict(top_p=0.0), "top_p must be in"), (dict(top_p=1.5), "top_p must be in"),
                                          (dict(temperature=0.0), "temperature must be > 0")])
def test_warp_logits_refuses_out_of_range_settings(bad, message):
    with pytest.raises(ValueError, match=message):
        warp_logits(torch.zeros(1, 4), **bad)


def test_the_built_in_gpt_samples_only_from_the_nucleus_and_reports_its_log_probs():
    model, p = tiny_model(), prompts(batch=16)
    tokens, logp = model.generate(p, 8, top_p=0.6, generator=torch.Generator().manual_seed(5))
    warped = warp_logits(next_token_logits(model, p, tokens), top_p=0.6)  # (B, N, V)
    drawn = warped.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert not drawn.isinf().any(), "a token outside the nucleus was drawn"
    assert torch.allclose(logp, drawn - warped.logsumexp(-1), atol=1e-5)
    nucleus = (~warped.isinf()).sum(-1)
    assert nucleus.min() >= 1 and nucleus.float().mean() < warped.size(-1) / 2  # top-p did narrow the choice


def test_hf_generate_with_the_hf_engine_records_the_nucleus_log_probs(tiny_math):
    from lmrl.models.hf import load_hf_policy

    policy = load_hf_policy(str(tiny_math / "model"))[0]
    policy.generation_engine = "hf"
    ids, mask = policy.encode(["What is 1 + 2?", "Hi"])
    completion, keep, logprobs = policy.generate_ids(ids, mask, 6, top_p=0.5, generator=torch.Generator().manual_seed(0))
    full = torch.cat([ids, completion], 1)
    fmask = torch.cat([mask, keep.long()], 1)
    with torch.no_grad():
        logits = policy.hf_model(input_ids=full, attention_mask=fmask,
                                 position_ids=(fmask.cumsum(-1) - 1).clamp(min=0)).logits[:, ids.size(1) - 1:-1]
    warped = hf_warped(logits.float().reshape(-1, logits.size(-1)), 1.0, 0, 0.5).reshape(logits.shape)
    expected = torch.log_softmax(warped, -1).gather(-1, completion[..., None]).squeeze(-1)
    real = keep.bool()
    assert torch.allclose(logprobs[real], expected[real], atol=1e-4)


# -- which completions were cut off --------------------------------------------------------------

def test_text_rollouts_say_which_completions_reached_no_end_of_sequence(tiny_math):
    from lmrl.models.hf import load_hf_policy

    policy = load_hf_policy(str(tiny_math / "model"))[0]
    ro = sample_text(policy, ["What is 1 + 2?"] * 8, 5, generator=torch.Generator().manual_seed(0))
    eos = torch.tensor(list(policy.eos_token_ids))
    assert torch.equal(ro.truncated, ~torch.isin(ro.completions, eos).any(1))


def test_vllm_completions_without_an_eos_are_truncated():
    ro = assemble_rollout(torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2), [[5, 2, 7], [5, 6], [2]],
                          eos_token_ids=[2], pad_token_id=0)
    assert ro.truncated.tolist() == [False, True, False]


def test_masking_truncated_completions_takes_them_out_of_the_loss(tiny_math, tmp_path):
    """Two-token completions from a random tiny model, rewarded by their length in characters: every
    one is cut off, so with the option no token carries loss and the adapter's B matrices (zero at
    the start) never move; without it they do."""
    runs = {}
    for masked in (False, True):
        cfg = _math_config(tiny_math, tmp_path / str(masked), "task.max_new_tokens=2", "optim.weight_decay=0",
                           f"algo.mask_truncated_completions={str(masked).lower()}", "train.top_p=0.9",
                           "reward.funcs=[tests.trl_rewards:reward_len]")
        trainer = RLTrainer(cfg)
        trainer.train()
        rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
        runs[masked] = (trainer, [r for r in rows if "rollout/truncated_frac" in r])
    for masked, (trainer, steps) in runs.items():
        assert len(steps) == 2 and all(r["rollout/truncated_frac"] == 1.0 for r in steps)
        moved = any(p.abs().sum() > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)
        assert moved is not masked


def test_mask_truncated_completions_is_refused_for_fixed_length_answers():
    with pytest.raises(ConfigError, match="algo.mask_truncated_completions: task.name=addition writes fixed-length"):
        load_config("adder-grpo", ["mask_truncated_completions=true"])
