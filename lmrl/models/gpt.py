"""The built-in GPT: a small decoder-only transformer written from scratch, with a KV cache for
batched sampling, and the character tokenizer it is trained with.

The model follows nanoGPT (pre-norm blocks, GELU MLP, learned positions, tied input/output
embeddings). Sampling returns the log-probability of every token it drew, which the RL loop uses
for its metrics and the off-policy algorithms use as "old" log-probs.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..algos.token_logprobs import token_logprobs
from ..rollout.sampling import warp_logits


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


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_dropout = nn.Dropout(cfg.dropout)  # its p is SDPA's dropout_p
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, cache: KVCache | None = None, layer: int = 0, queries: int = 0):
        """Causal self-attention over x (B, T, C) → (B, T, C); with `queries` = K > 0 (no cache), the
        outputs of the last K positions only (B, K, C): keys and values of every position, queries
        of those K."""
        B, T, C = x.shape
        if queries:
            assert cache is None, "queries are trimmed in the learner's cacheless pass only"
            q = F.linear(x[:, -queries:], self.c_attn.weight[:C], self.c_attn.bias[:C])
            k, v = F.linear(x, self.c_attn.weight[C:], self.c_attn.bias[C:]).split(C, dim=2)
        else:
            q, k, v = self.c_attn(x).split(C, dim=2)
        Q = q.size(1)
        q = q.view(B, Q, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, Q, hs)
        k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (k, v))  # (B, nh, T, hs)
        if cache is None:
            drop = self.attn_dropout.p if self.training else 0.0
            # The CPU flash kernel's bf16 backward is several times slower than the plain one's here.
            plain = q.device.type == "cpu" and q.dtype == torch.bfloat16
            with sdpa_kernel(SDPBackend.MATH) if plain else nullcontext():
                if Q == T:
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
                else:  # query i sits at position T - Q + i and sees the keys up to it
                    seen = torch.ones(Q, T, dtype=torch.bool, device=x.device).tril(diagonal=T - Q)
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, dropout_p=drop)
        else:
            start = cache.length
            cache.k[layer, :, :, start : start + T] = k
            cache.v[layer, :, :, start : start + T] = v
            k = cache.k[layer, :, :, : start + T]
            v = cache.v[layer, :, :, : start + T]  # (B, nh, start+T, hs)
            # A prefill (start == 0) is causal; a one-token decode step sees every cached position.
            # Multi-token appends after a prefill are not needed by the samplers, so not supported.
            assert start == 0 or T == 1, "KV cache appends one token at a time after the prefill"
            y = F.scaled_dot_product_attention(q, k, v, is_causal=start == 0)
        y = y.transpose(1, 2).contiguous().view(B, Q, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

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
        self.drop = nn.Dropout(cfg.dropout)
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
        # The learner needs the last `logits_to_keep` positions only: the last block runs their
        # queries, MLP and output alone (the keys and values of every position are still needed).
        trim = logits_to_keep if logits_to_keep and cache is None and not return_hidden else 0
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
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        greedy: bool = False,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample `max_new_tokens` after each row of `prompt` (B, T), all prompts the same length.

        Returns (tokens (B, N), logprobs (B, N)): the sampled ids and their log-probabilities under
        the distribution they were drawn from (logits / temperature, after top-k and top-p: see
        `lmrl.rollout.sampling.warp_logits`). Greedy decoding
        reports the log-probs of the temperature-1 distribution. `use_cache=False` recomputes the
        whole prefix every step; it exists to check and benchmark the cache."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {temperature}); use greedy=True instead")
        B, T = prompt.shape
        kind = prompt.device.type  # under autocast the keys and values come out in its dtype, and are kept in it
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.wte.weight.dtype
        cache = KVCache(self.config, B, T + max_new_tokens, prompt.device, dtype) if use_cache else None
        seq, tokens, logps = prompt, [], []
        step_input = prompt
        for _ in range(max_new_tokens):
            logits = self(step_input if use_cache else seq, cache, last_only=True)[:, -1].float()  # (B, V)
            if not greedy:
                logits = warp_logits(logits, temperature, top_k, top_p)
            logp = F.log_softmax(logits, dim=-1)
            if greedy:
                nxt = logp.argmax(dim=-1, keepdim=True)
            else:
                nxt = torch.multinomial(logp.exp(), 1, generator=generator)
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
