"""The built-in GPT: the KV cache changes speed, never results; generate's log-probs are those of
the distribution it drew from; top-k; attention and dropout against their definitions; the position
limit, weight tying, checkpoints, tokenizer."""

import pytest
import torch
import torch.nn.functional as F

from lmrl.models.gpt import GPT, CharTokenizer, GPTConfig, attend, dropout, sequence_logprobs

VOCAB, N_POSITION = 12, 16


def tiny_model(seed: int = 0) -> GPT:
    """2 layers, 2 heads, 32 dims, random weights scaled up from GPT-2's std 0.02 so that the next
    token depends strongly on content and position: a cache that mixes up positions or drops
    context then changes which tokens are drawn, instead of hiding in a near-uniform distribution."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_position=N_POSITION, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.mul_(25.0)
    return model.eval()


def prompts(batch: int = 5, length: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    # torch.testing.assert_close would do, but its first call spends ~1 s importing
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = (actual - expected).abs().max().item()
    assert diff <= atol, f"max abs difference {diff:.3g} > {atol}"


def next_token_logits(model: GPT, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (B, N, V) that predicted each generated token, recomputed on the full sequence."""
    full = torch.cat([prompt, tokens], dim=1)
    with torch.no_grad():
        return model(full[:, :-1])[:, -tokens.size(1):]


# -- the KV cache ----------------------------------------------------------------------------------
def test_greedy_with_cache_matches_recomputing_the_prefix_token_for_token():
    model, p = tiny_model(), prompts()
    cached, cached_logp = model.generate(p, 8, greedy=True, use_cache=True)
    uncached, uncached_logp = model.generate(p, 8, greedy=True, use_cache=False)
    assert cached.shape == (5, 8)
    assert torch.equal(cached, uncached)
    assert_close(cached_logp, uncached_logp)
    assert len({tuple(row) for row in cached.tolist()}) > 1, "prompts should lead to different completions"


def test_sampling_with_cache_draws_the_same_tokens_as_without_given_the_same_generator():
    model, p = tiny_model(), prompts()
    cached, cached_logp = model.generate(p, 8, use_cache=True, generator=torch.Generator().manual_seed(7))
    uncached, uncached_logp = model.generate(p, 8, use_cache=False, generator=torch.Generator().manual_seed(7))
    assert torch.equal(cached, uncached)
    assert_close(cached_logp, uncached_logp)


def test_same_seeded_generator_reproduces_samples_and_another_seed_does_not():
    model, p = tiny_model(), prompts()
    a, _ = model.generate(p, 8, generator=torch.Generator().manual_seed(7))
    b, _ = model.generate(p, 8, generator=torch.Generator().manual_seed(7))
    c, _ = model.generate(p, 8, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


# -- log-probs -------------------------------------------------------------------------------------
def test_generate_logprobs_at_temperature_1_equal_sequence_logprobs_of_the_full_sequence():
    model, p = tiny_model(), prompts()
    tokens, logp = model.generate(p, 8, temperature=1.0, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, _ = sequence_logprobs(model, torch.cat([p, tokens], dim=1), n_completion=8)
    assert_close(logp, expected)


def test_greedy_logprobs_are_those_of_the_temperature_1_distribution():
    model, p = tiny_model(), prompts()
    tokens, logp = model.generate(p, 8, greedy=True, temperature=0.5)  # greedy ignores temperature
    with torch.no_grad():
        expected, _ = sequence_logprobs(model, torch.cat([p, tokens], dim=1), n_completion=8)
    assert_close(logp, expected)


def test_generate_logprobs_at_temperature_half_are_log_softmax_of_logits_over_half():
    model, p = tiny_model(), prompts()
    tokens, logp = model.generate(p, 8, temperature=0.5, generator=torch.Generator().manual_seed(3))
    scaled = F.log_softmax(next_token_logits(model, p, tokens) / 0.5, dim=-1)
    assert_close(logp, scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
    with torch.no_grad():
        unscaled, _ = sequence_logprobs(model, torch.cat([p, tokens], dim=1), n_completion=8)
    assert not torch.allclose(logp, unscaled, atol=1e-3), "temperature must change the reported log-probs"
    with torch.no_grad():
        rescored, _ = sequence_logprobs(model, torch.cat([p, tokens], dim=1), n_completion=8, temperature=0.5)
    assert_close(logp, rescored)  # the trainer scores samples under the distribution they came from


# -- top-k -----------------------------------------------------------------------------------------
def test_top_k_1_sampling_equals_greedy():
    model, p = tiny_model(), prompts()
    greedy, _ = model.generate(p, 8, greedy=True)
    top1, top1_logp = model.generate(p, 8, top_k=1, generator=torch.Generator().manual_seed(5))
    assert torch.equal(top1, greedy)
    assert torch.all(top1_logp == 0.0), "the only token left after top-1 has probability 1"


def test_top_k_never_draws_outside_the_k_most_likely_and_renormalises_over_them():
    k = 3
    model, p = tiny_model(), prompts(batch=16)
    tokens, logp = model.generate(p, 8, top_k=k, generator=torch.Generator().manual_seed(5))
    logits = next_token_logits(model, p, tokens)  # (B, N, V)
    top_logits, top_ids = logits.topk(k, dim=-1)
    assert (top_ids == tokens.unsqueeze(-1)).any(-1).all(), "a token outside the top-k was drawn"
    drawn = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert_close(logp, drawn - top_logits.logsumexp(-1))
    rank = (logits > drawn.unsqueeze(-1)).sum(-1)  # 0 for the most likely token
    assert set(rank.unique().tolist()) == set(range(k)), "sampling should reach every one of the top k"


# -- attention ---------------------------------------------------------------------------------------
def attention_by_hand(q, k, v):
    """softmax(q kᵀ / √d) v in float64, query i (of Q) at position L - Q + i seeing keys 0..L-Q+i."""
    q, k, v = (t.double() for t in (q, k, v))
    Q, L = q.size(-2), k.size(-2)
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    later = torch.arange(L)[None, :] > torch.arange(L - Q, L)[:, None]
    return scores.masked_fill(later, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 0.03)])
@pytest.mark.parametrize("Q, L", [(6, 6), (2, 6), (1, 6)])
def test_attend_is_causal_attention_for_queries_at_the_last_positions(Q, L, dtype, atol):
    g = torch.Generator().manual_seed(Q)
    q, k, v = (torch.randn(3, 2, n, 8, generator=g).to(dtype).requires_grad_() for n in (Q, L, L))
    got = attend(q, k, v)
    expected = attention_by_hand(q, k, v)
    assert got.dtype == dtype
    assert_close(got.double(), expected, atol=atol)
    w = torch.randn(got.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((got.double() * w).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * w).sum(), (q, k, v))
    for a, b in zip(grads, expected_grads):
        assert_close(a.double(), b.double(), atol=atol * 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attend_dropout_zeroes_attention_weights_and_scales_up_the_rest(dtype):
    L, p = 6, 0.25
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(64, 4, L, L, generator=g).to(dtype) for _ in range(2))
    v = torch.eye(L, dtype=dtype).expand(64, 4, L, L)  # the output is then the attention weights themselves
    weights = attend(q, k, v).float()
    torch.manual_seed(1)
    dropped = attend(q, k, v, dropout_p=p).float()
    seen = weights > 0
    kept = dropped[seen] != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.02
    rel = 0.02 if dtype == torch.bfloat16 else 1e-5
    assert_close(dropped[seen][kept] / (weights[seen][kept] / (1 - p)), torch.ones(int(kept.sum())), atol=rel)
    assert (dropped[~seen] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_each_element_independently_with_probability_1_minus_p_scaled_by_its_inverse(dtype):
    x = torch.full((400, 1000), 2.0, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, 0.25)
    kept = y != 0
    assert y.dtype == dtype and abs(kept.float().mean().item() - 0.75) < 0.005
    assert torch.allclose(y[kept].float(), torch.tensor(2.0 / 0.75), rtol=0.01)  # bf16: 2/0.75 to 8 bits
    both = (kept[:, :-1] & kept[:, 1:]).float().mean().item()  # neighbours, often cut from one random word
    assert abs(both - 0.75**2) < 0.005
    (grad,) = torch.autograd.grad(y.float().sum(), x)
    assert torch.equal(grad != 0, kept) and torch.allclose(grad[kept].float(), torch.tensor(1 / 0.75), rtol=0.01)
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.25), y)  # the global seed decides the mask, so runs reproduce and resume
    assert not torch.equal(dropout(x, 0.25), y)
    assert dropout(x, 0.0) is x


# -- shape limits, weights, checkpoints ------------------------------------------------------------
@pytest.mark.parametrize("keep", [1, 3, 7])
def test_logits_to_keep_runs_the_last_block_on_those_positions_with_the_full_passs_logits_and_gradients(keep):
    ids = prompts(batch=4, length=8, seed=3)
    full, trimmed = tiny_model().train(), tiny_model().train()
    expected = full(ids)[:, -keep:]
    got = trimmed(ids, logits_to_keep=keep)
    assert_close(got, expected, atol=1e-4)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(0))
    (expected * weights).sum().backward()
    (got * weights).sum().backward()
    for (name, a), b in zip(full.named_parameters(), trimmed.parameters()):
        scale = a.grad.abs().max().item()
        assert scale > 0, name  # every weight, prompt positions' keys and values included, gets a gradient
        assert_close(b.grad / scale, a.grad / scale, atol=1e-5)


def test_the_trimmed_last_block_sees_only_earlier_positions():
    model, ids = tiny_model(), prompts(batch=2, length=8, seed=4)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB  # the last token may only change the last position's logits
    with torch.no_grad():
        a, b = model(ids, logits_to_keep=3), model(changed, logits_to_keep=3)
    assert_close(a[:, :2], b[:, :2], atol=1e-6)
    assert (a[:, 2] - b[:, 2]).abs().max() > 1e-3


def test_forward_rejects_sequences_longer_than_n_position():
    model = tiny_model()
    model(torch.zeros(2, N_POSITION, dtype=torch.long))  # exactly n_position fits
    with pytest.raises(ValueError, match="n_position"):
        model(torch.zeros(2, N_POSITION + 1, dtype=torch.long))


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_rejects_prompt_plus_completion_longer_than_n_position(use_cache):
    model, p = tiny_model(), prompts(length=N_POSITION - 3)
    model.generate(p, 3, greedy=True, use_cache=use_cache)  # fills n_position exactly
    with pytest.raises(ValueError, match="n_position"):
        model.generate(p, 5, greedy=True, use_cache=use_cache)


def test_lm_head_is_tied_to_the_token_embedding():
    model = tiny_model()
    assert model.lm_head.weight is model.wte.weight


def test_save_pretrained_then_from_pretrained_gives_identical_logits(tmp_path):
    model, tok = tiny_model(), CharTokenizer("0123456789+=")
    model.save_pretrained(tmp_path / "ckpt", tokenizer=tok)
    loaded = GPT.from_pretrained(tmp_path / "ckpt").eval()
    assert loaded.config == model.config
    assert loaded.lm_head.weight is loaded.wte.weight
    x = prompts(length=8)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert CharTokenizer.load(tmp_path / "ckpt" / "tokenizer.json").chars == tok.chars


# -- the tokenizer ---------------------------------------------------------------------------------
def test_char_tokenizer_encode_decode_round_trip():
    tok = CharTokenizer("0123456789+=")
    ids = tok.encode("012+345=7530")
    assert ids[:4] == [0, 1, 2, 10] and tok.vocab_size == 12
    assert tok.decode(ids) == "012+345=7530"
    assert tok.decode(torch.tensor(ids)) == "012+345=7530"


def test_char_tokenizer_unknown_character_error_names_it():
    with pytest.raises(ValueError, match="'x'"):
        CharTokenizer("0123456789+=").encode("12x3")


def test_char_tokenizer_rejects_repeated_alphabet():
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("01231")


def test_disable_dropout_makes_the_training_pass_that_of_eval_mode():
    from lmrl.models import disable_dropout

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_position=N_POSITION, n_layer=2, n_head=2, n_embd=32, dropout=0.5))
    x = prompts(length=8)
    model.eval()
    with torch.no_grad():
        expected = model(x)
        model.train()
        assert (model(x) - expected).abs().max() > 1e-2  # dropout (attention's included) is on
        disable_dropout(model)
        assert model.training
        assert_close(model(x), expected)
