"""Hugging Face causal LMs as lmrl policies: chat templates, and `HFPolicy`, which gives an HF model
the interface the built-in GPT has (logits, hidden states, `config.hidden_size`, batched sampling
with log-probs).

Loading (local directories, GGUF files, packaged names; never a hub) lives in `hf_loading.py` and
is re-exported here; LoRA lives in `lora.py`.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from transformers import GenerationConfig, LogitsProcessor
except ImportError as e:  # the core of lmrl runs without transformers
    raise ImportError(f"lmrl.models.hf needs the `hf` extra ({e}): pip install -e '.[hf]'") from None

from ..common.chat import render_chat
from ..common.launch_costs import prompt_sharing_pays
from ..generation.token_logprobs import token_logprobs
from ..generation.hf_generate import generate, prefill, unique_rows
from ..generation.kv_cache import with_cache
from ..generation.sampling import OFF, Sampling, mark_seen, seen_tokens
from .hf_loading import (DTYPES, PACKAGED_GGUF, convert_gguf, drop_quantizer_record,  # noqa: F401 (re-exported)
                         load_hf_model, resolve_model_path)


# ------------------------------------------------------------------------------------------ chat templates

def apply_chat_template(tokenizer, messages: list[dict]) -> str:
    """A conversational prompt (list of {"role", "content"}) as the model's chat text, ending with
    the assistant's turn opened (the generation prompt), rendered by `render_chat`."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the model {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, so "
                         "conversational prompts (lists of {role, content} messages) cannot be formatted; "
                         "give it plain-text prompts instead")
    bad = [m for m in messages if not (isinstance(m, dict) and "role" in m and "content" in m)]
    if bad:
        raise ValueError(f"chat messages must be dicts with 'role' and 'content', got {bad[0]!r}")
    return render_chat(tokenizer, messages, add_generation_prompt=True)


def already_templated(tokenizer, text: str) -> bool:
    """Text that already holds the tokenizer's special tokens (e.g. `<|im_start|>`, a rendered chat
    prompt) rather than plain text to be put into the template."""
    specials = set(tokenizer.all_special_tokens) - {tokenizer.pad_token, tokenizer.unk_token}
    return any(s and s in text for s in specials)


# ------------------------------------------------------------------------------------------------ policy

class _RecordLogprobs(LogitsProcessor):
    """The last logits processor of a `generate` call. It applies the sampling options itself (HF's
    own repetition penalty and warpers are left off), so what it returns is exactly the distribution
    the next token is drawn from, and it keeps that distribution's log-softmax. At step t the token
    drawn at step t-1 is the last input id, so only one step's (B, V) log-probs are held at a time;
    with a repetition penalty, each row's seen tokens are a (B, V) mask from the real tokens of the
    prompt (`prompt_mask`), updated with each drawn token."""

    def __init__(self, sampling: Sampling, prompt_mask: torch.Tensor):
        self.sampling, self.prompt_mask = sampling, prompt_mask
        self.seen: torch.Tensor | None = None  # (B, V) bool, with a repetition penalty
        self.last: torch.Tensor | None = None  # (B, V) log-probs of the step before
        self.logprobs: list[torch.Tensor] = []  # each (B, 1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self.logprobs.append(self.last.gather(-1, input_ids[:, -1:]))
        if self.sampling.penalizes:
            if self.seen is None:  # the first step's input ids are the prompts
                self.seen = seen_tokens(input_ids, self.prompt_mask, scores.size(-1))
            else:
                mark_seen(self.seen, input_ids[:, -1])
        scores = self.sampling.warp(scores.float(), self.seen)
        self.last = F.log_softmax(scores, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) log-probs, given the final step's tokens (B,)."""
        return torch.cat(self.logprobs + [self.last.gather(-1, last_tokens[:, None])], dim=1)


@contextlib.contextmanager
def _seeded_from(generator: torch.Generator | None, device: torch.device):
    """HF `generate` samples from the global RNG: draw a seed from `generator` and fork the global
    RNG around the call, so sampling follows the trainer's own stream and leaves the global one as it was."""
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


# ------------------------------------------------------------------------------------------ custom masks

CUSTOM_MASK_ATTENTION = ("sdpa", "eager")  # transformers attention implementations that run a 4-D mask as given


def takes_custom_mask(model: nn.Module) -> bool:
    """Whether the transformers model's attention runs a 4-D mask (B, 1, T, T) as given (sdpa and eager
    do; flash attention takes padding masks only)."""
    return getattr(model.config, "_attn_implementation", None) in CUSTOM_MASK_ATTENTION


def custom_attention_mask(model: nn.Module, allowed: torch.Tensor) -> torch.Tensor:
    """`allowed` (B, 1, T, T) bool, True where a query may attend a key, in the form the model's
    attention takes: as it is for sdpa, additive (0, or the dtype's most negative number) for eager."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation == "sdpa":
        return allowed
    if implementation == "eager":
        dtype = model.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                            torch.finfo(dtype).min)
    raise ValueError(f"{implementation} attention takes no custom 4-D mask (sdpa and eager do)")


@functools.cache
def _keeps_masked_positions(model_class) -> bool:
    """Whether the model's forward takes `logits_to_keep` as a (B, T) bool mask (its modeling file uses
    transformers' `slice_logits_to_keep`, which does); older ones take a 1-D list of columns."""
    module = next((c.__module__ for c in model_class.__mro__ if c.__module__.startswith("transformers.models.")), "")
    return hasattr(sys.modules.get(module), "slice_logits_to_keep")


MIN_SHARED_PREFIX = 16  # tokens: a shorter common start is not worth a second forward call


def common_prefix_length(ids: torch.Tensor) -> int:
    """How many leading positions all rows of `ids` (B, T) agree on."""
    differs = (ids != ids[:1]).any(0)
    return int(differs.int().argmax()) if differs.any() else ids.size(1)


class HFPolicy(nn.Module):
    """An HF causal LM with the interface lmrl uses for the built-in GPT: `forward(ids) -> logits`,
    `config.hidden_size`, `num_params()`, batched sampling with log-probs, and `sequence_logprobs`
    on left-padded prompt + completion ids. `model` may be wrapped by peft (see lora.py)."""

    def __init__(self, model: nn.Module, tokenizer):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:  # batches of prompts need a pad; EOS is the usual stand-in
            tokenizer.pad_token = tokenizer.eos_token
        ids = model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        # a completion ends at the first of these; settable, e.g. to stop on a chat turn's end
        self.eos_token_ids = sorted({*ids, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
        # "lean": lmrl.generation.hf_generate (shared prompt prefixes, finished rows dropped); "hf": HF `generate`
        self.generation_engine = "lean"
        self.cuda_graphs = True  # lean loop on a GPU: the decode step replayed as a CUDA graph (decode_graph.py)
        # scoring completions (`logits_to_keep` > 0): run each distinct prompt once (see `_forward_shared_prompts`),
        # on a GPU where that pays (`_sharing_pays`)
        self.share_prompts = True
        self._parameters_count: int | None = None

    @property
    def hf_model(self) -> nn.Module:
        """The transformers model itself (inside the peft wrapper, if any)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def config(self):
        return self.hf_model.config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def gathered(self):
        """A block in which all of the policy's weights are whole on this process: a no-op unless
        FSDP shards them (`lmrl.parallel.fsdp`). Sampling enters it: ranks run different numbers of
        forward passes there, which must not all-gather layer by layer as training does."""
        if "torch.distributed.fsdp" not in sys.modules:  # nothing is sharded (and FSDP takes a second to import)
            return contextlib.nullcontext()
        from ..parallel.fsdp import full_parameters

        return full_parameters(self)

    @property
    def takes_pair_rows(self) -> bool:
        """Whether it scores `tasks.text_batches.pair_rows` batches (a custom 4-D mask; see `forward`)."""
        return takes_custom_mask(self.hf_model)

    def forward(self, ids: torch.Tensor, return_hidden: bool = False, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, position_ids: torch.Tensor | None = None):
        """ids (B, T) -> logits (B, T, V) (the last `logits_to_keep` positions' only, if > 0: the
        learner needs completion positions alone, and a 49k-word vocabulary makes the rest costly),
        or (logits, final hidden states (B, T, C)). Rows may be left-padded: pass their
        `attention_mask`, and positions then count from each row's first real token.

        A custom layout (`pair_rows`: a pair's two replies after its prompt in one row) passes a 4-D
        `attention_mask` (B, 1, T, T), True where a query may attend a key, its `position_ids` (B, T),
        and `logits_to_keep` as a (B, T) bool mask: the logits of those positions, (K, V) row by row.
        Packed rows (`packed_batch`) pass no attention mask, their `position_ids` (restarting at each
        row: transformers' masking reads the rows from them) and such a bool mask."""
        if torch.is_tensor(logits_to_keep) or (attention_mask is not None and attention_mask.dim() == 4):
            return self._forward_custom(ids, attention_mask, position_ids, logits_to_keep)
        if attention_mask is not None:  # the same positions `generate` gives a left-padded row
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        if logits_to_keep and not return_hidden and self.share_prompts and self._sharing_pays(ids, logits_to_keep):
            logits = self._forward_shared_prompts(ids, attention_mask, position_ids, logits_to_keep)
            if logits is not None:
                return logits
        out = self.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False, output_hidden_states=return_hidden, logits_to_keep=logits_to_keep)
        return (out.logits, out.hidden_states[-1]) if return_hidden else out.logits

    def _sharing_pays(self, ids: torch.Tensor, logits_to_keep) -> bool:
        """Always on a CPU; on a GPU, where a small model's pass is bound by launching operations, only
        when the rows' prompt work outweighs its extra operations (`launch_costs.prompt_sharing_pays`)."""
        if ids.device.type != "cuda" or not isinstance(logits_to_keep, int):
            return True
        if self._parameters_count is None:
            self._parameters_count = sum(p.numel() for p in self.model.parameters())
        return prompt_sharing_pays(parameters=self._parameters_count,
                                   layers=getattr(self.config, "num_hidden_layers", None) or 1,
                                   rows=ids.size(0), prompt_tokens=ids.size(1) - logits_to_keep,
                                   adapted_share=1.0 if hasattr(self.model, "peft_config") else 0.0)

    def _forward_custom(self, ids, allowed, position_ids, keep):
        """Logits (K, V) at the positions `keep` (B, T) marks, with the 4-D mask `allowed` (None: the mask
        transformers makes of `position_ids`)."""
        if position_ids is None or not (torch.is_tensor(keep) and keep.dtype == torch.bool and keep.dim() == 2):
            raise ValueError("a 4-D attention mask or packed rows need position_ids and logits_to_keep as a (B, T) "
                             "bool mask")
        mask = None if allowed is None else custom_attention_mask(self.hf_model, allowed)
        run = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
        if _keeps_masked_positions(type(self.hf_model)):
            return self.model(**run, logits_to_keep=keep).logits
        columns = keep.any(0).nonzero().squeeze(1)  # every row's logits at the columns any row keeps
        return self.model(**run, logits_to_keep=columns).logits[keep[:, columns]]

    def _forward_shared_prompts(self, ids, attention_mask, position_ids, n: int):
        """Logits of the last `n` positions, with the rows' common head (everything before those
        positions: the prompt, in a learner's pass) run once per distinct head. RL batches repeat
        each prompt (GRPO's G samples), and the prompt is often most of a row's tokens, so this
        saves most of the forward and backward work of the prompt part. The distinct heads fill a
        KV cache as a rollout's prompts do (`prefill`: their common start, e.g. a chat template's
        system turn, runs once too), which is expanded to every row (`index_select`: gradients flow
        back through it) before the last `n` tokens run on top. Same logits as one full pass up to
        float rounding. When every head differs, the rows' common start is shared instead
        (`_forward_common_start`). None when neither is shared, or when activations are recomputed
        (gradient checkpointing turns the KV cache off)."""
        head = ids.size(1) - n
        hf = self.hf_model
        checkpointing = hf.is_activation_checkpointing if hasattr(hf, "is_activation_checkpointing") else \
            hf.is_gradient_checkpointing  # transformers < 5
        if head < 1 or checkpointing:
            return None
        if attention_mask is None:
            attention_mask = torch.ones_like(ids)
            position_ids = torch.arange(ids.size(1), device=ids.device).expand(ids.size(0), -1)
        key = ids[:, :head].masked_fill(attention_mask[:, :head] == 0, -1)
        if unique_rows(key)[1].numel() == ids.size(0):
            return self._forward_common_start(ids, attention_mask, position_ids, n)
        from transformers import DynamicCache

        past = DynamicCache(config=self.hf_model.config)
        # the cache's columns and the 2-D mask that describes them (pads may move: positions do not)
        _, cache_mask = prefill(self.model, past, ids[:, :head], attention_mask[:, :head].long(), share=True)
        mask = torch.cat([cache_mask, attention_mask[:, head:].to(cache_mask.dtype)], 1)
        out = self.model(input_ids=ids[:, head:], attention_mask=mask, position_ids=position_ids[:, head:],
                         **with_cache(self.model, past), use_cache=True, logits_to_keep=n)
        return out.logits

    def _forward_common_start(self, ids, attention_mask, position_ids, n: int):
        """Logits of the last `n` positions, with the start all rows share (at least
        `MIN_SHARED_PREFIX` tokens) run once: conversations that open with the same system prompt
        and worked example (the SQL agent's ~415 tokens of ~500-600), in SFT batches (right-padded)
        and RL ones (prompts left-padded). Each row is first rotated left past its leading pads
        (they go to its end, where no real token attends to them; positions come from
        `position_ids`, so they do not change), which lines the shared start up at column 0. The
        rows' last `n` original columns then lie in the last n + (most leading pads) rotated ones:
        those logits are computed and each row's own `n` gathered. None when the start is shorter,
        or when the rows' leading pads differ by more than `n` (the wider logits would cost more)."""
        B, T = ids.shape
        lead = torch.zeros(B, dtype=torch.long, device=ids.device) if attention_mask is None else \
            (attention_mask.long().cumsum(1) == 0).sum(1)  # (B,) leading pads
        widest = int(lead.max())
        keep = n + widest
        if B < 2 or widest > n or keep >= T:
            return None
        cols = (torch.arange(T, device=ids.device) + lead[:, None]) % T  # rotated[i, j] = row i's column j + lead_i
        ids, position_ids = ids.gather(1, cols), position_ids.gather(1, cols)
        attention_mask = None if attention_mask is None else attention_mask.gather(1, cols)
        key = ids[:, :T - keep] if attention_mask is None else \
            ids[:, :T - keep].masked_fill(attention_mask[:, :T - keep] == 0, -1)
        head = common_prefix_length(key)
        if head < MIN_SHARED_PREFIX:
            return None
        from transformers import DynamicCache

        past = DynamicCache(config=self.hf_model.config)
        self.model(input_ids=ids[:1, :head], position_ids=position_ids[:1, :head], **with_cache(self.model, past),
                   attention_mask=None if attention_mask is None else attention_mask[:1, :head],
                   use_cache=True, logits_to_keep=1)
        past.reorder_cache(torch.zeros(B, dtype=torch.long, device=ids.device))  # one row -> every row
        logits = self.model(input_ids=ids[:, head:], attention_mask=attention_mask, position_ids=position_ids[:, head:],
                            **with_cache(self.model, past), use_cache=True, logits_to_keep=keep).logits  # (B, keep, V)
        # row i's original column T - n + j is rotated column T - n + j - lead_i: offset widest - lead_i + j here
        at = (widest - lead)[:, None] + torch.arange(n, device=ids.device)  # (B, n)
        return logits.gather(1, at[..., None].expand(-1, -1, logits.size(-1)))

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, P), attention_mask (B, P)), left-padded, on the policy's device. Special tokens
        (e.g. BOS) are added unless every prompt already starts with the BOS text, as chat templates write it."""
        if isinstance(prompts, str) or not prompts:
            raise ValueError("prompts must be a non-empty list of strings")
        bos = self.tokenizer.bos_token
        add_special = not (bos and all(p.startswith(bos) for p in prompts))
        side, self.tokenizer.padding_side = self.tokenizer.padding_side, "left"
        try:
            enc = self.tokenizer(list(prompts), padding=True, add_special_tokens=add_special, return_tensors="pt")
        finally:
            self.tokenizer.padding_side = side
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    @torch.no_grad()
    def generate_text(self, prompts: list[str], max_new_tokens: int, *, sampling: Sampling | None = None,
                      greedy: bool = False, generator: torch.Generator | None = None, **options):
        """Samples up to `max_new_tokens` after each prompt (see `generate_ids`).

        Returns (prompt_ids (B, P) left-padded, completion_ids (B, N) with pad after EOS,
        completion_mask (B, N) 1 up to and including the first EOS, logprobs (B, N) 0 where masked)."""
        ids, mask = self.encode(prompts)
        completion, keep, logprobs = self.generate_ids(ids, mask, max_new_tokens, sampling=sampling, greedy=greedy,
                                                       generator=generator, **options)
        return ids, completion, keep, logprobs

    @torch.no_grad()
    def generate_ids(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, *,
                     sampling: Sampling | None = None, greedy: bool = False,
                     generator: torch.Generator | None = None, **options):
        """Samples up to `max_new_tokens` after left-padded prompt ids (B, P), with the lean loop of
        `lmrl.generation.hf_generate` (default) or, with `generation_engine = "hf"`, the HF model's
        `generate` (KV cache). Returns (completion (B, N) with pad after EOS, mask (B, N) 1 up to
        and including the first EOS, logprobs (B, N) 0 where masked); N <= max_new_tokens
        (generation stops once every row has ended). Tokens are drawn as `sampling` (a
        `lmrl.generation.sampling.Sampling`, or its fields as keywords: temperature=, top_k=, top_p=,
        min_p=, repetition_penalty=) says; log-probs are those of that distribution, recorded during
        generation by a final logits processor; greedy reports temperature-1 log-probs, as GPT.generate does.
        The checkpoint's own generation defaults (top-p, repetition penalty, ...) are not applied."""
        sampling = Sampling.of(sampling, **options)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not greedy and sampling.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {sampling.temperature}); use greedy=True "
                             f"instead")
        with self.gathered():
            return self._generate_ids(ids, mask, max_new_tokens, sampling=sampling, greedy=greedy,
                                      generator=generator)

    def _generate_ids(self, ids, mask, max_new_tokens, *, sampling, greedy, generator):
        pad = self.tokenizer.pad_token_id
        if self.generation_engine == "lean":
            was_training = self.training
            self.eval()
            try:
                return generate(self.model, ids, mask, max_new_tokens, eos_token_ids=self.eos_token_ids,
                                pad_token_id=pad, sampling=sampling, greedy=greedy, generator=generator,
                                cuda_graph=self.cuda_graphs)
            finally:
                self.train(was_training)
        record = _RecordLogprobs(OFF if greedy else sampling, mask)
        # HF's own processors and warpers stay off (temperature 1, no top-k / top-p): `record` applies every option.
        warpers_off = {} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, use_cache=True,
                                  eos_token_id=self.eos_token_ids, pad_token_id=pad, **warpers_off)
        hf, was_training = self.hf_model, self.training
        saved, hf.generation_config = hf.generation_config, GenerationConfig(
            bos_token_id=hf.generation_config.bos_token_id, eos_token_id=self.eos_token_ids, pad_token_id=pad)
        self.eval()
        try:
            with _seeded_from(generator, ids.device):
                seq = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                          logits_processor=[record])
        finally:
            hf.generation_config = saved
            self.train(was_training)
        completion = seq[:, ids.size(1):]  # (B, N)
        logprobs = record.finish(completion[:, -1])
        is_eos = torch.isin(completion, torch.tensor(self.eos_token_ids, device=completion.device)).long()
        keep = (is_eos.cumsum(1) - is_eos) == 0  # up to and including the first EOS
        return completion.masked_fill(~keep, pad), keep.float(), logprobs.masked_fill(~keep, 0.0)

    def sequence_logprobs(self, ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                          temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (B, N) and entropies (B, N) of the last `n_completion` tokens of left-padded
        `ids` (B, T), with gradients, under softmax(logits / temperature): the learner's recomputation
        of what `generate_text` recorded (top-k is not re-applied, as in gpt.sequence_logprobs)."""
        if not 1 <= n_completion < ids.size(1):
            raise ValueError(f"n_completion must be in [1, {ids.size(1) - 1}], got {n_completion}")
        # (B, N, V): position t predicts t+1
        logits = self(ids[:, :-1], attention_mask=attention_mask[:, :-1], logits_to_keep=n_completion)
        return token_logprobs(logits[:, -n_completion:], ids[:, -n_completion:], temperature)


def load_hf_policy(path: str, *, gguf_file: str | None = None, dtype: str = "fp32",
                   gradient_checkpointing: bool = False, device="cpu") -> tuple[HFPolicy, object]:
    """(HFPolicy, tokenizer) for the causal LM at `path` (see `load_hf_model`)."""
    model, tokenizer = load_hf_model(path, gguf_file=gguf_file, dtype=dtype,
                                     gradient_checkpointing=gradient_checkpointing, device=device)
    return HFPolicy(model, tokenizer), tokenizer
