"""Token ids and loss masks for the offline trainers: SFT rows and preference pairs, encoded once with
the policy's tokenizer, truncated to `max_length` with every cut counted, and padded per batch.

    codec = TextCodec(tokenizer, chat=True)             # an HF tokenizer, or the GPT's CharTokenizer
    rows = encode_sft(read_sft("sft.jsonl"), codec, max_length=256, counter=counter)
    ids, attention, loss_mask = pad_sequences([r.ids for r in rows], [r.mask for r in rows])
    packed = pack_examples(rows, 512, "bfd")                 # several rows a sequence, each one's positions from 0
    batch = packed_batch(packed, pad_id, "cpu")             # (ids, position ids, loss mask), no attention mask
    batch = pair_rows(encode_preferences(pairs, codec, 256, counter), pad_id, "cpu")  # one row per pair
    logps, counted = pair_logps(policy, batch)                                          # (2B,) chosen, rejected
    logps, counted, sums = pair_logps_and_sums(policy, batch)       # and TRL's token diagnostics per side

The text a model is trained on is the text it will be prompted with: a plain-text prompt goes into
the tokenizer's chat template as a user message (when it has one and `chat` is on), a response is
followed by the end-of-sequence token (the end of an assistant turn in chat models), and loss
masks cover the response tokens (with that end token) and nothing else. A conversational prompt
(messages) is rendered by the chat template with the generation prompt; a conversational reply
(assistant messages) is what the template renders after it, its loss on the assistant messages'
contents and the end-of-turn token closing each. A {"text"} row has the loss on every token.

Packed (`pack_examples`, TRL's `pack_dataset`), several rows share a sequence and each row's position
ids restart at 0; the model is run with those position ids and no attention mask, from which
transformers' masking builds the block-diagonal causal mask (sdpa, eager) or flash attention's
variable-length segments (one row per batch), so no row attends to another and each token's loss is
what it is in its row alone."""

from __future__ import annotations

import functools
import os
import bisect
from collections import defaultdict, deque
from dataclasses import dataclass

import torch

from ..generation.token_logprobs import token_logprobs, token_logprobs_and_diagnostics
from ..common.chat import render_chat
from ..common.data import DataError
from .preference_data import PreferenceRow, SFTRow, TruncationCounter, truncate_pair

try:
    from jinja2 import TemplateError  # what a chat template raises (e.g. "roles must alternate")
except ImportError:  # no chat templates without jinja2 (transformers brings it)
    TemplateError = ValueError

_NEEDS_CHAT = "needs an hf tokenizer with a chat template and data.chat=true"
_KEEP_TEXT = " (read_preference(..., dialogue='text') keeps HH-RLHF's '\\n\\nHuman:' dialogues as text)"
TRUNCATION_MODES = ("keep_start", "keep_end")
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")
PACK_CHUNK = 1000  # rows packed together: TRL packs with datasets' batched map, 1000 rows a batch


@dataclass(frozen=True)
class SFTExample:
    ids: list[int]
    mask: list[int]  # 1 where the token is predicted with loss (the response)
    lengths: tuple[int, ...] | None = None  # packed: the rows laid end to end in ids (None: one row)


@dataclass(frozen=True)
class PairExample:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    chosen_mask: list[int] | None = None    # 1 where a chosen token has loss; None: every chosen token
    rejected_mask: list[int] | None = None  # the same for rejected


class TextCodec:
    """Prompts and responses as token ids for one tokenizer: a Hugging Face tokenizer, or the
    built-in GPT's `CharTokenizer` (plain text only: no chat template, no end token)."""

    def __init__(self, tokenizer, chat: bool = True):
        self.tokenizer = tokenizer
        self.is_hf = hasattr(tokenizer, "apply_chat_template")
        self.chat = chat and self.is_hf and bool(getattr(tokenizer, "chat_template", None))
        self.eos = [tokenizer.eos_token_id] if self.is_hf and tokenizer.eos_token_id is not None else []

    def prompt_ids(self, prompt: str | list[dict], **template_kwargs) -> list[int]:
        """A prompt's ids: a conversation (or, with chat, a plain prompt as its user message) through the chat
        template with the generation prompt and `template_kwargs` (a row's own), other text as it is."""
        if isinstance(prompt, list):  # a conversation so far
            if not self.chat:
                raise ValueError(f"a conversational prompt (a list of messages) {_NEEDS_CHAT}")
            return self._ids(render_chat(self.tokenizer, prompt, add_generation_prompt=True, **template_kwargs))
        if self.chat:
            from ..models.hf import already_templated

            if already_templated(self.tokenizer, prompt):  # a rendered chat prompt (what RL tasks pass)
                return self._ids(prompt)
            return self.prompt_ids([{"role": "user", "content": prompt}], **template_kwargs)
        return self._ids(prompt)

    def response_ids(self, text: str) -> list[int]:
        return self._ids(text) + self.eos

    def reply_ids(self, prompt: str | list[dict], reply: str | list[dict],
                  **template_kwargs) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of a reply to `prompt`, to follow `prompt_ids(prompt, **template_kwargs)`: a string
        reply is its text and the end token, all with loss; a conversational reply is what the chat template
        renders after the prompt's generation prompt, up to the end of its last assistant message, with the
        loss on its assistant messages' contents and their end-of-turn tokens (not the template's markup)."""
        if isinstance(reply, str):
            ids = self.response_ids(reply)
            return ids, [1] * len(ids)
        if not self.chat:
            raise ValueError(f"a conversational reply (a list of messages) {_NEEDS_CHAT}")
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return conversation_reply(self.tokenizer, prompt, reply, **template_kwargs)

    def text_ids(self, text: str) -> list[int]:
        """A {"text"} row for language modelling: its tokens and the end token, no template."""
        return self._ids(text) + self.eos

    def _ids(self, text: str) -> list[int]:
        if self.is_hf:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.tokenizer.encode(text)


def encode_sft(rows: list[SFTRow], codec: TextCodec, max_length: int, counter: TruncationCounter,
               where: str = "", *, completion_only_loss: bool = True, assistant_only_loss: bool = True,
               truncation_mode: str = "keep_start") -> list[SFTExample]:
    """Prompt/response rows as prompt + response ids (loss on the response; on both without
    `completion_only_loss`); conversations through the chat template (loss on every assistant turn and
    its end token; without `assistant_only_loss`, on every token the template renders, or, for a
    conversational prompt/completion row, every token after its prompt, as TRL masks them); {"text"}
    rows as their tokens and the end token (loss on all). Over-long rows are cut and counted: with
    keep_start a pair loses its prompt's start first (its response's end if it must), a conversation
    or text its end; with keep_end every row keeps its last `max_length` tokens. Errors name the row's
    source (path:line or row i), else `where` and its 1-based position in `rows`."""
    if truncation_mode not in TRUNCATION_MODES:
        raise ValueError(f"truncation_mode must be one of {', '.join(TRUNCATION_MODES)}, got {truncation_mode!r}")
    cut = functools.partial(_cut, keep_end=truncation_mode == "keep_end")
    out = []
    for i, row in enumerate(rows):
        try:
            if row.text is not None:  # language modelling: every token has loss
                ids = codec.text_ids(row.text)
                ids, mask = cut(ids, [1] * len(ids), max_length, counter)
            elif row.chat:
                if not codec.chat:
                    raise ValueError(f"a conversation (messages) {_NEEDS_CHAT}")
                ids, mask = cut(*_conversation_ids(codec.tokenizer, row, completion_only_loss, assistant_only_loss),
                                max_length, counter)
            else:
                prompt, response = row.messages[0]["content"], row.messages[1]["content"]
                p, r = codec.prompt_ids(prompt, **row.chat_template_kwargs), codec.response_ids(response)
                if truncation_mode == "keep_start":
                    p, r = counter.truncate(p, r, max_length)
                    ids, mask = p + r, [0] * len(p) + [1] * len(r)
                else:
                    ids, mask = cut(p + r, [0] * len(p) + [1] * len(r), max_length, counter)
                if not completion_only_loss:
                    mask = [1] * len(ids)
        except (ValueError, TemplateError) as e:
            raise DataError(f"{_row_name(row, where, i)}: {e}") from None
        out.append(SFTExample(ids, mask))
    return out


def _conversation_ids(tokenizer, row: SFTRow, completion_only_loss: bool,
                      assistant_only_loss: bool) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a conversation row (see `encode_sft`). Without `completion_only_loss` the
    prompt of a conversational prompt/completion row is trained as a conversation's turns are."""
    messages, kwargs = row.messages, row.chat_template_kwargs
    prompt = row.prompt_turns if completion_only_loss else 0
    if not completion_only_loss:  # the prompt's assistant turns, context so far, are trained too
        messages = [{k: v for k, v in m.items() if k != "training"} if i < row.prompt_turns else m
                    for i, m in enumerate(messages)]
    if assistant_only_loss:
        return assistant_token_mask(tokenizer, messages, **kwargs)
    ids = tokenizer(render_chat(tokenizer, messages, **kwargs), add_special_tokens=False)["input_ids"]
    if not prompt:
        return ids, [1] * len(ids)
    # TRL's completion mask: the tokens past where the prompt, with its generation prompt, and the row part
    head = tokenizer(render_chat(tokenizer, messages[:prompt], add_generation_prompt=True, **kwargs),
                     add_special_tokens=False)["input_ids"]
    shared = next((k for k, (a, b) in enumerate(zip(head, ids)) if a != b), min(len(head), len(ids)))
    return ids, [0] * shared + [1] * (len(ids) - shared)


def encode_preferences(rows: list[PreferenceRow], codec: TextCodec, max_length: int,
                       counter: TruncationCounter, where: str = "") -> list[PairExample]:
    """Each pair as (prompt, chosen, rejected) ids, with loss masks for conversational replies. Both
    sides keep the same prompt: when either prompt + reply is too long, the prompt is cut (its start
    first) for the longer reply, then each reply is cut at its end; a pair with any cut counts once.
    Errors name the row's source (path:line or row i), else `where` and its 1-based position."""
    out = []
    for i, row in enumerate(rows):
        try:
            template = row.chat_template_kwargs
            prompt = codec.prompt_ids(row.prompt, **template)
            (chosen, chosen_mask), (rejected, rejected_mask) = (codec.reply_ids(row.prompt, row.chosen, **template),
                                                                codec.reply_ids(row.prompt, row.rejected, **template))
        except (ValueError, TemplateError) as e:
            hint = _KEEP_TEXT if not codec.chat and isinstance(row.prompt, list) else ""
            raise DataError(f"{_row_name(row, where, i)}: {e}{hint}") from None
        longer = chosen if len(chosen) >= len(rejected) else rejected
        prompt, _, cut = truncate_pair(prompt, longer, max_length)
        room = max_length - len(prompt)
        counter.rows += 1
        counter.truncated += cut
        out.append(PairExample(prompt, chosen[:room], rejected[:room], chosen_mask[:room], rejected_mask[:room]))
    return out


def _cut(ids: list[int], mask: list[int], max_length: int, counter: TruncationCounter,
         keep_end: bool = False) -> tuple[list[int], list[int]]:
    """A row's first (`keep_end`: last) max_length tokens, counted."""
    counter.rows += 1
    if len(ids) <= max_length:
        return ids, mask
    counter.truncated += 1
    kept = slice(-max_length, None) if keep_end else slice(max_length)
    return ids[kept], mask[kept]


def _row_name(row, where: str, i: int) -> str:
    return row.source or f"{where} row {i + 1}".strip()


def pad_sequences(ids: list[list[int]], masks: list[list[int]], pad_id: int = 0,
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention_mask, loss_mask), each (B, T) with T the longest row."""
    width = max(len(x) for x in ids)
    out = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(ids), width), dtype=torch.long)
    loss = torch.zeros((len(ids), width), dtype=torch.long)
    for i, (row, mask) in enumerate(zip(ids, masks)):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[i, : len(row)] = 1
        loss[i, : len(mask)] = torch.tensor(mask, dtype=torch.long)
    return out.to(device), attention.to(device), loss.to(device)


def pack_examples(examples: list[SFTExample], seq_length: int, strategy: str = "bfd") -> list[SFTExample]:
    """Rows packed into sequences of at most `seq_length` tokens, as TRL's `pack_dataset` packs them
    (the same sequences, in the same order), each `PACK_CHUNK` rows on their own:
    - bfd: best-fit decreasing; rows longest first (ties in data order), each into the open sequence
      with the least room that holds it (the oldest such), else a new one; a row longer than
      `seq_length` keeps its first `seq_length` tokens;
    - bfd_split: the same, an over-long row split first into pieces of `seq_length` (and the rest),
      each a row of its own;
    - wrapped: the rows' tokens end to end, cut every `seq_length` tokens: a piece is one sequence
      whose rows see each other (`lengths` None), as TRL's wrapped rows do.
    Loss masks travel with their tokens."""
    if strategy not in PACKING_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(PACKING_STRATEGIES)}, got {strategy!r}")
    if seq_length < 1:
        raise ValueError(f"seq_length must be at least 1, got {seq_length}")
    out = []
    for start in range(0, len(examples), PACK_CHUNK):
        chunk = examples[start:start + PACK_CHUNK]
        if strategy == "wrapped":
            ids = [t for e in chunk for t in e.ids]
            mask = [m for e in chunk for m in e.mask]
            out += [SFTExample(ids[a:a + seq_length], mask[a:a + seq_length]) for a in range(0, len(ids), seq_length)]
        else:
            out += _best_fit_decreasing(chunk, seq_length, split=strategy == "bfd_split")
    return out


def _best_fit_decreasing(chunk: list[SFTExample], seq_length: int, split: bool) -> list[SFTExample]:
    """`pack_examples`' bfd / bfd_split of one chunk (TRL's `_pack_bfd`, its segment tree a sorted list of
    the rooms open sequences have)."""
    pieces = [(e.ids[a:a + seq_length], e.mask[a:a + seq_length]) for e in chunk if e.ids
              for a in (range(0, len(e.ids), seq_length) if split else (0,))]
    bins: list[list[int]] = []
    open_by_room: dict[int, deque] = defaultdict(deque)  # room left -> the sequences with that room, oldest first
    rooms: list[int] = []  # the rooms (0 < room < seq_length) some open sequence has, ascending
    for k in sorted(range(len(pieces)), key=lambda k: -len(pieces[k][0])):  # stable: ties in data order
        n = len(pieces[k][0])
        at = bisect.bisect_left(rooms, n)
        if at < len(rooms):
            room = rooms[at]
            packed = open_by_room[room].popleft()
            if not open_by_room[room]:
                rooms.pop(at)
        else:
            room, packed = seq_length, []
            bins.append(packed)
        packed.append(k)
        room -= n
        if room > 0:
            if not open_by_room[room]:
                bisect.insort(rooms, room)
            open_by_room[room].append(packed)
    return [SFTExample([t for k in b for t in pieces[k][0]], [m for k in b for m in pieces[k][1]],
                       tuple(len(pieces[k][0]) for k in b)) for b in bins]


@dataclass(frozen=True)
class PackedBatch:
    """SFT rows laid out for packed attention (`packed_batch`): no attention mask, the model is run with
    the position ids alone."""
    ids: torch.Tensor        # (B, T) right-padded
    positions: torch.Tensor  # (B, T) each row's positions from 0 (pads: a run of their own from 0)
    loss_mask: torch.Tensor  # (B, T) 1 where a token is predicted with loss (never a row's first token)


def packed_batch(examples: list[SFTExample], pad_id: int, device, flatten: bool = False) -> PackedBatch:
    """Packed examples (or plain ones: one row each) as a `PackedBatch`, one example a batch row,
    right-padded; with `flatten` every example end to end in a single batch row (TRL's padding-free
    batch, which flash attention needs to see packed rows). A packed row's first token has no loss:
    the token before it belongs to another row (TRL masks it the same way)."""
    rows = []
    for e in examples:
        lengths = e.lengths or (len(e.ids),)
        positions = [p for n in lengths for p in range(n)]
        mask, start = list(e.mask), 0
        for n in lengths:
            mask[start] = 0
            start += n
        rows.append((e.ids, positions, mask))
    if flatten:
        rows = [tuple([x for row in rows for x in row[part]] for part in range(3))]
    width = max(len(ids) for ids, _, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.arange(width).repeat(len(rows), 1)
    loss = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, pos, mask) in enumerate(rows):
        n = len(row)
        ids[i, :n] = torch.tensor(row, dtype=torch.long)
        positions[i, :n] = torch.tensor(pos, dtype=torch.long)
        positions[i, n:] -= n
        loss[i, :n] = torch.tensor(mask, dtype=torch.long)
    return PackedBatch(ids.to(device), positions.to(device), loss.to(device))


def pair_batch(pairs: list[PairExample], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The plain layout: chosen rows first, then rejected rows (2B rows), as `pad_sequences` output,
    each side a right-padded row of its own (so its prompt runs twice); the loss mask covers the
    responses. For models that take no custom attention mask (the built-in GPT); `pair_rows` otherwise."""
    seqs = [p.prompt + p.chosen for p in pairs] + [p.prompt + p.rejected for p in pairs]
    masks = [[0] * len(p.prompt) + (p.chosen_mask or [1] * len(p.chosen)) for p in pairs] + \
            [[0] * len(p.prompt) + (p.rejected_mask or [1] * len(p.rejected)) for p in pairs]
    return pad_sequences(seqs, masks, pad_id, device)


@dataclass(frozen=True)
class PairRows:
    """A preference batch of B pairs, one row each (see `pair_rows`). A side is one reply with its
    prompt: side i is pair i's chosen reply, side B + i its rejected one."""
    ids: torch.Tensor        # (B, L) [prompt[:-1] | prompt[-1], chosen | prompt[-1], rejected | pads]
    positions: torch.Tensor  # (B, L) position ids: each reply's segment goes on from its prompt
    attention: torch.Tensor  # (B, 1, L, L) bool, True where a query may attend a key
    scored: torch.Tensor     # (B, L) bool: the positions whose logits predict a reply token with loss
    targets: torch.Tensor    # (K,) the token each scored position predicts, in row-major order
    sides: torch.Tensor      # (K,) the side each scored position belongs to
    ends: torch.Tensor       # (2B,) flat index (row * L + column) of each side's last token that is not pad


def pair_length(pair: PairExample) -> int:
    """A pair's tokens: what its row costs (micro-batches of similar lengths waste little padding)."""
    return len(pair.prompt) + len(pair.chosen) + len(pair.rejected)


def pair_rows(pairs: list[PairExample], pad_id: int, device) -> PairRows:
    """One row per pair: the prompt but its last token (the head), then two segments, the prompt's
    last token and the chosen reply, the prompt's last token and the rejected reply; right-padded to
    the longest row. A segment attends to the head and to itself (causally), never to the other
    segment, and its position ids go on from the head's, so every token sees exactly the context,
    at exactly the positions, it has in a row of its own (`pair_batch`): the same numbers, with each
    prompt run once, forward and backward, and no reply padded to the other's length. The prompt's
    last token opens both segments because its logits predict each reply's first token. Pads
    attend to the head and to pads, so no row of the mask is empty (an empty one gives NaN in some
    attention kernels). `ends` holds where transformers' sequence classifiers read a row's score:
    its last token that is not `pad_id` (its first token if none is), here per side."""
    heads = [max(len(p.prompt) - 1, 0) for p in pairs]
    width = max(h + 2 * (len(p.prompt) - h) + len(p.chosen) + len(p.rejected) for h, p in zip(heads, pairs))
    B = len(pairs)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    positions = torch.zeros((B, width), dtype=torch.long)
    segment = torch.full((B, width), 3, dtype=torch.long)  # 0 head, 1 chosen, 2 rejected, 3 pad
    sources, targets, sides, ends = [], [], [], [0] * (2 * B)
    for i, (h, p) in enumerate(zip(heads, pairs)):
        ids[i, :h], positions[i, :h], segment[i, :h] = torch.tensor(p.prompt[:h], dtype=torch.long), \
            torch.arange(h), 0
        start = h  # the column of the segment being laid out
        for s, (reply, mask) in enumerate(((p.chosen, p.chosen_mask), (p.rejected, p.rejected_mask))):
            side = p.prompt + reply
            loss = [0] * len(p.prompt) + (mask or [1] * len(reply))
            n = len(side) - h
            ids[i, start:start + n] = torch.tensor(side[h:], dtype=torch.long)
            positions[i, start:start + n], segment[i, start:start + n] = torch.arange(h, len(side)), s + 1

            def column(t):  # the column of the side's token t
                return t if t < h else start + t - h

            for t in range(1, len(side)):
                if loss[t]:  # token t is predicted by the logits at token t - 1 (never in the head: t > prompt)
                    sources.append(column(t - 1))
                    targets.append(side[t])
                    sides.append(s * B + i)
            last = max((t for t, token in enumerate(side) if token != pad_id), default=0)
            ends[s * B + i] = i * width + column(last)
            start += n
    scored = torch.zeros((B, width), dtype=torch.bool)
    rows = torch.tensor([side % B for side in sides], dtype=torch.long)
    scored[rows, torch.tensor(sources, dtype=torch.long)] = True  # row-major order = the order appended
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    query, key = segment[:, :, None], segment[:, None, :]
    attention = (causal & ((key == 0) | (key == query)))[:, None]  # (B, 1, L, L)
    return PairRows(ids.to(device), positions.to(device), attention.to(device), scored.to(device),
                    torch.tensor(targets, dtype=torch.long, device=device),
                    torch.tensor(sides, dtype=torch.long, device=device),
                    torch.tensor(ends, dtype=torch.long, device=device))


def pair_logps(model, batch, call=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(reply | prompt) per side (2B,), the reply tokens with loss per side (2B,)), chosen sides
    first, of a `pair_rows` batch (the model takes its custom mask, position ids and the positions to
    keep logits of: `takes_pair_rows`) or a `pair_batch` one (ids, attention, loss mask). `call`
    runs the forward instead of `model` (its DDP wrapper)."""
    logits, targets, per_side, counted = _scored_logits(model, batch, call)
    return per_side(token_logprobs(logits, targets)[0]), counted


@dataclass(frozen=True)
class ReplyTokenSums:
    """Sums over each side's reply tokens with loss (2B,), chosen sides first, without gradient: what
    TRL's DPOTrainer divides by the tokens to log entropy, logits/* and mean_token_accuracy."""
    entropy: torch.Tensor     # the entropy of the policy's next-token distribution
    mean_logit: torch.Tensor  # the logits' mean over the vocabulary
    top1: torch.Tensor        # 1 where the reply's token is the argmax of the logits that predict it


def pair_logps_and_sums(model, batch, call=None) -> tuple[torch.Tensor, torch.Tensor, ReplyTokenSums]:
    """`pair_logps`' (log-probs, reply tokens) per side, and the reply tokens' diagnostics per side
    (`ReplyTokenSums`), read from the logits in the same pass that computes the log-probs."""
    logits, targets, per_side, counted = _scored_logits(model, batch, call)
    logp, entropy, mean_logit, top1 = token_logprobs_and_diagnostics(logits, targets)
    with torch.no_grad():
        sums = ReplyTokenSums(per_side(entropy), per_side(mean_logit), per_side(top1.float()))
    return per_side(logp), counted, sums


def _scored_logits(model, batch, call):
    """(logits (..., V), the tokens they predict (...), a function that sums a value per position
    (...) into one per side (2B,) over the reply tokens with loss, those tokens per side (2B,)):
    a `pair_rows` batch's logits are those of its scored positions (K, V); a `pair_batch` one's
    cover each row from its earliest reply token on (2B, T, V), masked by its loss mask."""
    if not isinstance(batch, PairRows):
        logits, targets, mask = response_logits(model, *batch, call=call)
        keep = mask.bool()
        return logits, targets, lambda v: torch.where(keep, v, 0).sum(1), keep.sum(1)
    call = model if call is None else call
    logits = call(batch.ids, attention_mask=batch.attention, position_ids=batch.positions,
                  logits_to_keep=batch.scored)  # (K, V): the scored positions only
    sides = 2 * batch.ids.size(0)
    return (logits, batch.targets, lambda v: v.new_zeros(sides).index_add(0, batch.sides, v),
            torch.bincount(batch.sides, minlength=sides))


def pair_scores(model, batch, call=None) -> torch.Tensor:
    """A reward model's scores per side (2B,), chosen sides first, of a `pair_rows` batch or a
    `pair_batch` one; `call` as in `pair_logps`."""
    call = model if call is None else call
    if not isinstance(batch, PairRows):
        return call(batch[0], batch[1])
    return call(batch.ids, batch.attention, position_ids=batch.positions, score_at=batch.ends)


def takes_pair_rows(model) -> bool:
    """Whether `model` scores `pair_rows` batches (HF policies and reward models whose attention
    takes a custom mask); the others get `pair_batch`'s plain layout."""
    return bool(getattr(model, "takes_pair_rows", False))


def model_logits(model, ids: torch.Tensor, attention: torch.Tensor, call=None, keep: int = 0) -> torch.Tensor:
    """Logits (B, T, V) of an HFPolicy (attention mask passed) or the built-in GPT (no padding
    mask needed: rows are right-padded, so a real token never attends to a pad); with `keep` > 0,
    those of the last `keep` positions only (B, keep, V): with a 49k-word vocabulary the output
    layer over the prompt would be most of the cost. `call` runs the forward instead of `model`
    (its DDP wrapper)."""
    call = model if call is None else call
    if type(model).__name__ in ("HFPolicy", "AdapterDisabledView"):  # the latter: a LoRA policy's reference
        return call(ids, attention_mask=attention, logits_to_keep=keep)
    return call(ids, logits_to_keep=keep)


def response_logits(model, ids: torch.Tensor, attention: torch.Tensor, loss_mask: torch.Tensor,
                    call=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (B, K − 1, V), the tokens they predict and the loss mask there (B, K − 1)): logits[:, t]
    predicts targets[:, t].

    Only the positions from the earliest response token on are computed: rows that share their
    prompt start (a pair's chosen and rejected rows) then share that prefix's forward pass too (see
    HFPolicy._forward_shared_prompts)."""
    first = int(loss_mask.float().argmax(1).min().item())  # the earliest response token over the rows
    keep = ids.size(1) - max(first - 1, 0)
    logits = model_logits(model, ids, attention, call, keep=keep)
    return logits[:, :-1], ids[:, -keep + 1:], loss_mask[:, -keep + 1:]


def assistant_token_mask(tokenizer, messages: list[dict], **template_kwargs) -> tuple[list[int], list[int]]:
    """(ids, mask) of the chat-templated conversation (`template_kwargs`: a row's own template arguments);
    mask is 1 on the tokens of assistant message contents and the end-of-turn token that closes each,
    except messages marked `"training": false` (context, such as a worked example). Needs a fast
    tokenizer (offsets)."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("an episode's messages must end with the assistant's last turn")
    text = render_chat(tokenizer, messages, **template_kwargs)
    spans = _assistant_spans(tokenizer, messages, text, template_kwargs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], _span_mask(enc["offset_mapping"], spans)


def conversation_reply(tokenizer, prompt: list[dict], reply: list[dict],
                       **template_kwargs) -> tuple[list[int], list[int]]:
    """(ids, mask) of `reply` (messages, the first and last the assistant's) after `prompt`: the text the
    chat template renders for prompt + reply past the prompt's own rendering with the generation
    prompt, up to the end of the last assistant message (its end-of-turn token included; what the
    template writes after it, such as a newline, is left out: nothing follows a reply). mask is 1 on
    the assistant messages' contents and their end-of-turn tokens (`"training": false` ones excepted).
    Both renderings take `template_kwargs` (a row's own template arguments)."""
    head = render_chat(tokenizer, prompt, add_generation_prompt=True, **template_kwargs)
    text = render_chat(tokenizer, prompt + reply, **template_kwargs)
    if not text.startswith(head):
        raise ValueError("the chat template does not render prompt + reply as the prompt (with its generation "
                         "prompt) followed by the reply, so the reply's tokens cannot be told apart")
    spans = _assistant_spans(tokenizer, prompt + reply, text, template_kwargs, first=len(prompt), every=True)
    body = text[len(head):spans[-1][1]]
    enc = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True)
    trained = [(s - len(head), e - len(head)) for (s, e), m in zip(spans, _assistants(reply))
               if m.get("training") is not False]
    return enc["input_ids"], _span_mask(enc["offset_mapping"], trained)


def _assistants(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] == "assistant"]


def _assistant_spans(tokenizer, messages: list[dict], text: str, template_kwargs: dict, first: int = 0,
                     every: bool = False) -> list[tuple[int, int]]:
    """Character spans in `text` (the rendered conversation, with `template_kwargs`) of the assistant
    messages from index `first` on, each with the end-of-turn token that closes it; messages marked
    `"training": false` are left out unless `every`.

    Message k's content is looked for after the conversation before it, rendered with the generation
    prompt. A template whose generation prompt writes what it leaves out of a past assistant turn (Qwen3
    under enable_thinking=False opens a new turn with an empty think block and renders earlier turns
    without one) continues the conversation before k differently in `text`; the content is then looked
    for from where the generation prompt and `text` part."""
    closers = _turn_closers(tokenizer, template_kwargs)
    spans, cursor = [], 0
    for k, message in enumerate(messages):
        if k < first or message["role"] != "assistant" or (message.get("training") is False and not every):
            continue
        prefix = render_chat(tokenizer, messages[:k], add_generation_prompt=True, **template_kwargs)
        if not text.startswith(prefix) and text.startswith(render_chat(tokenizer, messages[:k], **template_kwargs)):
            prefix = os.path.commonprefix([prefix, text])
        start = text.find(message["content"], max(len(prefix), cursor))
        if start < 0 or not text.startswith(prefix):
            raise ValueError(f"the chat template does not render message {k} (assistant) after the conversation "
                             "before it; cannot find its tokens")
        end = start + len(message["content"])
        end += next((len(c) for c in closers if text.startswith(c, end)), 0)
        spans.append((start, end))
        cursor = end
    return spans


def _turn_closers(tokenizer, template_kwargs: dict) -> list[str]:
    """The special tokens that may close an assistant turn right after its content: the end-of-sequence
    token first, then the tokenizer's other special tokens (e.g. Gemma's <end_of_turn> where eos is
    <eos>), less those that begin a sequence or pad it and those the generation prompt holds (they
    open a turn; rendered with `template_kwargs`, as the conversation is)."""
    eos = tokenizer.eos_token or ""
    specials = set(tokenizer.all_special_tokens)
    specials |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    specials -= {tokenizer.bos_token, tokenizer.pad_token, tokenizer.unk_token, eos, None, ""}
    user = [{"role": "user", "content": "x"}]
    try:
        opening = render_chat(tokenizer, user, add_generation_prompt=True, **template_kwargs)[
            len(render_chat(tokenizer, user, **template_kwargs)):]
    except Exception:  # a template that cannot render a lone user turn: keep the end-of-sequence token only
        return [eos] if eos else []
    others = sorted((s for s in specials if s not in opening), key=len, reverse=True)
    return ([eos] if eos else []) + others


def _span_mask(offsets, spans: list[tuple[int, int]]) -> list[int]:
    return [int(any(s <= a and b <= e and b > a for s, e in spans)) for a, b in offsets]
