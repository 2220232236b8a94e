"""Sampling options as TRL and transformers have them: the repetition penalty, temperature, top-k,
top-p (nucleus) and min-p change the logits exactly as transformers' processors and warpers do, in
the order its `generate` builds them, in every sampler; a user's task written before min_p and
repetition_penalty keeps working; `algo.mask_truncated_completions` leaves completions cut off at the
length limit out of the loss."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import (GenerationConfig, LogitsProcessorList, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from lmrl.config import ConfigError, load_config
from lmrl.generation.rollout import sample_text
from lmrl.generation.sampling import Sampling, options_not_taken, penalize_repeats, seen_tokens, warp_logits
from lmrl.engines.vllm_engine import assemble_rollout
from lmrl.train.rl_trainer import RLTrainer
from tests.test_gpt import next_token_logits, prompts, tiny_model
from tests.test_hf_generate import peaked_llama
from tests.test_reward_functions import _math_config, tiny_math  # noqa: F401  (the fixture)


def hf_warped(logits, temperature, top_k, top_p, min_p=0.0):
    """What `generate(do_sample=True, temperature=, top_k=, top_p=, min_p=)` samples from (its warpers' order)."""
    if temperature != 1.0:
        logits = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        logits = TopKLogitsWarper(top_k)(None, logits)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(None, logits)
    if min_p:
        logits = MinPLogitsWarper(min_p)(None, logits)
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


# -- min-p and the repetition penalty -------------------------------------------------------------

PAD = 0


def left_padded_prompts():
    """(ids, mask) (3, 6) with repeated tokens: row 0 is left-padded with the pad id 0 and never uses it,
    row 1 is padded too and uses 0 as a real token, row 2 has no padding."""
    ids = torch.tensor([[PAD, PAD, 5, 7, 5, 5], [PAD, 3, 0, 3, 9, 3], [4, 4, 4, 8, 2, 11]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    return ids, mask


def mixed_logits(rows: int, vocab: int, seed: int = 0, ties: bool = False) -> torch.Tensor:
    """Positive and negative logits; with `ties`, whole numbers in [-3, 3], so many tokens tie."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(-3, 4, (rows, vocab), generator=g).float()
    return torch.randn(rows, vocab, generator=g) * 3


@pytest.fixture(scope="module")
def hf_model():
    return peaked_llama()


def generate_processors(model, ids, mask, **options) -> LogitsProcessorList:
    """The processors the installed transformers' `generate(do_sample=True, **options)` builds, in its order."""
    return model._get_logits_processor(generation_config=GenerationConfig(do_sample=True, **options),
                                       input_ids_seq_length=ids.size(1), logits_processor=LogitsProcessorList(),
                                       device=ids.device, model_kwargs={"attention_mask": mask})


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [(1.0, 0, 1.0, 0.1), (0.7, 0, 1.0, 0.05), (1.3, 10, 0.9, 0.2),
                                                              (1.0, 0, 0.5, 0.5), (0.5, 3, 1.0, 1.0), (1.0, 0, 1.0, 0.0)])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_min_p_equals_transformers_min_p_warper(temperature, top_k, top_p, min_p, ties):
    logits = mixed_logits(16, 50, ties=ties)
    ours = warp_logits(logits, temperature, top_k, top_p, min_p)
    assert torch.equal(ours, hf_warped(logits.clone(), temperature, top_k, top_p, min_p))
    probs = ours.softmax(-1)
    kept = probs > 0
    assert (probs[kept] >= min_p * probs.amax(-1, keepdim=True).expand_as(probs)[kept]).all()
    if ties and min_p == 1.0:  # every token tied with the most likely one stays, and only those
        assert torch.equal(kept, logits == logits.amax(-1, keepdim=True))


def test_min_p_scales_its_threshold_with_the_most_likely_token():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    kept = lambda p: (~warp_logits(probs.log(), min_p=p).isinf()).int().tolist()  # noqa: E731
    assert kept(0.2) == [[1, 1, 1, 0], [1, 1, 1, 1]]  # 0.2 x 0.5 = 0.1 drops 0.05 only
    assert kept(0.5) == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert kept(1.0) == [[1, 0, 0, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize("penalty", [1.5, 0.7])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_repetition_penalty_equals_transformers_processor_on_left_padded_prompts(penalty, ties):
    """transformers' `generate` leaves a left-padded prompt's padding out of the penalty (it passes the
    pad counts as `prompt_ignore_length`), as vLLM, which never pads, does: so does lmrl."""
    ids, mask = left_padded_prompts()
    logits = mixed_logits(3, 12, ties=ties)
    theirs = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=(mask == 0).sum(1))(ids, logits.clone())
    seen = seen_tokens(ids, mask, 12)
    ours = penalize_repeats(logits, seen, penalty)
    assert torch.equal(ours, theirs)
    assert seen.tolist()[0][PAD] is False and seen.tolist()[1][PAD] is True  # a pad id counts only as a real token
    assert seen.sum(1).tolist() == [2, 3, 4]  # each token once, however often it occurs
    changed = ours != logits
    assert torch.equal(changed, seen & (logits != 0))  # only seen tokens move (a zero logit stays zero)
    assert ((ours < logits) == (penalty > 1))[changed].all()  # > 1 lowers them, < 1 raises them


@pytest.mark.parametrize("options", [dict(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
                                     dict(repetition_penalty=1.3), dict(temperature=1.5, min_p=0.02, repetition_penalty=0.8),
                                     dict(top_p=0.8, min_p=0.1)], ids=str)
def test_sampling_options_run_in_the_order_transformers_generate_builds(hf_model, options):
    """The repetition penalty is a processor, before the warpers; min-p comes after temperature, top-k
    and top-p (GenerationMixin._get_logits_processor of the installed transformers)."""
    ids, mask = left_padded_prompts()
    processors = generate_processors(hf_model, ids, mask, **options)
    order = [RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
             MinPLogitsWarper]
    assert [type(p) for p in processors] == [kind for kind, name in zip(order, ["repetition_penalty", "temperature",
                                                                                "top_k", "top_p", "min_p"])
                                             if name in options]
    for seed in range(4):
        logits = mixed_logits(3, 64, seed=seed)
        ours = Sampling(**options).warp(logits, seen_tokens(ids, mask, 64))
        assert torch.equal(ours, processors(ids, logits.clone()))


@pytest.mark.parametrize("bad, message", [(dict(min_p=1.5), "min_p must be in \\[0, 1\\], got 1.5"),
                                          (dict(min_p=-0.1), "min_p must be in"),
                                          (dict(repetition_penalty=0.0), "repetition_penalty must be > 0, got 0.0"),
                                          (dict(top_k=-1), "top_k must be >= 0"),
                                          (dict(top_p=float("nan")), "top_p must be in")])
def test_sampling_refuses_out_of_range_options(bad, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**bad)


def test_a_penalty_needs_the_seen_tokens():
    with pytest.raises(ValueError, match="repetition_penalty needs the tokens each row has seen"):
        Sampling(repetition_penalty=1.2).warp(torch.zeros(1, 4))
    assert torch.equal(Sampling().warp(torch.ones(1, 4)), torch.ones(1, 4))  # every option off: no mask needed


def gpt_reference(model, p, tokens, sampling: Sampling):
    """(B, N, V) warped logits of each step of the GPT's completion `tokens`, by transformers' own
    classes: the penalty over the prompt and the tokens drawn before, then the warpers."""
    logits = next_token_logits(model, p, tokens).float()
    steps = []
    for t in range(tokens.size(1)):
        step = RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)(torch.cat([p, tokens[:, :t]], 1),
                                                                             logits[:, t].clone())
        steps.append(hf_warped(step, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p))
    return torch.stack(steps, 1)


def test_the_built_in_gpt_samples_with_min_p_and_repetition_penalty_as_transformers_does():
    model, p = tiny_model(), prompts(batch=16)
    sampling = Sampling(temperature=0.8, top_k=12, min_p=0.1, repetition_penalty=1.8)
    tokens, logp = model.generate(p, 8, sampling=sampling, generator=torch.Generator().manual_seed(5))
    warped = gpt_reference(model, p, tokens, sampling)
    drawn = warped.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert not drawn.isinf().any(), "a token min-p or top-k rules out was drawn"
    assert torch.allclose(logp, drawn - warped.logsumexp(-1), atol=1e-5)


def test_repetition_penalty_makes_the_gpt_repeat_itself_less_and_min_p_narrows_its_choice():
    model, p = tiny_model(), prompts(batch=256)

    def repeats(**options):
        """The fraction of drawn tokens already in the row (prompt or completion), and the tokens' mean probability."""
        tokens, logp = model.generate(p, 8, generator=torch.Generator().manual_seed(0), **options)
        seq = torch.cat([p, tokens], 1)
        seen_before = [(seq[:, :p.size(1) + t] == seq[:, p.size(1) + t, None]).any(1) for t in range(8)]
        return torch.stack(seen_before, 1).float().mean().item(), logp.exp().mean().item()

    plain, plain_prob = repeats()
    penalized, _ = repeats(repetition_penalty=3.0)
    encouraged, _ = repeats(repetition_penalty=0.3)
    assert penalized < plain - 0.05 and encouraged > plain + 0.05, (penalized, plain, encouraged)
    _, narrowed_prob = repeats(min_p=0.3)
    assert narrowed_prob > plain_prob + 0.05  # mass moves to the tokens min-p keeps


def test_hf_generate_with_the_hf_engine_draws_what_transformers_own_options_draw(tiny_math):
    """HFPolicy.generation_engine="hf": `generate` with lmrl's recorder applying the options, and
    `generate` with transformers' own repetition penalty and warpers, from the same seed: the same
    tokens, on left-padded prompts; the recorded log-probs are those of that distribution."""
    from lmrl.models.hf import _seeded_from, load_hf_policy

    policy = load_hf_policy(str(tiny_math / "model"))[0]
    policy.generation_engine = "hf"
    ids, mask = policy.encode(["What is 1 + 2? What is 1 + 2?", "Hi", "Say hi hi hi"])
    assert (mask == 0).any()
    options = dict(temperature=0.9, top_k=20, top_p=0.95, min_p=0.05, repetition_penalty=1.4)
    completion, keep, logprobs = policy.generate_ids(ids, mask, 12, sampling=Sampling(**options),
                                                     generator=torch.Generator().manual_seed(0))
    pad, eos = policy.tokenizer.pad_token_id, policy.eos_token_ids
    with torch.no_grad(), _seeded_from(torch.Generator().manual_seed(0), ids.device):
        out = policy.hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=True,
                                       eos_token_id=eos, pad_token_id=pad, output_scores=True,
                                       return_dict_in_generate=True, **options)
    theirs = out.sequences[:, ids.size(1):]
    assert torch.equal(completion, theirs.masked_fill(~keep.bool(), pad))
    scores = torch.stack(out.scores, 1).float()  # (B, N, V): what each token was drawn from
    expected = torch.log_softmax(scores, -1).gather(-1, theirs[..., None]).squeeze(-1)
    assert torch.equal(logprobs[keep.bool()], expected[keep.bool()])  # the same floats: the same distribution


def test_every_option_off_builds_no_seen_token_mask(monkeypatch, tiny_math):
    import lmrl.generation.hf_generate as loop
    import lmrl.models.gpt as gpt
    from lmrl.models.hf import load_hf_policy

    built = []
    for module in (loop, gpt):
        monkeypatch.setattr(module, "seen_tokens", lambda *a, real=module.seen_tokens: built.append(1) or real(*a))
    policy = load_hf_policy(str(tiny_math / "model"))[0]
    ids, mask = policy.encode(["Hi", "What is 1 + 2?"])
    policy.generate_ids(ids, mask, 3, sampling=Sampling(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1))
    tiny_model().generate(prompts(), 3, min_p=0.1)
    policy.generate_ids(ids, mask, 3, repetition_penalty=1.2, greedy=True)  # greedy decoding ignores the options
    assert built == []
    policy.generate_ids(ids, mask, 3, repetition_penalty=1.2)
    tiny_model().generate(prompts(), 3, repetition_penalty=1.2)
    assert built == [1, 1]


# -- a task's rollout and the options ------------------------------------------------------------

def test_rollout_keywords_give_min_p_and_the_penalty_only_when_set():
    assert Sampling(top_p=0.9).rollout_keywords() == dict(temperature=1.0, top_k=0, top_p=0.9)
    assert Sampling(min_p=0.1, repetition_penalty=1.1).rollout_keywords() == dict(
        temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, repetition_penalty=1.1)

    def old(policy, ids, *, temperature=1.0, top_k=0, top_p=1.0, greedy=False, generator=None): ...
    def loose(policy, ids, **kwargs): ...
    assert options_not_taken(old, Sampling(top_p=0.5)) == []
    assert options_not_taken(old, Sampling(min_p=0.1, repetition_penalty=1.1)) == ["min_p", "repetition_penalty"]
    assert options_not_taken(loose, Sampling(min_p=0.1)) == []


class OlderTask:
    """A user's task whose rollout predates min_p and repetition_penalty (it wraps the built-in adder)
    and records the keywords each rollout gets."""

    def __init__(self, task):
        self.task, self.calls = task, []

    def __getattr__(self, name):
        return getattr(self.task, name)

    def rollout(self, policy, ids, *, temperature=1.0, top_k=0, top_p=1.0, greedy=False, generator=None):
        self.calls.append(dict(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy))
        return self.task.rollout(policy, ids, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                                 generator=generator)


def test_a_task_written_before_min_p_trains_and_is_refused_only_when_an_option_is_set(tiny_config):
    from lmrl.train.build import build_run

    cfg = tiny_config("sft.steps=0", "train.steps=1", "train.top_p=0.9")
    task = OlderTask(build_run(cfg, device="cpu").task)
    RLTrainer(cfg, task=task).train()
    assert {c["top_p"] for c in task.calls if not c["greedy"]} == {0.9}
    for option in ("train.min_p=0.1", "train.repetition_penalty=1.2"):
        with pytest.raises(ConfigError) as e:
            RLTrainer(tiny_config("sft.steps=0", option), task=task)
        name, value = option.removeprefix("train.").split("=")
        assert str(e.value) == (f"train.{name}={float(value)}: OlderTask.rollout takes no {name}= keyword; add it to "
                                f"the rollout's signature (and sample with it), or leave train.{name} at "
                                f"{dict(min_p=0.0, repetition_penalty=1.0)[name]} (off)")


def test_the_trainer_samples_its_rollouts_with_min_p_and_the_penalty(tiny_config, monkeypatch):
    """One RL step of the adder with both options set: the task's rollout gets them, and its GPT samples with them."""
    from lmrl.models.gpt import GPT

    got = []
    real = GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, *a, **kw: got.append(kw.get("sampling")) or real(self, *a, **kw))
    RLTrainer(tiny_config("sft.steps=0", "train.steps=1", "train.min_p=0.05", "train.repetition_penalty=1.3",
                          "train.temperature=0.9")).train()
    assert Sampling(temperature=0.9, min_p=0.05, repetition_penalty=1.3) in got


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
