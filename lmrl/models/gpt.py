"""The built-in GPT: a small decoder-only transformer written from scratch, with a KV cache for
batched sampling, and the character tokenizer it is trained with.

The model follows nanoGPT (pre-norm blocks, GELU MLP, learned positions, tied input/output
embeddings). Sampling returns the log-probability of every token it drew, which the RL loop uses
for its metrics and the off-policy algorithms use as "old" log-probs.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..generation.token_logprobs import token_logprobs
from ..common.errors import NonFiniteOutputs
from ..generation.sampling import Sampling, mark_seen, seen_tokens


class CharTokenizer:
    """Maps each character of a fixed alphabet to one id. No merges, no unknowns: an unknown
    character is an error that names it, so a task can never train on silently dropped text."""

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise ValueError(f"tokenizer alphabet has repeated characters: {chars!r}")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} in {text!r} is not in the tokenizer alphabet {self.chars!r}") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in (ids.tolist() if torch.is_tensor(ids) else ids))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"chars": self.chars}))

    @classmethod
    def load(cls, path: Path) -> "CharTokenizer":
        return cls(json.loads(Path(path).read_text())["chars"])


@dataclass
class GPTConfig:
    vocab_size: int = 16  # alphabet size of the character tokenizer
    n_position: int = 64  # longest sequence (prompt + completion) the model can see
    n_layer: int = 4
    n_head: int = 8
    n_embd: int = 256
    dropout: float = 0.0


class KVCache:
    """Preallocated keys and values for every layer: (L, B, nh, T_max, hs) each.
    `length` is how many positions are filled; all sequences in the batch share it."""

    def __init__(self, cfg: GPTConfig, batch: int, max_len: int, device, dtype):
        hs = cfg.n_embd // cfg.n_head
        shape = (cfg.n_layer, batch, cfg.n_head, max_len, hs)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """`F.dropout(x, p)` in training mode. On a CPU the mask is cut from 64-bit random words, 16 bits
    per element (each kept with probability 1 - p to within 2⁻¹⁶), where PyTorch's CPU dropout draws
    one random number per element (benchmarks/gpt_step.py times the two)."""
    if not p or p >= 1 or x.device.type != "cpu":
        return F.dropout(x, p)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= round(p * 65536) - 32768
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` (so `disable_dropout` and anything else that sets an
    `nn.Dropout`'s p still reaches it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p) if self.training else x


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q kᵀ / √d) v over heads: q (B, nh, Q, hs) holds the queries of the last Q of the L
    positions whose keys and values k, v (B, nh, L, hs) hold; each query sees the keys up to its own
    position. Returns (B, nh, Q, hs)."""
    Q, L = q.size(-2), k.size(-2)
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # On a CPU, PyTorch's bf16 attention kernels and its softmax are slow over rows this short
        # (a dozen keys): written out, with the softmax in fp32 (benchmarks/gpt_step.py).
        s = (q @ k.transpose(-2, -1)).float() * q.size(-1) ** -0.5  # (B, nh, Q, L)
        if Q > 1:
            s = s.masked_fill(_hidden(Q, L, q.device), float("-inf"))
        e = (s - s.amax(-1, keepdim=True).detach()).exp()  # the shift changes neither softmax nor its gradient
        p = e / e.sum(-1, keepdim=True)
        if dropout_p:
            p = dropout(p, dropout_p)
        return p.to(v.dtype) @ v
    return sdpa_attend(q, k, v, dropout_p)


def sdpa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """`attend` on `F.scaled_dot_product_attention` (the kernel is PyTorch's choice)."""
    Q, L = q.size(-2), k.size(-2)
    if Q == 1:  # the newest position sees every key
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if Q == L:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~_hidden(Q, L, q.device), dropout_p=dropout_p)


@functools.cache
def _hidden(Q: int, L: int, device: torch.device) -> torch.Tensor:
    """(Q, L) True where query i, at position L - Q + i, must not see key j (j is after it)."""
    return torch.ones(Q, L, dtype=torch.bool, device=device).triu(diagonal=L - Q + 1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_dropout = Dropout(cfg.dropout)  # its p is the attention weights' dropout
        self.resid_dropout = Dropout(cfg.dropout)

    def forward(self, x, cache: KVCache | None = None, layer: int = 0, queries: int = 0):
        """Causal self-attention over x (B, T, C) → (B, T, C); with `queries` = K > 0, the outputs of
        the last K positions only (B, K, C): keys and values of every position, queries of those K.
        With a cache, x continues the cached positions, whose keys and values it extends."""
        B, T, C = x.shape
        if queries:
            # contiguous: F.linear's one fused product, whether or not the weights require grad
            q = F.linear(x[:, -queries:].contiguous(), self.c_attn.weight[:C], self.c_attn.bias[:C])
            k, v = F.linear(x, self.c_attn.weight[C:], self.c_attn.bias[C:]).split(C, dim=2)
        else:
            q, k, v = self.c_attn(x).split(C, dim=2)
        Q = q.size(1)
        q = q.view(B, Q, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, Q, hs)
        k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (k, v))  # (B, nh, T, hs)
        if cache is None:
            y = attend(q, k, v, self.attn_dropout.p if self.training else 0.0)
        else:
            start = cache.length
            # A prefill (start == 0) may be any length; after it positions are appended one at a time.
            assert start == 0 or T == 1, "KV cache appends one token at a time after the prefill"
            cache.k[layer, :, :, start : start + T] = k
            cache.v[layer, :, :, start : start + T] = v
            k = cache.k[layer, :, :, : start + T]
            v = cache.v[layer, :, :, : start + T]  # (B, nh, start+T, hs)
            y = attend(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, Q, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, cache=None, layer=0, queries: int = 0):
        """x (B, T, C) → (B, T, C), or the last `queries` positions' (B, K, C) (see the attention)."""
        h = self.attn(self.ln_1(x), cache, layer, queries)
        x = (x[:, -queries:] if queries else x) + h
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_position, cfg.n_embd)
        self.drop = Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scaled init of residual projections (GPT-2)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, last_only: bool = False,
                return_hidden: bool = False, logits_to_keep: int = 0):
        """idx (B, T) token ids → logits (B, T, V), or (B, 1, V) with `last_only`, or the last
        `logits_to_keep` positions' (B, K, V) (0 = all). With a cache, positions continue from
        `cache.length` and the cache is extended by T. `return_hidden` also returns the final
        hidden states (B, T, C) of every position, for a value head."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.config.n_position:
            raise ValueError(f"sequence of {start + T} tokens exceeds model.n_position={self.config.n_position}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        # Where only the last positions' logits are wanted, the last block runs their queries, MLP
        # and output alone (the keys and values of every position are still needed, and cached).
        trim = 0 if return_hidden else 1 if last_only else logits_to_keep
        for i, block in enumerate(self.h):
            x = block(x, cache, i, trim if i == len(self.h) - 1 else 0)
        if cache is not None:
            cache.length += T
        if last_only:  # at inference only the last position's logits are needed
            x = x[:, -1:]
        x = self.ln_f(x)
        x_out = x[:, -logits_to_keep:] if logits_to_keep else x
        with torch.autocast(idx.device.type, enabled=False):  # logits at full precision under mixed precision
            logits = self.lm_head(x_out.to(self.lm_head.weight.dtype))
        return (logits, x) if return_hidden else logits

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        sampling: Sampling | None = None,
        greedy: bool = False,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        **options,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample `max_new_tokens` after each row of `prompt` (B, T), all prompts the same length.

        Returns (tokens (B, N), logprobs (B, N)): the sampled ids and their log-probabilities under
        the distribution they were drawn from, as `sampling` (a `lmrl.generation.sampling.Sampling`,
        or its fields as keywords: temperature=, top_k=, top_p=, min_p=, repetition_penalty=) warps
        the logits. Greedy decoding reports the log-probs of the temperature-1 distribution.
        `use_cache=False` recomputes the whole prefix every step; it exists to check and benchmark the cache."""
        sampling = Sampling.of(sampling, **options)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not greedy and sampling.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {sampling.temperature}); use greedy=True "
                             f"instead")
        B, T = prompt.shape
        kind = prompt.device.type  # under autocast the keys and values come out in its dtype, and are kept in it
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.wte.weight.dtype
        cache = KVCache(self.config, B, T + max_new_tokens, prompt.device, dtype) if use_cache else None
        # (B, V) bool: the tokens each row has seen, only where the repetition penalty reads them
        seen = seen_tokens(prompt, None, self.config.vocab_size) if sampling.penalizes and not greedy else None
        seq, tokens, logps = prompt, [], []
        step_input = prompt
        for _ in range(max_new_tokens):
            logits = self(step_input if use_cache else seq, cache, last_only=True)[:, -1].float()  # (B, V)
            if not greedy:
                logits = sampling.warp(logits, seen)
            logp = F.log_softmax(logits, dim=-1)
            if greedy:
                nxt = logp.argmax(dim=-1, keepdim=True)
            else:
                try:
                    nxt = torch.multinomial(logp.exp(), 1, generator=generator)
                except RuntimeError:
                    if not torch.isfinite(logp).all():  # checked only on failure: free on the happy path
                        raise NonFiniteOutputs("the next-token probabilities hold NaN or inf") from None
                    raise
            if seen is not None:
                mark_seen(seen, nxt.squeeze(1))
            tokens.append(nxt)
            logps.append(logp.gather(-1, nxt))
            step_input = nxt
            if not use_cache:
                seq = torch.cat([seq, nxt], dim=1)
        return torch.cat(tokens, 1), torch.cat(logps, 1)

    def save_pretrained(self, directory: Path, tokenizer: CharTokenizer | None = None) -> None:
        """Writes config.json + model.safetensors (+ tokenizer.json) — loadable by `from_pretrained`."""
        from safetensors.torch import save_model

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(asdict(self.config), indent=2))
        save_model(self, str(directory / "model.safetensors"))
        if tokenizer is not None:
            tokenizer.save(directory / "tokenizer.json")

    @classmethod
    def from_pretrained(cls, directory: Path, map_location: str = "cpu") -> "GPT":
        from safetensors.torch import load_model

        directory = Path(directory)
        model = cls(GPTConfig(**json.loads((directory / "config.json").read_text()))).to(map_location)
        load_model(model, str(directory / "model.safetensors"), device=str(map_location))
        return model


def sequence_logprobs(model: nn.Module, input_ids: torch.Tensor, n_completion: int,
                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (B, N) and entropies (B, N) of the last `n_completion` tokens of `input_ids` (B, T)
    given everything before them, with gradients, under the distribution the tokens were sampled
    from: softmax(logits / temperature)."""
    if not 1 <= n_completion < input_ids.size(1):
        raise ValueError(f"n_completion must be in [1, {input_ids.size(1) - 1}], got {n_completion}")
    logits = model(input_ids[:, :-1])[:, -n_completion:]  # (B, N, V): t predicts t+1
    return token_logprobs(logits, input_ids[:, -n_completion:], temperature)
