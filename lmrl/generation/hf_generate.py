"""A lean sampling loop for Hugging Face causal LMs, for RL rollouts.

`generate` does what `model.generate(do_sample=...)` plus a log-prob recording logits processor does
(see `lmrl.models.hf.HFPolicy.generate_text`), with less work per token (benchmarks/hf_rollout.py
times it; docs/results.md has the figures). What it does differently:

* **Prefill**: prompts are mostly one chat template around a question, and RL batches repeat each
  prompt (GRPO groups). The prompt prefix common to the whole batch is run once, for one row, and
  identical prompts once each; the cache is then expanded to every row.
  The remaining suffixes are laid out after the shared prefix ([prefix | pads | suffix] in the
  cache), which the 2-D attention mask and explicit `position_ids` make equivalent to left padding.
* **Finished rows** (`generate` keeps computing every row until the last one ends): once enough rows
  of the running batch have emitted an EOS, they are dropped from the batch, its KV cache and mask
  (*batch compaction*). Dropping rows copies the cache, so it is batched: see `compact_at`.
* **Sampling** (in place of `torch.multinomial` over a (B, V) distribution): a token is drawn by
  inverting the CDF at one uniform per row. The uniforms come from the caller's `torch.Generator`,
  B per step whatever rows are still running, so a seed gives the same samples with or without
  compaction or prefix sharing (up to float rounding of the CDF). The CDF is built from
  unnormalised probabilities and only the drawn token's log-prob is normalised.
* **Linear layers** (most of a decode step's time on a CPU, the output layer above all) run from
  weights prepacked for oneDNN once per call (`lmrl.generation.packed_linear`; a no-op on a GPU). A
  LoRA policy's adapted layers run from their merged weights there, without the adapters' own products.
* **KV cache** (transformers' `DynamicCache` grows by concatenation: every decode step copies every
  layer's whole cache): the loop's cache writes each step's keys and values in place into buffers
  sized for the rollout (`lmrl.generation.kv_cache`).
* **Under CPU autocast** (`run.mixed_precision=bf16`) the packed layers run in bf16 and everything
  else (attention included: the CPU flash-attention kernel is slow in bf16) in fp32 with autocast off.
* **On a GPU** a decode step is bound by launching its kernels, so it runs over a static KV cache
  from fixed input buffers and is replayed as one CUDA graph (`lmrl.generation.decode_graph`),
  without compaction (a LoRA policy's adapters stay unmerged: in the graph they cost GPU time only).
* The model's forward is called directly with a transformers KV cache (prefill computes logits for
  the last position only); none of `generate`'s per-step machinery (input preparation, processor
  and stopping-criteria lists, output classes) runs. The sampling options (`Sampling`) are applied
  once per step; with a repetition penalty each row's seen tokens are kept as a (B, V) bool mask,
  built from the prompt once and updated with each step's draw (none is built without one).

The model runs under `torch.inference_mode()`; the returned tensors are ordinary tensors (made
outside inference mode), so they can be fed to a training forward. Put the model in eval mode first
(dropout), as `generate` would. Greedy decoding equals `model.generate(do_sample=False)` token for
token up to float rounding (matmuls over another batch shape can change a logit's last bits, so a
near-tie could in principle break the other way).
"""

from __future__ import annotations

import contextlib
import math

import torch

from ..common.errors import NonFiniteOutputs
from .decode_graph import StaticDecodeStep, graphable
from .kv_cache import new_cache, with_cache  # without transformers: an ImportError naming the `hf` extra
from .packed_linear import packed_linears, packing_available
from .sampling import Sampling, mark_seen, seen_tokens


def _positions(mask: torch.Tensor, start=0) -> torch.Tensor:
    """Position of each real token of left-padded rows, counted from `start` (pads get `start`)."""
    return (mask.cumsum(-1) - 1).clamp(min=0) + start


def prefill(model, past, ids: torch.Tensor, mask: torch.Tensor, share: bool):
    """Runs the left-padded prompts through `model` into the empty cache `past`. Returns the
    last-token logits (B, V) and the 2-D attention mask (B, K) that describes the cache's K columns.
    With `share`, identical prompts run once and the prefix common to all prompts runs once.
    Autograd flows through it (the learner's shared-prompt pass, `HFPolicy._forward_shared_prompts`)."""
    if not share or bool((mask[:, 1:] < mask[:, :-1]).any()):  # not left-padded: nothing to share
        out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), **with_cache(model, past),
                    use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], mask
    # Identical prompts (pads marked -1: a pad id may also be a real token) run once each.
    _, first, inverse = unique_rows(ids.masked_fill(mask == 0, -1))
    ids, mask = ids[first], mask[first]
    (u, P), lengths = ids.shape, mask.sum(-1)
    # c: length of the prefix common to every prompt, leaving each at least one token to run after it
    span = int(lengths.min()) - 1
    aligned = ids.gather(1, (P - lengths)[:, None] + torch.arange(max(span, 0), device=ids.device))
    c = int((aligned == aligned[:1]).all(0).long().cumprod(0).sum())
    if c == 0:
        out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), **with_cache(model, past),
                    use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
    else:
        model(input_ids=aligned[:1, :c], attention_mask=mask.new_ones(1, c),
              position_ids=torch.arange(c, device=ids.device)[None], **with_cache(model, past), use_cache=True,
              logits_to_keep=1)
        past.reorder_cache(torch.zeros(u, dtype=torch.long, device=ids.device))  # one row -> u rows
        # The suffixes: each row's last (length - c) tokens, left-padded into the last S columns;
        # cache columns: [c shared | S suffix], the suffix's leading non-tokens masked off.
        S = int(lengths.max()) - c
        suffix_mask = (torch.arange(S, device=ids.device) >= S - (lengths[:, None] - c)).long()
        mask = torch.cat([mask.new_ones(u, c), suffix_mask], 1)
        out = model(input_ids=ids[:, P - S:], attention_mask=mask, position_ids=_positions(suffix_mask, c),
                    **with_cache(model, past), use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
    if u < inverse.numel():
        past.reorder_cache(inverse)  # index_select on the batch dim: back to one row per prompt
    return logits[inverse], mask[inverse]


def unique_rows(x: torch.Tensor):
    """(unique rows, index of each one's first occurrence, inverse: row i of x = unique row inverse[i])."""
    uniq, inverse = torch.unique(x, dim=0, return_inverse=True)
    first = torch.full((uniq.size(0),), x.size(0), dtype=torch.long, device=x.device)
    first.scatter_reduce_(0, inverse, torch.arange(x.size(0), device=x.device), reduce="amin")
    order = first.argsort()  # keep the batch's order (cosmetic, but makes u == B the identity)
    remap = torch.empty_like(order)
    remap[order] = torch.arange(order.numel(), device=x.device)
    return uniq[order], first[order], remap[inverse]


def _pick(logits: torch.Tensor, sampling: Sampling, greedy: bool, uniform: torch.Tensor | None,
          seen: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (b,), their log-probs (b,)) from next-token logits (b, V). The log-prob is that of the
    distribution the token is drawn from: log_softmax of `sampling.warp` (the repetition penalty on
    the tokens `seen` (b, V) marks, temperature, top-k, top-p, min-p), or plain log_softmax(logits)
    for greedy (argmax) decoding. A sampled token inverts the CDF at `uniform` (b,)."""
    logits = logits.float()
    if greedy:
        tokens = logits.argmax(-1)
        log_total = torch.logsumexp(logits, -1)
    else:
        logits = sampling.warp(logits, seen)
        # Unnormalised probabilities: the total normalises both the CDF and the chosen token's log-prob,
        # so no (b, V) log-softmax is written.
        top = logits.amax(-1, keepdim=True)
        cdf = (logits - top).exp_().cumsum_(-1)
        total = cdf[:, -1]
        # first index whose cumulative mass exceeds u * total: never a zero-probability token
        tokens = torch.searchsorted(cdf, (uniform * total)[:, None], right=True).squeeze(1)
        tokens = tokens.clamp_(max=logits.size(-1) - 1)
        log_total = top.squeeze(1) + total.log()
    return tokens, logits.gather(1, tokens[:, None]).squeeze(1) - log_total


def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, *,
             eos_token_ids, pad_token_id: int, sampling: Sampling | None = None, greedy: bool = False,
             generator: torch.Generator | None = None, compact_at: float | None = 0.125, cache: str = "dynamic",
             share_prefix: bool = True, pack_weights: bool = True, cuda_graph: bool = True,
             **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples up to `max_new_tokens` after each left-padded prompt `input_ids` (B, P) with its
    `attention_mask` (B, P) (1 on real tokens), from a transformers causal LM `model` (possibly peft-wrapped).

    Returns (completion (B, N) long, pad after the first EOS; mask (B, N) float, 1 up to and
    including the first EOS; logprobs (B, N) float, 0 where masked), N <= max_new_tokens: the loop
    stops once every row has emitted one of `eos_token_ids` (an int or a list of ints). Tokens are
    drawn as `sampling` (a `lmrl.generation.sampling.Sampling`, or its fields as keywords:
    temperature=, top_k=, top_p=, min_p=, repetition_penalty=; default: all off) says, and their
    log-probs are those of that distribution (the repetition penalty counts each row's real prompt
    tokens, not its left padding, and its completion so far); `greedy` takes the argmax of the raw
    logits and reports temperature-1 log-probs. Draws come from `generator` (the global RNG if
    None), so a seeded generator reproduces the samples.

    Options (the defaults are the fastest measured, see benchmarks/hf_rollout.py): `compact_at`:
    drop the finished rows from the running batch (and its cache) once they are at least this
    fraction of it (0: as soon as any row ends; None: never, like `generate`). `cache`: "dynamic",
    "concat" or "static" (see `lmrl.generation.kv_cache.new_cache`). `share_prefix`: run the prompts'
    common prefix and repeated prompts once. `pack_weights`: on a CPU, run the linear layers from
    prepacked weights (`packed_linears`).
    `cuda_graph`: on a CUDA device (outside autocast), decode over a static cache with the step
    replayed as a CUDA graph (`lmrl.generation.decode_graph`) where the model's static cache allows it
    (`graphable`); this sets `cache="static"` and turns compaction off. A static cache without
    compaction runs the same step eagerly anywhere else. The sampling options run outside the graph,
    on the logits it returns, so every option works on each path."""
    sampling = Sampling.of(sampling, **options)  # keywords a caller gives over the options object
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and sampling.temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling (got {sampling.temperature}); use greedy=True "
                         f"instead")
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids and attention_mask must both be (B, P), got {tuple(input_ids.shape)} "
                         f"and {tuple(attention_mask.shape)}")
    eos_list = [eos_token_ids] if isinstance(eos_token_ids, int) else sorted(set(eos_token_ids))
    if not eos_list:
        raise ValueError("eos_token_ids must name at least one token")
    device = input_ids.device
    B, P = input_ids.shape
    packing = packed_linears(model, B) if pack_weights else contextlib.nullcontext()
    # Under CPU autocast the packed layers run in bf16 and the rest (attention, KV cache) in fp32.
    fp32_rest = pack_weights and device.type == "cpu" and torch.is_autocast_enabled("cpu") and packing_available()
    rest = torch.autocast("cpu", enabled=False) if fp32_rest else contextlib.nullcontext()
    with torch.inference_mode(), packing, rest:
        eos = torch.tensor(eos_list, device=device)
        completion = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)
        graphed = cuda_graph and device.type == "cuda" and not torch.is_autocast_enabled("cuda")
        past = new_cache(model, "static" if graphed else cache, P + max_new_tokens)
        if graphed and not graphable(past):  # a cache layer keeping its position in Python would replay stale writes
            graphed, past = False, new_cache(model, cache, P + max_new_tokens)
        if graphed:
            cache, compact_at = "static", None
        logits, mask = prefill(model, past, input_ids, attention_mask.long(), share_prefix)
        # (b, V) bool: the tokens each running row has seen, only where the repetition penalty reads them
        seen = seen_tokens(input_ids, attention_mask, logits.size(-1)) if sampling.penalizes and not greedy else None
        step = (StaticDecodeStep(model, past, mask, P + max_new_tokens, graph=graphed)
                if cache == "static" and compact_at is None else None)
        next_pos = attention_mask.long().sum(-1, keepdim=True)  # (b, 1): position of the next token fed in
        rows = torch.arange(B, device=device)  # original row of each row of the running batch
        done = torch.zeros(B, dtype=torch.bool, device=device)  # rows of the running batch that have ended
        n = 0  # steps taken = columns filled
        while True:
            uniform = None if greedy else torch.rand(B, generator=generator, device=device)[rows]
            tokens, lp = _pick(logits, sampling, greedy, uniform, seen)
            if seen is not None:
                mark_seen(seen, tokens)
            completion[rows, n] = tokens
            logprobs[rows, n] = lp
            n += 1
            if n == max_new_tokens:
                break
            # Rows that ended keep running (their extra tokens are masked off below) until enough of
            # them have piled up to be worth a compaction, which copies the whole cache.
            done |= torch.isin(tokens, eos)
            n_done = int(done.sum())
            if n_done == done.numel():
                break
            if compact_at is not None and n_done >= max(1, math.ceil(compact_at * done.numel())):
                keep = (~done).nonzero().squeeze(1)
                past.reorder_cache(keep)  # index_select on the batch dim of every layer's keys and values
                rows, tokens, mask, next_pos, done = rows[keep], tokens[keep], mask[keep], next_pos[keep], done[keep]
                seen = seen[keep] if seen is not None else None
            if step is not None:  # fixed buffers, a CUDA graph on a GPU
                logits = step(tokens, next_pos)
            else:
                mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)
                logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos,
                               **with_cache(model, past), use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        completion, logprobs = completion[:, :n], logprobs[:, :n]
        is_eos = torch.isin(completion, eos).long()
        keep = (is_eos.cumsum(1) - is_eos) == 0  # up to and including the first EOS
        completion = completion.masked_fill(~keep, pad_token_id)
        logprobs = logprobs.masked_fill(~keep, 0.0)
        if not torch.isfinite(logprobs).all():  # NaN logits sample garbage silently: say so here, once
            raise NonFiniteOutputs("the next-token probabilities hold NaN or inf")
    # Outside inference mode, so that the results can enter autograd (e.g. as a training forward's input).
    return completion.clone(), keep.float(), logprobs.clone()
