"""RL prompts longer than `task.max_prompt_length` are cut to their last tokens, as TRL's
max_prompt_length cut them, and one line names the file, the row and the length (issue 45)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from lmrl.config import load_config  # noqa: E402
from lmrl.tasks import build_task  # noqa: E402
from lmrl.tasks.math_task import MathTask  # noqa: E402
from lmrl.tasks.prompt_task import PromptTask  # noqa: E402
from tests.test_hf import _tokenizer  # noqa: E402

HUGE = "1 + 1 = ? " * 100_000  # a 1 MB prompt: the run made no step in 600 s and grew past 5.8 GB


@pytest.fixture(scope="module")
def tokenizer():
    return _tokenizer()[1]


@pytest.fixture
def files(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in [{"prompt": "1 + 1 = ?", "ground_truth": "2"},
                                                        {"prompt": HUGE + "2 + 2 = ?", "ground_truth": "4"}]) + "\n")
    test.write_text(json.dumps({"prompt": "3 + 3 = ?", "ground_truth": "6"}) + "\n")
    return train, test


def test_a_math_prompt_past_max_prompt_length_keeps_its_last_tokens_and_one_line_says_so(tokenizer, files):
    train, test = files
    task = MathTask(str(train), str(test), tokenizer, chat=False, max_prompt_length=32)
    short, cut, held_out = task.prompt_texts
    assert (short, held_out) == ("1 + 1 = ?", "3 + 3 = ?")  # short prompts are untouched
    assert cut.endswith("2 + 2 = ?") and len(tokenizer(cut, add_special_tokens=False)["input_ids"]) <= 32
    assert len(task.notes) == 1
    note = task.notes[0]
    assert "\n" not in note
    assert note.startswith("task.max_prompt_length=32: 1 of 3 prompts keep their last 32 tokens")
    assert f"{train}:2 ({len(HUGE) + 9:,} characters)" in note


def test_without_a_limit_nothing_is_cut(tokenizer, files):
    task = MathTask(str(files[0]), str(files[1]), tokenizer, chat=False, max_prompt_length=0)
    assert task.prompt_texts[1] == HUGE + "2 + 2 = ?" and task.notes == []


def test_open_prompts_are_cut_the_same_way(tokenizer, files):
    task = PromptTask(str(files[0]), str(files[1]), tokenizer, scorer=None, chat=False, max_prompt_length=16)
    assert len(tokenizer(task.prompt_texts[1], add_special_tokens=False)["input_ids"]) <= 16
    assert f"{files[0]}:2" in task.notes[0]


def test_a_chat_prompt_keeps_its_bos_text_after_the_cut(files):
    tok = _tokenizer(chat_template="<s>{% for m in messages %}{{ m['content'] }}{% endfor %}")[1]
    task = MathTask(str(files[0]), str(files[1]), tok, chat=True, max_prompt_length=32)
    assert all(p.startswith("<s>") for p in task.prompt_texts)  # else a batch would get BOS twice
    assert len(tok(task.prompt_texts[1], add_special_tokens=False)["input_ids"]) <= 32


def test_the_config_key_and_trls_name_reach_the_task(tokenizer, files):
    train, test = files
    cfg = load_config("math-grpo-smollm2", [f"task.train_file={train}", f"task.test_file={test}", "task.chat=false",
                                            "max_prompt_length=24"])
    assert cfg.task.max_prompt_length == 24
    assert load_config("math-grpo-smollm2").task.max_prompt_length == 512  # TRL's old GRPOConfig default
    task = build_task(cfg, tokenizer=tokenizer)
    assert len(tokenizer(task.prompt_texts[1], add_special_tokens=False)["input_ids"]) <= 24
