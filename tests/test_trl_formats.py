"""Data in TRL's formats: preference rows standard and conversational, with an explicit or implicit
prompt (HH-RLHF's dialogues included), SFT rows as prompt/completion, messages or text, read from
JSONL, .jsonl.gz or rows handed in (a datasets.Dataset), encoded with the right loss masks, and
trained on by the DPO and SFT trainers. Tokenizers are built here; nothing comes from a hub."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from datasets import Dataset, DatasetDict

from lmrl.config import load_config
from lmrl.common.data import DataError
from lmrl.tasks.preference_data import (HH_ASSISTANT, PreferenceRow, SFTRow, TruncationCounter, hh_messages,
                                        preference_row, read_preference, read_sft, trl_preference)
from lmrl.tasks.text_batches import TextCodec, encode_preferences, encode_sft, pair_batch
from tests.test_hf import save_tiny_llama

HH_FILE = "/work/shared/data/hh-rlhf/harmless-base-test.jsonl.gz"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SKY = [{"role": "user", "content": "What color is the sky?"}]
BLUE, GREEN = [{"role": "assistant", "content": "It is blue."}], [{"role": "assistant", "content": "It is green."}]


def byte_tokenizer(eos="<|im_end|>"):
    """A byte-level BPE over every byte (so decoding gives back the text exactly), ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["What color is the sky? It is blue. It is green."], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token=eos,
                                   chat_template=CHATML)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def write(path, *rows):
    """One JSON row a line; gzip-compressed when the name ends in .gz."""
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def error_of(reader, source, **kw) -> str:
    with pytest.raises(DataError) as e:
        reader(source, **kw)
    return str(e.value)


def hh_rows(n=None) -> list[dict]:
    with gzip.open(HH_FILE, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [json.loads(line) for line in lines[:n]]


def masked(tok, ids, mask) -> str:
    return tok.decode([t for t, m in zip(ids, mask) if m])


# ------------------------------------------------------------------------------------- preference rows

def test_conversational_preference_rows_keep_their_messages(tmp_path):
    path = write(tmp_path / "pairs.jsonl", {"prompt": SKY, "chosen": BLUE, "rejected": GREEN})
    assert read_preference(path) == [PreferenceRow(SKY, BLUE, GREEN)]


def test_a_string_prompt_with_conversational_replies_becomes_a_user_message():
    rows = read_preference([{"prompt": "What color is the sky?", "chosen": BLUE, "rejected": GREEN}])
    assert rows == [PreferenceRow(SKY, BLUE, GREEN)]


def test_replies_that_repeat_the_prompt_keep_only_the_reply():
    # UltraFeedback-style: chosen and rejected are the whole conversation, prompt included
    rows = read_preference([{"prompt": SKY, "chosen": SKY + BLUE, "rejected": SKY + GREEN}])
    assert rows == [PreferenceRow(SKY, BLUE, GREEN)]


@pytest.mark.parametrize("chosen, rejected, prompt, chosen_reply, rejected_reply", [
    ("The sky is blue.", "The sky is green.", "The sky is", " blue.", " green."),  # TRL's own example
    ("It is 42", "It is 45", "It is", " 42", " 45"),                               # never inside a word
    ("The sky is blue", "The sky is blue and green", "The sky is", " blue", " blue and green"),
    ("答案是四", "答案是五", "答案是", "四", "五"),                                  # no spaces to cut at
    ("Q: hi\n\nAssistant: I am here", "Q: hi\n\nAssistant: I left",
     "Q: hi\n\nAssistant:", " I am here", " I left"),                              # a turn marker wins
])
def test_an_implicit_text_prompt_is_the_shared_beginning(chosen, rejected, prompt, chosen_reply, rejected_reply):
    assert read_preference([{"chosen": chosen, "rejected": rejected}]) == \
        [PreferenceRow(prompt, chosen_reply, rejected_reply)]


def test_an_implicit_message_prompt_is_the_shared_leading_messages():
    system = [{"role": "system", "content": "Be brief."}]
    rows = read_preference([{"chosen": system + SKY + BLUE, "rejected": system + SKY + GREEN}])
    assert rows == [PreferenceRow(system + SKY, BLUE, GREEN)]


def test_an_implicit_message_prompt_ends_where_both_sides_go_on_with_the_assistant():
    # the sides share [user, assistant] and part of the next user turn's role only: the prompt is the user turn
    first = [{"role": "user", "content": "hi"}]
    chosen = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "sky?"},
                      {"role": "assistant", "content": "blue"}]
    rejected = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "sea?"},
                        {"role": "assistant", "content": "green"}]
    (row,) = read_preference([{"chosen": chosen, "rejected": rejected}])
    assert row.prompt == first and row.chosen == chosen[1:] and row.rejected == rejected[1:]


def test_hh_dialogues_become_conversational_rows():
    chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Sky colour?\n\nAssistant: It is blue."
    rejected = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Sky colour?\n\nAssistant: It is green, I think."
    expected = {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                           {"role": "user", "content": "Sky colour?"}],
                "chosen": [{"role": "assistant", "content": "It is blue."}],
                "rejected": [{"role": "assistant", "content": "It is green, I think."}]}
    assert trl_preference(preference_row({"chosen": chosen, "rejected": rejected}, dialogue="hh")) == expected
    assert read_preference([{"chosen": chosen, "rejected": rejected}]) == \
        [PreferenceRow(expected["prompt"], expected["chosen"], expected["rejected"])]  # dialogue="auto"
    as_text = read_preference([{"chosen": chosen, "rejected": rejected}], dialogue="text")
    assert as_text == [PreferenceRow(chosen[:chosen.rindex(HH_ASSISTANT) + len(HH_ASSISTANT)], " It is blue.",
                                     " It is green, I think.")]
    assert hh_messages(chosen)[-1] == {"role": "assistant", "content": "It is blue."}


def test_dialogue_hh_refuses_text_that_is_not_a_dialogue():
    msg = error_of(read_preference, [{"chosen": "The sky is blue.", "rejected": "The sky is green."}], dialogue="hh")
    assert msg.startswith("row 0: 'chosen' is not a '\\n\\nHuman: ... \\n\\nAssistant: ...' dialogue")
    with pytest.raises(ValueError, match="dialogue must be one of auto, hh, text, got 'chat'"):
        read_preference([{"chosen": "a b", "rejected": "a c"}], dialogue="chat")


def test_the_real_hh_rlhf_file_reads_into_conversational_rows_whose_prompt_ends_at_the_last_human_turn():
    raw = hh_rows(50)
    rows = read_preference(raw)  # the first 50 rows, handed in
    assert len(rows) == 50
    for i, (row, pair) in enumerate(zip(rows, raw)):
        cut = pair["chosen"].rindex(HH_ASSISTANT)
        last_human = pair["chosen"][:cut].rsplit("\n\nHuman:", 1)[1].strip()
        assert row.prompt[0]["role"] == "user" and row.prompt[-1] == {"role": "user", "content": last_human}, i
        assert [m["role"] for m in row.prompt] == ["user", "assistant"] * (len(row.prompt) // 2) + ["user"], i
        assert row.chosen == [{"role": "assistant", "content": pair["chosen"][cut + len(HH_ASSISTANT):].strip()}]
        assert row.rejected == [{"role": "assistant",
                                 "content": pair["rejected"][cut + len(HH_ASSISTANT):].strip()}]
        assert row.source == f"row {i}"
    whole = read_preference(HH_FILE)  # the gzip file itself: every row, none dropped
    assert len(whole) == 2312 and whole[:50] == rows and whole[49].source == f"{HH_FILE}:50"
    # four chosen replies are empty (the annotators preferred silence); they are kept as empty replies
    assert [r.source.rsplit(":", 1)[1] for r in whole if not r.chosen[0]["content"]] == ["87", "517", "926", "1104"]


# ----------------------------------------------------------------------------- sources: gzip, datasets

def test_a_gzip_file_reads_like_the_plain_one(tmp_path):
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"}, {"prompt": SKY, "chosen": BLUE, "rejected": GREEN}]
    assert read_preference(write(tmp_path / "p.jsonl.gz", *rows)) == read_preference(write(tmp_path / "p.jsonl", *rows))
    assert read_preference(write(tmp_path / "p.jsonl.gz", *rows))[1].source == f"{tmp_path / 'p.jsonl.gz'}:2"


def test_a_truncated_gzip_file_is_named(tmp_path):
    whole = gzip.compress(b"".join(json.dumps({"text": f"row {i} " * 20}).encode() + b"\n" for i in range(200)))
    path = tmp_path / "sft.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    assert error_of(read_sft, path) == (f"{path}: the gzip file is truncated (it ends before gzip's end-of-stream "
                                        f"marker); copy or download it again")
    path.write_bytes(whole[:-4] + b"\0\0\0\0")  # a wrong length in the trailer
    assert error_of(read_sft, path).startswith(f"{path}: the gzip file is corrupt (")


def test_a_dataset_is_read_like_a_file_and_errors_name_the_row_index():
    ds = Dataset.from_list([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}] * 2)
    assert read_preference(ds) == [PreferenceRow(SKY, BLUE, GREEN)] * 2
    bad = Dataset.from_list([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN},
                             {"prompt": SKY, "chosen": [{"role": "assistant", "content": " "}], "rejected": GREEN}])
    assert error_of(read_preference, bad) == "row 1: 'chosen'[0] is an empty assistant turn"


def test_columns_a_dataset_fills_with_none_count_as_absent():
    # a Dataset built from rows with different keys fills each missing column with None
    ds = Dataset.from_dict({"prompt": ["1+1=", "2+2=", None], "response": ["2", None, None],
                            "completion": [None, "4", None], "text": [None, None, "The sky is blue."]})
    assert read_sft(ds) == [
        SFTRow([{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}], chat=False),
        SFTRow([{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}], chat=False),
        SFTRow([], chat=False, text="The sky is blue.")]
    # a struct column's missing "training" field is None too: the turn trains
    messages = Dataset.from_list([{"messages": [{"role": "user", "content": "hi", "training": None},
                                                {"role": "assistant", "content": "yo", "training": False},
                                                {"role": "assistant", "content": "ok", "training": None}]}])
    assert read_sft(messages)[0].messages == [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "yo", "training": False},
                                              {"role": "assistant", "content": "ok"}]


def test_what_is_not_a_list_of_rows_is_refused():
    assert "pass one split, e.g. data['train']" in error_of(
        read_preference, DatasetDict({"train": Dataset.from_list([{"chosen": "a b", "rejected": "a c"}])}))
    assert error_of(read_sft, [{"text": "fine"}, ["not", "a", "dict"]]) == \
        "row 1: expected a dict of fields, got a list"
    assert error_of(read_sft, []) == "no rows were given (the data set is empty)"


# ----------------------------------------------------------------------------------------- bad rows

@pytest.mark.parametrize("bad, message", [
    ({"chosen": "cats purr", "rejected": "dogs bark"},
     "'chosen' and 'rejected' share no beginning, so there is no prompt"),
    ({"chosen": "Answer: ", "rejected": "Answer: 4"}, "'chosen' has nothing after the prompt it shares"),
    ({"chosen": SKY + BLUE, "rejected": [{"role": "user", "content": "Sea?"}, *GREEN]},
     "'chosen' and 'rejected' share no leading messages before an assistant reply, so there is no prompt"),
    ({"chosen": "\n\nHuman: Hi\n\nAssistant: yo", "rejected": "\n\nHuman: Ho\n\nAssistant: yo"},
     "'chosen' and 'rejected' share no turns up to an '\\n\\nAssistant:' reply, so there is no prompt"),
    ({"prompt": SKY, "chosen": [{"role": "user", "content": "and?"}, *BLUE], "rejected": GREEN},
     "'chosen' must start with the assistant's reply, got a 'user' message first"),
    ({"prompt": SKY, "chosen": BLUE + [{"role": "user", "content": "ok"}], "rejected": GREEN},
     "'chosen' must end with an assistant message, got a 'user' message last"),
    ({"prompt": [{"role": "user", "content": "  "}], "chosen": BLUE, "rejected": GREEN},
     "'prompt' is empty (every message's content is blank)"),
    ({"prompt": SKY, "chosen": BLUE, "rejected": [{"role": "assistant", "content": "It is blue. "}]},
     "'chosen' and 'rejected' are the same text"),
    ({"prompt": SKY, "chosen": BLUE, "rejected": [{"role": "assistant", "content": 7}]},
     "'rejected'[0] must be an object with string 'role' and 'content'"),
    ({"prompt": 3, "chosen": "a", "rejected": "b"},
     "'prompt' must be a string or a list of {role, content} messages, got a number (3)"),
])
def test_a_bad_conversational_or_implicit_pair_names_file_line_and_field(tmp_path, bad, message):
    path = write(tmp_path / "pairs.jsonl.gz", {"prompt": "2+2?", "chosen": "4", "rejected": "5"}, bad)
    msg = error_of(read_preference, path)
    assert msg.startswith(f"{path}:2: ") and message in msg and "\n" not in msg.replace("\\n", "")


@pytest.mark.parametrize("bad, message", [
    ({"text": 5}, "'text' must be a string, got a number (5)"),
    ({"text": " \n"}, "'text' is empty"),
    ({"text": "a", "messages": SKY + BLUE}, "the row has 'messages' and 'text'; keep one format"),
    ({"prompt": SKY, "completion": [{"role": "user", "content": "more"}]},
     "'completion' must start with the assistant's reply, got a 'user' message first"),
    ({"prompt": SKY, "completion": []}, "'completion' must be a non-empty list of turns, got []"),
    ({"prompt": [], "completion": BLUE}, "'prompt' must be a non-empty list of turns, got []"),
])
def test_a_bad_sft_row_names_the_row_and_field(bad, message):
    assert error_of(read_sft, [{"text": "fine"}, bad]) == f"row 1: {message}"


# ----------------------------------------------------------------------------------------------- SFT rows

def test_sft_conversational_prompt_completion_trains_on_the_completion_only(tmp_path):
    prompt = SKY + [{"role": "assistant", "content": "Hm?"}, {"role": "user", "content": "The sky."}]
    path = write(tmp_path / "sft.jsonl", {"prompt": prompt, "completion": BLUE},
                 {"prompt": "What color is the sky?", "completion": BLUE}, {"text": "The sky is blue."})
    rows = read_sft(path)
    assert rows[0] == SFTRow([*SKY, {"role": "assistant", "content": "Hm?", "training": False},
                              {"role": "user", "content": "The sky."}, *BLUE], chat=True)
    assert rows[1] == SFTRow(SKY + BLUE, chat=True)
    assert rows[2] == SFTRow([], chat=False, text="The sky is blue.") and rows[2].source == f"{path}:3"


# ----------------------------------------------------------------------------------------------- encoding

def test_a_conversational_pair_is_the_templated_prompt_then_the_reply_with_loss_on_reply_and_end_of_turn(tok):
    rows = read_preference([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}])
    (pair,) = encode_preferences(rows, TextCodec(tok), 256, TruncationCounter())
    assert tok.decode(pair.prompt) == "<|im_start|>user\nWhat color is the sky?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(pair.chosen) == "It is blue.<|im_end|>"  # the template's newline after it is not kept
    assert masked(tok, pair.chosen, pair.chosen_mask) == "It is blue.<|im_end|>"
    assert masked(tok, pair.rejected, pair.rejected_mask) == "It is green.<|im_end|>"
    ids, _, loss = pair_batch([pair], 0, "cpu")
    assert tok.decode(ids[0][loss[0].bool()]) == "It is blue.<|im_end|>"
    # the same text as the older string form, so the two train alike
    older = read_preference([{"messages": SKY, "chosen": "It is blue.", "rejected": "It is green."}])
    (old,) = encode_preferences(older, TextCodec(tok), 256, TruncationCounter())
    assert (old.prompt, old.chosen) == (pair.prompt, pair.chosen)


def test_a_multi_turn_reply_has_loss_on_its_assistant_turns_only(tok):
    reply = [{"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Sure?"},
             {"role": "assistant", "content": "Yes."}]
    (pair,) = encode_preferences(read_preference([{"prompt": SKY, "chosen": reply, "rejected": GREEN}]),
                                 TextCodec(tok), 256, TruncationCounter())
    assert tok.decode(pair.chosen) == \
        "Blue.<|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\nYes.<|im_end|>"
    assert masked(tok, pair.chosen, pair.chosen_mask) == "Blue.<|im_end|>Yes.<|im_end|>"


def test_the_end_of_turn_token_is_found_when_it_is_not_the_end_of_sequence_token():
    tok = byte_tokenizer(eos="</s>")  # the template closes turns with <|im_end|>, as Gemma's does with <end_of_turn>
    (pair,) = encode_preferences(read_preference([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}]),
                                 TextCodec(tok), 256, TruncationCounter())
    assert masked(tok, pair.chosen, pair.chosen_mask) == "It is blue.<|im_end|>"
    (row,) = encode_sft(read_sft([{"messages": SKY + BLUE}]), TextCodec(tok), 256, TruncationCounter())
    assert masked(tok, row.ids, row.mask) == "It is blue.<|im_end|>"  # <|im_start|> opens turns: never loss


def test_an_empty_hh_reply_trains_its_end_of_turn_token(tok):
    rows = read_preference([{"chosen": "\n\nHuman: Swear!\n\nAssistant: ",
                             "rejected": "\n\nHuman: Swear!\n\nAssistant: No way."}])
    (pair,) = encode_preferences(rows, TextCodec(tok), 256, TruncationCounter())
    assert tok.decode(pair.chosen) == "<|im_end|>" and pair.chosen_mask == [1]


def test_sft_text_rows_have_loss_on_every_token_and_prompt_completion_on_the_completion(tok):
    prompt = SKY + [{"role": "assistant", "content": "Hm?"}, {"role": "user", "content": "The sky."}]
    rows = read_sft([{"text": "The sky is blue."}, {"prompt": prompt, "completion": BLUE}])
    text, conv = encode_sft(rows, TextCodec(tok), 256, TruncationCounter())
    assert tok.decode(text.ids) == "The sky is blue.<|im_end|>" and text.mask == [1] * len(text.ids)  # no template
    assert masked(tok, conv.ids, conv.mask) == "It is blue.<|im_end|>"  # not the prompt's "Hm?"


def test_truncation_of_the_new_forms_is_counted_never_dropped(tok):
    long_prompt = [{"role": "user", "content": "What color is the sky? " * 20}]
    pairs = read_preference([{"prompt": long_prompt, "chosen": BLUE, "rejected": GREEN},
                             {"prompt": SKY, "chosen": BLUE, "rejected": GREEN}])
    counter = TruncationCounter()
    out = encode_preferences(pairs, TextCodec(tok), 40, counter)
    assert (counter.rows, counter.truncated) == (2, 1) and len(out) == 2
    assert all(len(p.prompt) + len(p.chosen) <= 40 and len(p.chosen) == len(p.chosen_mask) for p in out)
    assert tok.decode(out[0].chosen) == "It is blue.<|im_end|>"  # the prompt's start went first
    counter = TruncationCounter()
    rows = encode_sft(read_sft([{"text": "The sky is blue. " * 30}, {"text": "short"}]), TextCodec(tok), 16, counter)
    assert str(counter) == "1 of 2 rows truncated (50.0%)" and len(rows[0].ids) == 16 == len(rows[0].mask)


def test_a_conversational_row_without_a_chat_template_names_its_line(tmp_path, tok):
    path = write(tmp_path / "hh.jsonl", {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
                 {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello", "rejected": "\n\nHuman: Hi\n\nAssistant: Go away"})
    with pytest.raises(DataError) as e:
        encode_preferences(read_preference(path), TextCodec(tok, chat=False), 64, TruncationCounter())
    assert str(e.value).startswith(f"{path}:2: a conversational prompt (a list of messages) needs an hf tokenizer "
                                   f"with a chat template and data.chat=true (read_preference(..., dialogue='text')")
    plain = encode_preferences(read_preference(path, dialogue="text"), TextCodec(tok, chat=False), 64,
                               TruncationCounter())
    assert tok.decode(plain[1].prompt) == "\n\nHuman: Hi\n\nAssistant:"
    assert tok.decode(plain[1].chosen) == " Hello<|im_end|>"
    with pytest.raises(DataError, match=r"^row 0: a conversation \(messages\) needs an hf tokenizer"):
        encode_sft(read_sft([{"messages": SKY + BLUE}]), TextCodec(tok, chat=False), 64, TruncationCounter())


def test_a_chat_template_that_refuses_a_row_names_the_row():
    tok = byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role "
                         "not supported') }}{% endif %}{{ m['content'] }}{% endfor %}")
    rows = read_preference([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN},
                            {"prompt": [{"role": "system", "content": "Be brief."}, *SKY], "chosen": BLUE,
                             "rejected": GREEN}])
    with pytest.raises(DataError, match=r"^row 1: System role not supported$"):
        encode_preferences(rows, TextCodec(tok), 64, TruncationCounter())


# ----------------------------------------------------------------------------------------------- training

QUIET = ["run.progress=false", "run.tensorboard=false", "run.threads=1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-formats")
    save_tiny_llama(root / "model", max_positions=128)
    return root / "model"


def _cfg(model_dir, run_dir, trainer, train_file, eval_file):
    return load_config(None, [f"run.trainer={trainer}", f"run.dir={run_dir}", "model.type=hf",
                              f"model.path={model_dir}", *QUIET, f"data.train_file={train_file}",
                              f"data.eval_file={eval_file}", "data.batch_size=4", "data.max_length=64",
                              "train.max_steps=2", "train.eval_every=2", "train.ckpt_every=2", "train.log_every=1",
                              "optim.lr=1e-2"])


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dpo_trains_two_steps_on_hh_rlhf_gzip_and_conversational_pairs(model_dir, tmp_path):
    from lmrl.train.dpo_trainer import DPOTrainer

    train = write(tmp_path / "hh.jsonl.gz", *hh_rows(8))  # real HH-RLHF dialogues: conversational rows
    held_out = write(tmp_path / "eval.jsonl", *[{"prompt": [{"role": "user", "content": f"What is {a}+1?"}],
                                                 "chosen": [{"role": "assistant", "content": f"yes {a + 1}"}],
                                                 "rejected": [{"role": "assistant", "content": f"no {a + 1}"}]}
                                                for a in range(4)])
    trainer = DPOTrainer(_cfg(model_dir, tmp_path / "run", "dpo", train, held_out))
    assert len(trainer.train_rows) == 8 and len(trainer.eval_rows) == 4
    assert f"{train}: 8 of 8 rows truncated (100.0%)" in trainer.data_notes  # 64 tokens: every dialogue is cut
    batch = trainer.collate(trainer.eval_rows[:1])  # one row: the prompt, then each reply after it
    assert [trainer.tokenizer.decode(batch.targets[batch.sides == side]) for side in (0, 1)] == \
        ["yes 1<|im_end|>", "no 1<|im_end|>"]  # the tokens scored: each reply and its end of turn
    summary = trainer.train()
    rows = _metrics(tmp_path / "run")
    assert summary["steps_done"] == 2 and rows[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert 0 <= rows[-1]["eval/accuracy"] <= 1 and math.isfinite(rows[-1]["dpo/loss"])


def test_sft_trains_two_steps_on_text_and_conversational_prompt_completion_rows(model_dir, tmp_path):
    from lmrl.train.sft_trainer import SFTTrainer

    rows = [{"text": f"What is {a}+1? yes {a + 1}"} for a in range(4)] + \
           [{"prompt": [{"role": "user", "content": f"What is {a}+2?"}],
             "completion": [{"role": "assistant", "content": f"yes {a + 2}"}]} for a in range(4)]
    train = write(tmp_path / "sft.jsonl.gz", *rows)
    trainer = SFTTrainer(_cfg(model_dir, tmp_path / "run", "sft", train, train))
    text_row, conv_row = trainer.train_rows[0], trainer.train_rows[4]
    assert text_row.mask == [1] * len(text_row.ids)
    assert trainer.tokenizer.decode([t for t, m in zip(conv_row.ids, conv_row.mask) if m]) == "yes 2<|im_end|>"
    summary = trainer.train()
    losses = [r["sft/loss"] for r in _metrics(tmp_path / "run") if "sft/loss" in r]
    assert summary["steps_done"] == 2 and len(losses) == 2 and all(loss > 0 for loss in losses)
