"""The lean HF sampling loop (`lmrl.generation.hf_generate.generate`) on a tiny random Llama built here:
greedy decoding equals `model.generate`, recorded log-probs equal a full forward pass, completions
end at the first EOS, sampling follows the generator and respects top-k, with and without batch
compaction and for both cache kinds. No hub, no network."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from lmrl.generation.hf_generate import generate

PAD, VOCAB = 0, 64
LENGTHS = [5, 4, 9, 7, 4, 9]  # ragged prompts, left-padded to 9
VARIANTS = [dict(compact_at=None, share_prefix=False), dict(compact_at=None), dict(compact_at=0.0), dict(compact_at=0.5),
            dict(cache="static", compact_at=0.0), dict(cache="static", compact_at=0.0, share_prefix=False),
            # decode_graph's step (a GPU's CUDA graph, run eagerly)
            dict(cache="static", compact_at=None), dict(cache="static", compact_at=None, share_prefix=False),
            dict(cache="concat", compact_at=0.0)]  # transformers' own concatenating cache


pytestmark = pytest.mark.usefixtures("one_thread")


def peaked_llama() -> LlamaForCausalLM:
    """A 2-layer, 32-dim Llama, seeded, in eval mode. A larger init than the default makes the
    next-token distributions peaked, so argmax has no near-ties."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, pad_token_id=PAD,
        bos_token_id=1, eos_token_id=2)).eval()


@pytest.fixture(scope="module")
def model():
    return peaked_llama()


@pytest.fixture(scope="module")
def prompts():
    """Ragged prompts, left-padded, all starting with the same 3 tokens (as a chat template's start
    would), the last one a repeat of the third (as in a GRPO group)."""
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, VOCAB, (3,), generator=g)
    ids = torch.full((len(LENGTHS), max(LENGTHS)), PAD)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        ids[i, -n:] = torch.cat([prefix, torch.randint(3, VOCAB, (n,), generator=g)])[:n]
        mask[i, -n:] = 1
    ids[-1], mask[-1] = ids[2], mask[2]
    return ids, mask


def _hf_greedy(model, ids, mask, n, eos):
    with torch.no_grad():
        seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=PAD)
    return seq[:, ids.size(1):]


def _emitted_eos(model, ids, mask):
    """A token that greedy decoding emits in some rows early on, and the column where row 0 emits it:
    used as EOS, it ends rows at different steps."""
    out = _hf_greedy(model, ids, mask, 12, eos=VOCAB + 1)  # an id that cannot occur: no row ends
    for t in range(2, 12):
        tok = int(out[0, t])
        ended = (out[:, :10] == tok).any(1)
        if 0 < int(ended.sum()) < len(ended):
            return tok
    pytest.fail("no token ends some rows but not all")


def _recompute(model, ids, mask, completion, cmask, temperature=1.0, top_k=0, top_p=1.0):
    """(log-probs (B, N), masks (B, N, V) of the tokens top-k and top-p allow) of `completion` under one
    full forward pass, warped by transformers' own logits warpers."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    full = torch.cat([ids, completion], 1)
    fmask = torch.cat([mask, cmask.long()], 1)
    pos = (fmask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=fmask, position_ids=pos).logits
    logits = logits[:, ids.size(1) - 1:-1].float() / temperature
    B, N, V = logits.shape
    flat = logits.reshape(B * N, V)
    if top_k:
        flat = TopKLogitsWarper(top_k)(None, flat)
    if top_p < 1:
        flat = TopPLogitsWarper(top_p)(None, flat)
    logits = flat.reshape(B, N, V)
    logp = F.log_softmax(logits, -1).gather(-1, completion[..., None]).squeeze(-1)
    return logp.masked_fill(cmask == 0, 0.0), logits > float("-inf")


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_greedy_equals_hf_generate_on_ragged_left_padded_prompts(model, prompts, variant):
    ids, mask = prompts
    eos = _emitted_eos(model, ids, mask)
    ref = _hf_greedy(model, ids, mask, 12, eos)
    completion, cmask, logprobs = generate(model, ids, mask, 12, eos_token_ids=[eos], pad_token_id=PAD,
                                           greedy=True, **variant)
    assert completion.shape == ref.shape  # both stop at the same step
    assert torch.equal(completion, ref)  # HF pads after EOS too
    ended = (completion == eos).any(1)
    assert ended.any() and not ended.all()  # the EOS really ends some rows early
    # greedy reports temperature-1 log-probs
    assert torch.allclose(logprobs, _recompute(model, ids, mask, completion, cmask)[0], atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8),
                                                   (1.3, 5, 0.9)])
def test_logprobs_equal_a_full_forward_recomputation(model, prompts, variant, temperature, top_k, top_p):
    ids, mask = prompts
    kwargs = dict(pad_token_id=PAD, temperature=temperature, top_k=top_k, top_p=top_p)
    free = generate(model, ids, mask, 16, eos_token_ids=[VOCAB + 5], generator=torch.Generator().manual_seed(0),
                    **kwargs)[0]
    # EOS := tokens drawn early in rows 0 and 3: the same seed draws the same tokens until the first row ends
    # (compaction then changes what the generator's draws go to), so rows end at different steps
    eos = [int(free[0, 2]), int(free[3, 6])]
    completion, cmask, logprobs = generate(model, ids, mask, 16, eos_token_ids=eos,
                                           generator=torch.Generator().manual_seed(0), **kwargs, **variant)
    assert cmask.sum(1).lt(16).any()
    ref, allowed = _recompute(model, ids, mask, completion, cmask, temperature, top_k, top_p)
    assert torch.allclose(logprobs, ref, atol=1e-4), (logprobs - ref).abs().max()
    assert (logprobs[cmask == 0] == 0).all() and (logprobs[cmask == 1] < 0).all()
    # every real token lies in the top-k and the nucleus of its step
    allowed_token = allowed.gather(-1, completion[..., None]).squeeze(-1)
    assert allowed_token[cmask == 1].all()


def _recompute_processed(model, ids, mask, completion, cmask, penalty, **warpers):
    """(log-probs (B, N), masks (B, N, V) of the tokens allowed) of `completion` under one full forward
    pass, each step processed as `generate(do_sample=True, repetition_penalty=penalty, **warpers)`
    processes it, with transformers' own classes: the penalty over the prompt's real tokens (its
    padding left out, as `generate` does) and the tokens drawn before, then the warpers in its order."""
    from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

    full = torch.cat([ids, completion], 1)
    fmask = torch.cat([mask, cmask.long()], 1)
    pos = (fmask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=fmask, position_ids=pos).logits[:, ids.size(1) - 1:-1].float()
    penalize = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=(mask == 0).sum(1))
    steps = []
    for t in range(completion.size(1)):
        step = penalize(full[:, :ids.size(1) + t], logits[:, t].clone())
        step = TemperatureLogitsWarper(warpers["temperature"])(None, step)
        step = TopKLogitsWarper(warpers["top_k"])(None, step)
        steps.append(MinPLogitsWarper(warpers["min_p"])(None, step))
    logits = torch.stack(steps, 1)
    logp = F.log_softmax(logits, -1).gather(-1, completion[..., None]).squeeze(-1)
    return logp.masked_fill(cmask == 0, 0.0), logits > float("-inf")


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("penalty", [1.6, 0.6])
def test_repetition_penalty_and_min_p_logprobs_equal_transformers_processors(model, prompts, variant, penalty):
    """The penalty's (b, V) seen-token mask follows the running batch through compaction, and the static
    cache's step (a GPU's CUDA graph, run eagerly here) returns the logits the options then warp."""
    ids, mask = prompts
    kwargs = dict(pad_token_id=PAD, temperature=0.9, top_k=20, min_p=0.05, repetition_penalty=penalty)
    free = generate(model, ids, mask, 16, eos_token_ids=[VOCAB + 5], generator=torch.Generator().manual_seed(0),
                    **kwargs)[0]
    eos = [int(free[0, 2]), int(free[3, 6])]  # rows end at different steps, as above
    completion, cmask, logprobs = generate(model, ids, mask, 16, eos_token_ids=eos,
                                           generator=torch.Generator().manual_seed(0), **kwargs, **variant)
    assert cmask.sum(1).lt(16).any()
    ref, allowed = _recompute_processed(model, ids, mask, completion, cmask, penalty, temperature=0.9, top_k=20,
                                        min_p=0.05)
    assert torch.allclose(logprobs, ref, atol=1e-4), (logprobs - ref).abs().max()
    assert allowed.gather(-1, completion[..., None]).squeeze(-1)[cmask == 1].all()


def test_the_repetition_penalty_changes_what_the_loop_samples(model, prompts):
    """Over many draws, a penalty above 1 makes tokens already in the row rarer, below 1 commoner."""
    ids, mask = prompts
    ids, mask = ids.repeat(8, 1), mask.repeat(8, 1)

    def repeat_rate(penalty):
        completion = generate(model, ids, mask, 10, eos_token_ids=[VOCAB + 5], pad_token_id=PAD,
                              repetition_penalty=penalty, generator=torch.Generator().manual_seed(0))[0]
        seq = torch.cat([ids.masked_fill(mask == 0, -1), completion], 1)
        P = ids.size(1)
        return torch.stack([(seq[:, :P + t] == seq[:, P + t, None]).any(1) for t in range(10)], 1).float().mean()

    assert repeat_rate(3.0) < repeat_rate(1.0) - 0.05 < repeat_rate(0.3) - 0.1


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_completion_is_masked_and_padded_after_the_first_eos(model, prompts, variant):
    ids, mask = prompts
    eos = _emitted_eos(model, ids, mask)
    completion, cmask, logprobs = generate(model, ids, mask, 10, eos_token_ids=[VOCAB + 5, eos], pad_token_id=PAD,
                                           greedy=True, **variant)
    assert completion.dtype == torch.long and cmask.dtype == torch.float32 and logprobs.dtype == torch.float32
    for row, m in zip(completion, cmask):
        hits = (row == eos).nonzero()
        end = int(hits[0]) + 1 if len(hits) else row.numel()
        assert m[:end].eq(1).all() and m[end:].eq(0).all()
        assert row[end:].eq(PAD).all()
    assert (logprobs[cmask == 0] == 0).all()
    # the outputs are ordinary tensors: they can be fed to a training forward
    assert not completion.is_inference() and not logprobs.is_inference()


def test_generation_stops_once_every_row_has_ended(model, prompts):
    ids, mask = prompts
    first = generate(model, ids, mask, 3, eos_token_ids=[VOCAB + 5], pad_token_id=PAD, greedy=True)[0]
    eos = sorted({int(t) for t in first[:, 0]})  # every row's first token ends it
    completion, cmask, _ = generate(model, ids, mask, 8, eos_token_ids=eos, pad_token_id=PAD, greedy=True)
    assert completion.shape == (len(LENGTHS), 1) and cmask.eq(1).all()


@pytest.mark.parametrize("variant", VARIANTS[:3], ids=str)
def test_sampling_follows_the_generator(model, prompts, variant):
    ids, mask = prompts
    eos = _emitted_eos(model, ids, mask)

    def sample(seed):
        return generate(model, ids, mask, 12, eos_token_ids=[eos], pad_token_id=PAD, top_k=8,
                        generator=torch.Generator().manual_seed(seed), **variant)

    a, b, c = sample(3), sample(3), sample(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert a[0].shape != c[0].shape or not torch.equal(a[0], c[0])


def test_samples_do_not_depend_on_compaction_prefix_sharing_or_cache(model, prompts):
    """Each row draws from its own uniform each step, whatever else runs beside it."""
    ids, mask = prompts
    eos = _emitted_eos(model, ids, mask)
    runs = [generate(model, ids, mask, 12, eos_token_ids=[eos], pad_token_id=PAD, temperature=0.8,
                     generator=torch.Generator().manual_seed(5), **variant) for variant in VARIANTS]
    for run in runs[1:]:
        assert torch.equal(run[0], runs[0][0]) and torch.allclose(run[2], runs[0][2], atol=1e-5)
    assert (runs[0][1].sum(1) < 12).any()  # some rows ended early: compaction happened


def test_common_prefix_and_repeated_prompts_share_one_prefill(model, prompts):
    """Counts the tokens each forward call runs: shared, the 3-token prefix runs once and the repeated prompt not at all."""
    ids, mask = prompts
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        generate(model, ids, mask, 1, eos_token_ids=[2], pad_token_id=PAD, greedy=True)
    finally:
        hook.remove()
    assert seen == [(1, 3), (len(LENGTHS) - 1, max(LENGTHS) - 3)]


def test_peft_wrapped_model_generates_like_its_base(model, prompts):
    peft = pytest.importorskip("peft")
    import copy

    wrapped = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    wrapped.eval()
    ids, mask = prompts
    kwargs = dict(eos_token_ids=[2], pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    base = generate(model, ids, mask, 8, **kwargs)
    kwargs["generator"] = torch.Generator().manual_seed(0)
    lora = generate(wrapped, ids, mask, 8, **kwargs)  # LoRA's B starts at zero: the same model
    assert torch.equal(base[0], lora[0]) and torch.allclose(base[2], lora[2], atol=1e-5)


def test_bad_arguments_are_refused(model, prompts):
    ids, mask = prompts
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, ids, mask, 0, eos_token_ids=[2], pad_token_id=PAD)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, ids, mask, 4, eos_token_ids=[2], pad_token_id=PAD, temperature=0.0)
    with pytest.raises(ValueError, match="cache"):
        generate(model, ids, mask, 4, eos_token_ids=[2], pad_token_id=PAD, cache="paged")


# ------------------------------------------------------------------- the learner's shared-prompt forward

def tiny_lora_policy(tmp_path):
    """A tiny Llama HFPolicy with LoRA on every linear layer, B given values (it starts at 0) so
    that A gets gradients too."""
    from lmrl.models.hf import load_hf_policy
    from lmrl.models.lora import add_lora
    from tests.test_hf import save_tiny_llama

    save_tiny_llama(tmp_path / "m", max_positions=128)
    torch.manual_seed(0)
    policy = add_lora(load_hf_policy(str(tmp_path / "m"))[0], r=4, alpha=8, target_modules="all-linear")
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return policy


def test_learner_forward_with_shared_prompts_equals_one_full_pass_in_logits_and_gradients(tmp_path):
    """GRPO-like batch: 2 distinct left-padded prompts x 3 samples each. Running each distinct prompt
    once and expanding its KV cache must give the logits and LoRA gradients of the plain pass."""
    from lmrl.algos.base import policy_forward

    policy = tiny_lora_policy(tmp_path)
    ids, mask = policy.encode(["2 plus 3", "what is 12 plus 30 then"])
    ids, mask = ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
    completions = torch.randint(4, 90, (6, 5), generator=torch.Generator().manual_seed(0))
    seq, attn = torch.cat([ids, completions], 1), torch.cat([mask, torch.ones_like(completions)], 1)

    def run(share):
        policy.share_prompts = share
        policy.zero_grad()
        logp, _, _ = policy_forward(policy, seq, 5, 1.0, attn)
        (logp * torch.arange(1.0, 31.0).view(6, 5)).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    plain_logp, plain_grads = run(False)
    taken, inner = [], policy._forward_shared_prompts
    policy._forward_shared_prompts = lambda *a: taken.append(inner(*a)) or taken[-1]
    shared_logp, shared_grads = run(True)
    assert taken and taken[0] is not None  # the shared path ran
    torch.testing.assert_close(shared_logp, plain_logp, atol=1e-5, rtol=1e-5)
    for name, g in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)
    assert any(g.abs().sum() > 0 for n, g in plain_grads.items() if "lora_A" in n)


def test_learner_forward_runs_the_prompts_common_start_once_then_each_distinct_prompt_once(tmp_path):
    """GRPO batch whose 3 distinct prompts (left-padded, of 3 lengths) open with the same 6 tokens (a
    chat template's system turn), 2 samples each: the start runs for one row, the prompts' rest once
    per distinct prompt, the completions for every row; logits and LoRA gradients equal the plain pass."""
    from lmrl.algos.base import policy_forward
    from lmrl.generation.agent import left_pad

    policy = tiny_lora_policy(tmp_path)
    gen = torch.Generator().manual_seed(2)
    start = torch.randint(4, 90, (6,), generator=gen).tolist()
    rows = [start + torch.randint(4, 90, (k,), generator=gen).tolist() for k in (3, 7, 5)]
    ids, mask = left_pad(rows, 0, "cpu")
    ids, mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)
    completions = torch.randint(4, 90, (6, 4), generator=gen)
    done = torch.tensor([[1] * 4, [1] * 2 + [0] * 2] * 3)
    seq, attn = torch.cat([ids, completions], 1), torch.cat([mask, done], 1)
    seen = []
    embed = policy.hf_model.model.embed_tokens
    hook = embed.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))

    def run(share):
        policy.share_prompts = share
        policy.zero_grad()
        seen.clear()
        logp, _, _ = policy_forward(policy, seq, 4, 1.0, attn)
        (logp * done * torch.arange(1.0, 25.0).view(6, 4)).sum().backward()
        return logp.detach() * done, {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    try:
        plain_logp, plain_grads = run(False)
        assert seen == [(6, 13 + 3)]
        shared_logp, shared_grads = run(True)
        # the inputs are a row's first 16 tokens, the logits those of the last 4 (the prompt's last token and
        # 3 completion tokens): the start runs once, the 3 prompts' next 6 columns once each, then the 4 per row
        assert seen == [(1, 6), (3, 6), (6, 4)]
    finally:
        hook.remove()
    torch.testing.assert_close(shared_logp, plain_logp, atol=1e-5, rtol=1e-5)
    for name, g in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)
    assert any(g.abs().sum() > 0 for n, g in plain_grads.items() if "lora_A" in n)


def test_rows_with_distinct_heads_share_their_common_start_with_the_logits_and_gradients_of_one_full_pass(tmp_path):
    """Rows that open with the same 20 tokens (a system prompt) and then differ: SFT conversations
    (right-padded) and RL rows (prompts left-padded, completions right-padded). The common start
    runs once; logits and LoRA gradients equal the plain pass."""
    from lmrl.models.hf import MIN_SHARED_PREFIX
    from lmrl.generation.agent import left_pad
    from lmrl.tasks.text_batches import model_logits, pad_sequences

    policy = tiny_lora_policy(tmp_path)
    gen = torch.Generator().manual_seed(1)
    start = torch.randint(4, 90, (20,), generator=gen).tolist()
    assert len(start) >= MIN_SHARED_PREFIX
    rows = [start + torch.randint(4, 90, (n,), generator=gen).tolist() for n in (9, 14, 6)]
    sft_ids, sft_attn, _ = pad_sequences(rows, [[1] * len(r) for r in rows])
    prompt_ids, prompt_attn = left_pad(rows, 0, "cpu")
    completions = torch.randint(4, 90, (3, 9), generator=gen)
    done = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [1] * 7 + [0] * 2])  # right padding after each completion
    rl_ids, rl_attn = torch.cat([prompt_ids, completions], 1), torch.cat([prompt_attn, done], 1)
    taken, inner = [], policy._forward_common_start
    policy._forward_common_start = lambda *a: taken.append(inner(*a)) or taken[-1]

    def run(ids, attn, keep, share):
        policy.share_prompts = share
        policy.zero_grad()
        logits = model_logits(policy, ids, attn, keep=keep)
        (logits.log_softmax(-1)[..., 7] * attn[:, -keep:]).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    for ids, attn, keep in ((sft_ids, sft_attn, sft_ids.size(1) - 22), (rl_ids, rl_attn, 10)):
        plain, plain_grads = run(ids, attn, keep, False)
        taken.clear()
        shared, shared_grads = run(ids, attn, keep, True)
        assert len(taken) == 1 and taken[0] is not None  # the common start was shared
        torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
        for name, g in plain_grads.items():
            torch.testing.assert_close(shared_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)
    # rows without a common start of MIN_SHARED_PREFIX tokens: the plain pass runs
    taken.clear()
    other, other_attn = left_pad([r[5:] for r in rows], 0, "cpu")
    model_logits(policy, other, other_attn, keep=3)
    assert taken == [None]


def test_non_finite_weights_are_one_error_not_garbage_tokens(model, prompts):
    # NaN logits sample silently (the CDF inversion picks some token); the trainer needs to hear of it (issue 45)
    import copy

    from lmrl.common.errors import NonFiniteOutputs

    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    ids, mask = prompts
    with pytest.raises(NonFiniteOutputs, match="the next-token probabilities hold NaN or inf"):
        generate(broken, ids, mask, 4, eos_token_ids=2, pad_token_id=PAD, generator=torch.Generator().manual_seed(0))


def test_a_static_cache_without_compaction_decodes_through_the_fixed_buffer_step(model, prompts, monkeypatch):
    """cache="static" with compaction off is the GPU's CUDA-graph path run eagerly (decode_graph): every
    decode step goes through `StaticDecodeStep`, whose mask buffer spans the whole cache."""
    from lmrl.generation import decode_graph

    ids, mask = prompts
    calls, widths = [], []
    step = decode_graph.StaticDecodeStep.__call__

    def spy(self, tokens, positions):
        calls.append(self.column)
        widths.append(self.mask.size(1))
        return step(self, tokens, positions)

    monkeypatch.setattr(decode_graph.StaticDecodeStep, "__call__", spy)
    completion = generate(model, ids, mask, 10, eos_token_ids=[VOCAB + 1], pad_token_id=PAD, greedy=True,
                          cache="static", compact_at=None)[0]
    assert completion.shape == (len(LENGTHS), 10)
    assert len(calls) == 9 and calls == list(range(calls[0], calls[0] + 9))  # one new cache column a step
    assert set(widths) == {ids.size(1) + 10}
    assert torch.equal(completion, _hf_greedy(model, ids, mask, 10, [VOCAB + 1]))


def test_the_fixed_buffer_step_refuses_a_cache_with_no_room_and_captures_nothing_on_a_cpu(model):
    from lmrl.generation.decode_graph import StaticDecodeStep

    with pytest.raises(ValueError, match="the cache has 4 positions and the prefill fills 4"):
        StaticDecodeStep(model, None, torch.ones(2, 4, dtype=torch.long), 4, graph=True)
    step = StaticDecodeStep(model, None, torch.ones(2, 3, dtype=torch.long), 4, graph=True)
    assert step._capture is False and step.graph is None


def test_only_a_cache_of_plain_static_layers_is_graphable(model):
    """A sliding-window layer keeps its write position in Python, which a CUDA graph would freeze."""
    from transformers import MistralConfig, MistralForCausalLM

    from lmrl.generation.decode_graph import graphable
    from lmrl.generation.kv_cache import new_cache

    assert graphable(new_cache(model, "static", 32))
    assert not graphable(new_cache(model, "dynamic", 32))
    windowed = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                sliding_window=8))
    assert not graphable(new_cache(windowed, "static", 32))
