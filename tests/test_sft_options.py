"""SFT's TRL options, natively and through lmrl.trl: packing (bfd, bfd_split, wrapped; the same sequences
as TRL's `pack_dataset`, each row's positions restarting so its tokens' losses are what they are alone),
padding-free batches, data.text_field, completion- and assistant-only loss switched off, keep_end
truncation, the DFT loss, label smoothing and NEFTune, each against TRL's or transformers' own code
and hand-computed values."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmrl.common.data import DataError, write_jsonl
from lmrl.config import ConfigError, load_config
from lmrl.models.hf import HFPolicy
from lmrl.tasks.preference_data import TruncationCounter, read_sft
from lmrl.tasks.text_batches import (PackedBatch, SFTExample, TextCodec, encode_sft, pack_examples, packed_batch,
                                     pad_sequences)
from lmrl.train.sft_trainer import (SFTTrainer, TokenLoss, dft_loss, label_smoothed_loss, neftune_noise,
                                    noisy_embeddings, sft_loss)
from tests.test_hf import save_tiny_llama
from tests.test_pair_rows import Bigram
from tests.test_trl_parity import SFTAccelerator, metrics, random_pairs, random_table, trl_fused_outputs
from tests.test_trl_formats import BLUE, SKY, byte_tokenizer

QUIET = ["run.progress=false", "run.tensorboard=false", "run.threads=1"]
ROWS = ([{"prompt": f"What is {a}+{b}?", "completion": f"It is {a + b}."} for a in range(3) for b in range(3)]
        + [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": w}]}
           for w in ("red", "green", "blue")]
        + [{"text": "the quick brown fox jumps over the lazy dog"}])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-options")
    save_tiny_llama(root / "model", max_positions=256)
    write_jsonl(root / "rows.jsonl", ROWS)
    return root


def _cfg(root, run_dir, *overrides):
    return load_config(None, ["run.trainer=sft", f"run.dir={run_dir}", "model.type=hf", f"model.path={root / 'model'}",
                              *QUIET, f"data.train_file={root / 'rows.jsonl'}", "data.batch_size=4",
                              "data.max_length=64", "train.max_steps=2", "train.eval_every=100", "train.log_every=1",
                              "optim.lr=1e-3", "run.mixed_precision=", *overrides])


def _examples(seed: int, rows: int, longest: int = 40) -> list[SFTExample]:
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        n = rng.choice([rng.randint(1, longest), rng.randint(1, 8), 20])
        out.append(SFTExample([rng.randint(4, 90) for _ in range(n)], [rng.randint(0, 1) for _ in range(n)]))
    return out


# -- packing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_packing_gives_trls_pack_dataset_sequences(strategy):
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    rows = _examples(0, 2300)  # more than one 1000-row chunk, many ties in length, rows over the length
    labels = [[t if m else -100 for t, m in zip(r.ids, r.mask)] for r in rows]
    theirs = pack_dataset(Dataset.from_dict({"input_ids": [r.ids for r in rows], "labels": labels}), 32, strategy)[:]
    ours = pack_examples(rows, 32, strategy)
    assert [o.ids for o in ours] == theirs["input_ids"]
    assert [[t if m else -100 for t, m in zip(o.ids, o.mask)] for o in ours] == theirs["labels"]
    if strategy == "wrapped":
        assert all(o.lengths is None for o in ours)  # one sequence each: its rows see each other, as TRL's
    else:
        assert [list(o.lengths) for o in ours] == theirs["seq_lengths"]


def test_best_fit_decreasing_by_hand():
    rows = [SFTExample([i] * n, [1] * n) for i, n in enumerate([3, 6, 2, 5, 4], start=1)]
    packed = pack_examples(rows, 8, "bfd")
    # longest first: 6 opens a sequence, 5 a second, 4 a third, 3 fills the 5's (room 3), 2 the 6's (room 2)
    assert [p.lengths for p in packed] == [(6, 2), (5, 3), (4,)]
    assert packed[0].ids == [2] * 6 + [3] * 2
    assert [p.lengths for p in pack_examples([SFTExample([1] * 11, [1] * 11)], 4, "bfd_split")] == [(4,), (4,), (3,)]


def test_packed_positions_and_loss_mask_are_trls_padding_free_batch():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    packed = pack_examples(_examples(1, 30), 32, "bfd")
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": p.ids, "labels": [t if m else -100 for t, m in zip(p.ids, p.mask)],
          "seq_lengths": list(p.lengths)} for p in packed])
    flat = packed_batch(packed, 0, "cpu", flatten=True)
    assert torch.equal(flat.ids, theirs["input_ids"]) and torch.equal(flat.positions, theirs["position_ids"])
    assert torch.equal(flat.loss_mask.bool(), theirs["labels"] != -100)  # a row's first token has no loss
    rows = packed_batch(packed, 0, "cpu")  # one packed sequence a batch row, right-padded
    assert rows.ids.shape == (len(packed), max(len(p.ids) for p in packed))
    assert torch.equal(rows.ids[rows.loss_mask.bool()], flat.ids[flat.loss_mask.bool()])
    width = rows.ids.size(1)
    last = len(packed[-1].ids)
    assert rows.positions[-1, last:].tolist() == list(range(width - last))  # pads: a run of their own


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_packed_row_has_each_rows_loss_alone(model_dir, attention, one_thread):
    model = AutoModelForCausalLM.from_pretrained(model_dir / "model", attn_implementation=attention).eval()
    policy = HFPolicy(model, AutoTokenizer.from_pretrained(model_dir / "model"))
    gen = torch.Generator().manual_seed(1)
    rows = [SFTExample(torch.randint(4, 90, (n,), generator=gen).tolist(), [1] * n) for n in (5, 9, 3, 12, 7, 2, 11)]
    packed = pack_examples(rows, 16, "bfd")
    assert max(len(p.lengths) for p in packed) > 1

    def token_losses(ids, **kw):  # (B, T - 1): −log p of each next token
        with torch.no_grad():
            logp = torch.log_softmax(policy(ids, **kw).float(), -1)[:, :-1]
        return -logp.gather(-1, ids[:, 1:, None])[..., 0]

    alone = {tuple(r.ids): token_losses(torch.tensor([r.ids]))[0] for r in rows}
    for flatten in (False, True):
        batch = packed_batch(packed, 0, "cpu", flatten=flatten)
        losses = token_losses(batch.ids, position_ids=batch.positions)
        checked = 0
        for i, p in enumerate(packed):
            row, start = (0, sum(len(q.ids) for q in packed[:i])) if flatten else (i, 0)
            for n in p.lengths:
                key = tuple(batch.ids[row, start:start + n].tolist())
                torch.testing.assert_close(losses[row, start:start + n - 1], alone[key], rtol=0, atol=1e-5)
                start, checked = start + n, checked + 1
        assert checked == len(rows)
    # without the positions restarting, a later row attends to the rows before it: its losses change
    i = next(k for k, p in enumerate(packed) if len(p.lengths) > 1)
    ids, first = torch.tensor([packed[i].ids]), packed[i].lengths[0]
    later = tuple(packed[i].ids[first:])
    assert (token_losses(ids)[0, first:] - alone[later]).abs().max() > 1e-3


def test_loss_masks_survive_packing(model_dir, tmp_path, one_thread):
    """Completion-only and assistant-only masks: the packed batch trains the same tokens, to the same loss."""
    trainer = SFTTrainer(_cfg(model_dir, tmp_path / "run"))
    trainer.model.eval()
    rows = trainer.train_rows
    assert {sum(r.mask) < len(r.ids) for r in rows} == {True, False}  # masked prompts and all-token text rows
    with torch.no_grad():
        padded_loss, padded = trainer.compute_loss(trainer.collate(rows))
        for flatten in (False, True):
            packed = packed_batch(pack_examples(rows, 64, "bfd"), trainer.pad_id, "cpu", flatten=flatten)
            loss, ours = trainer.compute_loss(packed)
            torch.testing.assert_close(loss, padded_loss, rtol=0, atol=1e-6)
            assert ours["mean_token_accuracy"].count == padded["mean_token_accuracy"].count


def test_sft_packs_and_trains_a_few_steps(model_dir, tmp_path):
    trainer = SFTTrainer(_cfg(model_dir, tmp_path / "run", "data.packing=true", "data.eval_file=" +
                              str(model_dir / "rows.jsonl"), "train.eval_every=2"))
    assert len(trainer.train_rows) < len(ROWS) and all(r.lengths for r in trainer.train_rows)
    assert any("packed (bfd) into" in note for note in trainer.data_notes)
    assert isinstance(trainer.collate(trainer.train_rows[:2]), PackedBatch) and not trainer.flatten  # sdpa
    summary = trainer.train()
    assert summary["steps_done"] == 2 and math.isfinite(summary["final"]["eval/loss"])


def test_padding_free_and_wrapped_packing_train(model_dir, tmp_path):
    flat = SFTTrainer(_cfg(model_dir, tmp_path / "flat", "data.padding_free=true", "train.max_steps=1"))
    assert flat.flatten and flat.collate(flat.train_rows[:4]).ids.size(0) == 1
    assert flat.train()["steps_done"] == 1
    wrapped = SFTTrainer(_cfg(model_dir, tmp_path / "wrapped", "data.packing=true", "data.packing_strategy=wrapped",
                              "data.max_length=32", "train.max_steps=1"))
    assert all(len(r.ids) <= 32 and r.lengths is None for r in wrapped.train_rows)
    assert isinstance(wrapped.collate(wrapped.train_rows[:2]), tuple)  # plain padded rows, as TRL's wrapped ones
    assert wrapped.train()["steps_done"] == 1


def test_the_builtin_gpt_refuses_packing_that_restarts_positions_in_one_line(tmp_path):
    data = write_jsonl(tmp_path / "chars.jsonl", [{"prompt": f"{a}=", "response": f"{a}"} for a in range(10)])
    base = ["run.trainer=sft", "model.type=gpt", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
            "model.n_position=16", "data.max_length=16", f"data.train_file={data}", "data.batch_size=4",
            "train.max_steps=1", f"run.dir={tmp_path / 'run'}", *QUIET]
    with pytest.raises(ConfigError) as e:
        load_config(None, base + ["data.packing=true"])
    assert "\n" not in str(e.value) and "data.packing=true restarts positions" in str(e.value)
    wrapped = SFTTrainer(load_config(None, base + ["data.packing=true", "data.packing_strategy=wrapped"]))
    assert wrapped.train()["steps_done"] == 1  # wrapped rows are plain rows: the GPT takes them


# -- data.text_field, completion- and assistant-only loss, truncation ---------------------------------------
def test_text_field_reads_the_named_column_and_a_missing_one_is_one_line(model_dir, tmp_path):
    (row,) = read_sft([{"body": "the sky is blue"}], text_field="body")
    assert row.text == "the sky is blue"
    path = write_jsonl(tmp_path / "rows.jsonl", [{"text": "the sky is blue"}])
    with pytest.raises(DataError) as e:
        SFTTrainer(_cfg(model_dir, tmp_path / "run", f"data.train_file={path}", "data.text_field=body"))
    assert str(e.value) == (f"{path}:1: needs one of 'prompt' + 'response' | 'prompt' + 'completion' | 'messages' | "
                            f"'conversations' | 'body' (data.text_field) (the row has keys: 'text')")


def test_completion_and_assistant_only_loss_off_train_what_trl_trains():
    from trl.data_utils import _tokenize, common_prefix_length

    tok = byte_tokenizer()
    codec = TextCodec(tok)
    prompt = SKY + [{"role": "assistant", "content": "Hm?"}, {"role": "user", "content": "The sky."}]
    rows = read_sft([{"messages": SKY + BLUE}, {"prompt": prompt, "completion": BLUE},
                     {"prompt": "What color is the sky?", "completion": "It is blue."}])

    def encode(**options):
        return encode_sft(rows, codec, 256, TruncationCounter(), **options)

    default, every, whole = encode(), encode(assistant_only_loss=False), \
        encode(assistant_only_loss=False, completion_only_loss=False)
    conversation = _tokenize(tok, SKY + BLUE)["input_ids"]  # TRL: every token the template renders
    assert every[0].ids == conversation == default[0].ids and every[0].mask == [1] * len(conversation)
    full = _tokenize(tok, prompt + BLUE)["input_ids"]
    start = common_prefix_length(_tokenize(tok, prompt, add_generation_prompt=True)["input_ids"], full)
    assert every[1].ids == full and every[1].mask == [0] * start + [1] * (len(full) - start)  # TRL's completion mask
    assert tok.decode([t for t, m in zip(every[1].ids, every[1].mask) if m]) == "It is blue.<|im_end|>\n"
    assert whole[1].mask == [1] * len(full)
    # the prompt's assistant turn, context by default, trains with completion_only_loss off (assistant-only still)
    prompt_too = encode(completion_only_loss=False)[1]
    assert tok.decode([t for t, m in zip(prompt_too.ids, prompt_too.mask) if m]) == "Hm?<|im_end|>It is blue.<|im_end|>"
    plain = encode(completion_only_loss=False)[2]
    assert plain.ids == default[2].ids and plain.mask == [1] * len(plain.ids) and 0 in default[2].mask


def test_keep_end_keeps_every_rows_last_tokens():
    tok = byte_tokenizer()
    rows = read_sft([{"text": "The sky is blue. " * 10}, {"prompt": "What color is the sky? " * 5,
                                                           "completion": "It is blue. " * 8}])
    whole = encode_sft(rows, TextCodec(tok, chat=False), 10**6, TruncationCounter())
    counter = TruncationCounter()
    cut = encode_sft(rows, TextCodec(tok, chat=False), 12, counter, truncation_mode="keep_end")
    assert [r.ids for r in cut] == [r.ids[-12:] for r in whole] and [r.mask for r in cut] == [r.mask[-12:] for r in whole]
    assert str(counter) == "2 of 2 rows truncated (100.0%)"
    start = encode_sft(rows, TextCodec(tok, chat=False), 12, TruncationCounter())
    assert start[0].ids == whole[0].ids[:12] and start[1].ids[-1] != whole[1].ids[-1]  # keep_start: the completion's start


# -- the losses ------------------------------------------------------------------------------------------------
def test_dft_loss_by_hand_and_as_trls():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])  # p(1) = 3/4, then p(0) = 1/2
    expected = -(0.75 * math.log(0.75) + 0.5 * math.log(0.5)) / 2
    assert dft_loss(logits, torch.tensor([1, 0])).item() == pytest.approx(expected, abs=1e-7)
    # the weight carries no gradient: d/dz of −sg(p) log p is −p (onehot − softmax)
    z = logits.clone().requires_grad_()
    dft_loss(z, torch.tensor([1, 0])).backward()
    torch.testing.assert_close(z.grad[0], -0.75 * (torch.tensor([0.0, 1.0]) - torch.tensor([0.25, 0.75])) / 2)

    from trl import SFTTrainer as TRLSFTTrainer

    table = random_table(3)
    rows = [(p.prompt + p.chosen, [0] * len(p.prompt) + (p.chosen_mask or [1] * len(p.chosen)))
            for p in random_pairs(3)]
    ids, attention, loss_mask = pad_sequences([r[0] for r in rows], [r[1] for r in rows])
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=SFTAccelerator(), aux_loss_enabled=False,
        compute_loss_func=None, label_smoother=None, _metrics=metrics(), _total_train_tokens=0, _tp_size=1,
        args=SimpleNamespace(loss_type="dft", average_tokens_across_devices=False))
    out = trl_fused_outputs(table[ids], ids, loss_mask)
    theirs = TRLSFTTrainer.compute_loss(stub, lambda **kw: out, {"input_ids": ids, "attention_mask": attention})
    model = Bigram(table)
    trainer = SimpleNamespace(model=model, _call=lambda: model, token_loss=TokenLoss("dft"))
    ours, _ = SFTTrainer.compute_loss(trainer, (ids, attention, loss_mask))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_label_smoothing_by_hand_and_as_transformers_label_smoother():
    from transformers.trainer_pt_utils import LabelSmoother

    logits = torch.tensor([[0.0, math.log(3.0)]])  # −log p = (log 4, log 4/3)
    eps = 0.1
    expected = (1 - eps) * math.log(4 / 3) + eps * (math.log(4) + math.log(4 / 3)) / 2
    assert label_smoothed_loss(logits, torch.tensor([1]), eps).item() == pytest.approx(expected, abs=1e-7)
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(3, 7, 11, generator=gen)  # (B, T, V)
    labels = torch.randint(0, 11, (3, 7), generator=gen)
    labels[0, :3] = labels[2, 5:] = -100
    theirs = LabelSmoother(epsilon=0.2)({"logits": full}, labels, shift_labels=True)
    keep = labels[:, 1:] != -100
    ours = label_smoothed_loss(full[:, :-1][keep], labels[:, 1:][keep], 0.2)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    loss, correct = TokenLoss("nll", 0.2)(full[:, :-1][keep], labels[:, 1:][keep])
    assert loss.item() == ours.item() and correct.numel() == int(keep.sum())


def test_the_default_loss_is_sft_loss_itself():
    gen = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(9, 13, generator=gen), torch.randint(0, 13, (9,), generator=gen)
    (a, ca), (b, cb) = TokenLoss()(logits, targets), sft_loss(logits, targets)
    assert torch.equal(a, b) and torch.equal(ca, cb)
    empty = torch.zeros(0, 13, requires_grad=True)
    for loss in (dft_loss(empty, targets[:0]), label_smoothed_loss(empty, targets[:0], 0.1)):
        assert loss.item() == 0.0 and loss.requires_grad


def test_neftune_noise_is_transformers_hook_and_off_in_evaluation(model_dir):
    from transformers.integrations.neftune import neftune_post_forward_hook

    embeddings = torch.randn(2, 5, 8)
    torch.manual_seed(7)
    ours = neftune_noise(embeddings, 5.0)
    torch.manual_seed(7)
    theirs = neftune_post_forward_hook(SimpleNamespace(training=True, neftune_noise_alpha=5.0), None, embeddings)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert 0 < (ours - embeddings).abs().max() <= 5.0 / math.sqrt(5 * 8)
    model = AutoModelForCausalLM.from_pretrained(model_dir / "model")
    policy = HFPolicy(model, AutoTokenizer.from_pretrained(model_dir / "model"))
    ids = torch.tensor([[5, 6, 7, 8]])
    clean = policy.eval()(ids)
    with noisy_embeddings(policy, 5.0):
        assert torch.equal(policy.eval()(ids), clean)  # evaluation: no noise
        assert not torch.allclose(policy.train()(ids), clean, atol=1e-4)
    assert torch.equal(policy.train()(ids), clean)  # the hook is gone after the block


# -- the config ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, message", [
    ("data.packing_strategy=wrapped", "data.packing_strategy=wrapped says how to pack: set data.packing=true too"),
    ("data.packing_strategy=greedy", "data.packing_strategy='greedy' is not one of bfd, bfd_split, wrapped"),
    ("data.truncation_mode=keep_middle", "data.truncation_mode='keep_middle' is not one of keep_start, keep_end"),
    ("sft.loss_type=kl", "sft.loss_type='kl' is not one of nll, dft"),
    ("sft.neftune_noise_alpha=-1", "sft.neftune_noise_alpha must be >= 0, got -1"),
    ("sft.label_smoothing=1.5", "sft.label_smoothing must be in [0, 1), got 1.5"),
])
def test_bad_values_are_one_line_naming_the_key(model_dir, tmp_path, override, message):
    with pytest.raises(ConfigError) as e:
        _cfg(model_dir, tmp_path / "run", override)
    assert "\n" not in str(e.value) and message in str(e.value)


def test_options_that_do_not_go_together_are_one_line(model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"^sft.label_smoothing=0.1 smooths the nll loss; sft.loss_type=dft takes "):
        _cfg(model_dir, tmp_path / "run", "sft.loss_type=dft", "sft.label_smoothing=0.1")
    with pytest.raises(ConfigError, match=r"^data.packing=True is for run.trainer=sft; run.trainer=dpo does not"):
        _cfg(model_dir, tmp_path / "run", "run.trainer=dpo", "data.packing=true")
    with pytest.raises(ConfigError, match=r"^sft.loss_type=dft is for run.trainer=sft; run.trainer=rl .* warm-up"):
        load_config("adder", ["sft.loss_type=dft"])


# -- the TRL shim ------------------------------------------------------------------------------------------------
def test_trls_sft_options_train_through_the_shim(model_dir, tmp_path):
    from lmrl.trl import SFTConfig, SFTTrainer as TRLShimSFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2, use_cpu=True,
                     bf16=False, report_to="none", logging_steps=1, max_length=64, packing=True, loss_type="dft",
                     neftune_noise_alpha=5.0, completion_only_loss=False, dataset_text_field="body",
                     label_smoothing_factor=0.1)
    rows = [{"body": r["text"]} if "text" in r else r for r in ROWS if "messages" not in r]  # TRL: one kind of text
    trainer = TRLShimSFTTrainer(model=str(model_dir / "model"), args=args, train_dataset=rows)
    cfg = trainer.inner.config
    assert (cfg.data.packing, cfg.data.packing_strategy, cfg.data.text_field) == (True, "bfd", "body")
    assert (cfg.sft.loss_type, cfg.sft.neftune_noise_alpha, cfg.sft.completion_only_loss) == ("dft", 5.0, False)
    assert cfg.sft.assistant_only_loss is False and cfg.sft.label_smoothing == 0.0  # TRL's: dft takes no smoothing
    assert any("label_smoothing_factor=0.1 changes nothing" in n for n in args.notes)
    assert trainer.train_rows == len(trainer.inner.train_rows) < len(rows)  # an epoch is over packed sequences
    out = trainer.train()
    assert out.global_step == 2 and all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
    with pytest.raises(ConfigError, match=r"packing=True, max_length=None\): packing needs max_length"):
        SFTConfig(output_dir=str(tmp_path / "x"), use_cpu=True, packing=True, max_length=None).to_config(
            model_path="m", train_rows=8)
    with pytest.raises(DataError, match=r"^row 0: needs one of .* \| 'content' \(data.text_field\)"):
        TRLShimSFTTrainer(model=str(model_dir / "model"), train_dataset=[{"text": "hi there"}],
                          args=SFTConfig(output_dir=str(tmp_path / "y"), use_cpu=True, bf16=False, report_to="none",
                                         dataset_text_field="content"))


def test_trls_sft_script_packs_through_the_shim(model_dir, tmp_path):
    from lmrl.trl.scripts import run_script

    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS if "messages" in r))
    out = tmp_path / "sft"
    run_script("sft", ["--model_name_or_path", str(model_dir / "model"), "--dataset_name", str(data), "--output_dir",
                       str(out), "--packing", "--max_length", "64", "--per_device_train_batch_size", "2",
                       "--max_steps", "2", "--logging_steps", "1", "--use_cpu", "--bf16", "false", "--report_to",
                       "none", "--eval_strategy", "no"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("packed (bfd) into" in line for line in (out / "train.log").read_text().splitlines())
    assert max(r.get("step", 0) for r in rows) == 2
