"""The offline trainers' data columns under other names: data.prompt_key, data.response_key,
data.messages_key, data.chosen_key and data.rejected_key (and OpenRLHF's and verl's names for them)
read a file whose columns are named otherwise into the rows the default names give, train on it to the
same loss, and a row missing a renamed column is one `path:line` error naming it. The prompt's column
is task.prompt_key in an RL run and data.prompt_key in an offline one, whichever tool's name sets it."""

from __future__ import annotations

import json

import pytest

from lmrl.common.data import DataError, write_jsonl
from lmrl.config import ConfigError, config_to_dict, describe_config, load_config
from lmrl.tasks.preference_data import Columns, read_preference, read_sft
from lmrl.train.dpo_trainer import DPOTrainer
from lmrl.train.plan import sequence_lengths
from lmrl.train.reward_trainer import RewardTrainer
from lmrl.train.sft_trainer import SFTTrainer
from tests.test_hf import save_tiny_llama

QUIET = ["run.progress=false", "run.tensorboard=false", "run.threads=1"]
PAIRS = [{"prompt": f"What is {a}+{b}?", "chosen": f"yes {a + b}", "rejected": f"no {a + b}"}
         for a in range(3) for b in range(2)]
RENAMED_PAIRS = [{"question": p["prompt"], "better": p["chosen"], "worse": p["rejected"]} for p in PAIRS]
SFT = [{"prompt": p["prompt"], "response": p["chosen"]} for p in PAIRS]
RENAMED_SFT = [{"question": p["prompt"], "answer": p["chosen"]} for p in PAIRS]
CHATS = [{"messages": [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["chosen"]}]}
         for p in PAIRS]
RENAMED_CHATS = [{"dialog": row["messages"]} for row in CHATS]


def _messages(prompt: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]


# -- the readers ---------------------------------------------------------------------------------------
def test_sft_rows_under_other_columns_are_the_rows_the_default_names_give():
    columns = Columns(prompt="question", response="answer", messages="dialog", text="body")
    default = read_sft(SFT + CHATS + [{"text": "the sky is blue"}])
    renamed = read_sft(RENAMED_SFT + RENAMED_CHATS + [{"body": "the sky is blue"}], columns=columns)
    assert renamed == default and len(renamed) == 2 * len(PAIRS) + 1
    # a dotted name reaches into a nested object; TRL's completion is not read under a renamed response column
    nested = [{"q": {"text": p["prompt"]}, "a": {"text": p["chosen"]}, "completion": "ignored"} for p in PAIRS]
    assert read_sft(nested, columns=Columns(prompt="q.text", response="a.text")) == read_sft(SFT)


def test_parquet_files_give_the_rows_their_jsonl_twins_give(tmp_path):
    """The offline trainers read parquet as RL's tasks do (verl's and datasets' files), nulls as absent keys."""
    from tests.test_verl_openrlhf import write_parquet

    mixed = SFT + [{"text": "the sky is blue"}]  # a column the other rows lack: null in their parquet cells
    for name, rows, read in (("sft", mixed, read_sft), ("pairs", RENAMED_PAIRS, read_preference)):
        jsonl, parquet = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.parquet"
        write_jsonl(jsonl, rows)
        write_parquet(parquet, rows)
        renamed = Columns(prompt="question", chosen="better", rejected="worse")
        columns = {"columns": renamed} if name == "pairs" else {}
        assert read(str(parquet), **columns) == read(str(jsonl), **columns) and len(read(str(parquet), **columns))
    write_parquet(tmp_path / "bad.parquet", [{"question": "q", "better": "a"}])
    with pytest.raises(DataError, match=r"bad\.parquet:row 0: missing key 'worse' \(data\.rejected_key\)"):
        read_preference(str(tmp_path / "bad.parquet"), columns=Columns(prompt="question", chosen="better",
                                                                       rejected="worse"))


def test_preference_rows_under_other_columns_are_the_rows_the_default_names_give():
    columns = Columns(prompt="question", messages="history", chosen="better", rejected="worse")
    assert read_preference(RENAMED_PAIRS, columns=columns) == read_preference(PAIRS)
    conversational = [{"messages": [{"role": "user", "content": p["prompt"]}],
                       "chosen": [{"role": "assistant", "content": p["chosen"]}],
                       "rejected": [{"role": "assistant", "content": p["rejected"]}]} for p in PAIRS]
    history = [{"history": row["messages"], "better": row["chosen"], "worse": row["rejected"]}
               for row in conversational]
    assert read_preference(history, columns=columns) == read_preference(conversational)
    # whole conversations with the default prompt column: the shared turns are the prompt, as with TRL's names
    implicit = [{"chosen": _messages(p["prompt"], p["chosen"]), "rejected": _messages(p["prompt"], p["rejected"])}
                for p in PAIRS]
    renamed = [{"better": row["chosen"], "worse": row["rejected"]} for row in implicit]
    assert read_preference(renamed, columns=Columns(chosen="better", rejected="worse")) == read_preference(implicit)
    nested = [{"meta": {"q": p["prompt"]}, "pair": {"c": p["chosen"], "r": p["rejected"]}} for p in PAIRS]
    assert read_preference(nested, columns=Columns(prompt="meta.q", chosen="pair.c", rejected="pair.r")) == \
        read_preference(PAIRS)


@pytest.mark.parametrize("rows, columns, reader, line", [
    (RENAMED_PAIRS[:1] + [{"prompt": "What?", "better": "yes", "worse": "no"}],
     Columns(prompt="question", chosen="better", rejected="worse"), read_preference,
     "missing key 'question' (data.prompt_key) (the row has keys: 'prompt', 'better', 'worse')"),
    (RENAMED_PAIRS[:1] + [{"question": "What?", "chosen": "yes", "worse": "no"}],
     Columns(prompt="question", chosen="better", rejected="worse"), read_preference,
     "missing key 'better' (data.chosen_key) (the row has keys: 'question', 'chosen', 'worse')"),
    (RENAMED_PAIRS[:1] + [{"question": "What?"}], Columns(prompt="question", chosen="better", rejected="worse"),
     read_preference, "missing keys 'better' (data.chosen_key), 'worse' (data.rejected_key) (the row has keys: "
                      "'question')"),
    (RENAMED_SFT[:1] + [{"question": "What?", "response": "yes"}], Columns(prompt="question", response="answer"),
     read_sft, "missing key 'answer' (data.response_key) (the row has keys: 'question', 'response')"),
    (RENAMED_SFT[:1] + [{"prompt": "What?", "answer": "yes"}], Columns(prompt="question", response="answer"),
     read_sft, "needs one of 'question' (data.prompt_key) + 'answer' (data.response_key) | 'messages' | "
               "'conversations' | 'text' (the row has keys: 'prompt', 'answer')"),
])
def test_a_row_missing_a_renamed_column_is_one_line_naming_file_line_and_key(tmp_path, rows, columns, reader, line):
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(DataError) as e:
        reader(path, columns=columns)
    assert str(e.value) == f"{path}:2: {line}"


def test_other_errors_name_the_renamed_columns():
    columns = Columns(chosen="better", rejected="worse")
    with pytest.raises(DataError, match=r"^row 0: 'better' and 'worse' are the same text"):
        read_preference([{"prompt": "What?", "better": "yes", "worse": "yes"}], columns=columns)
    with pytest.raises(DataError, match=r"^row 0: 'better' and 'worse' share no beginning, so there is no prompt .*"
                                        r"give a 'prompt'$"):
        read_preference([{"better": "yes", "worse": "no"}], columns=columns)


# -- the config: the keys, and the other tools' names by the run's kind --------------------------------
@pytest.mark.parametrize("override, message", [
    ("data.chosen_key=rejected", "data.chosen_key and data.rejected_key both name 'rejected'; a pair's two replies "
                                 "are two columns"),
    ("data.response_key=", "data.response_key must name a column of the rows (got '')"),
])
def test_a_column_key_that_cannot_name_the_columns_is_refused(override, message):
    with pytest.raises(ConfigError) as e:
        load_config("dpo-smollm2", [override])
    assert str(e.value) == message


@pytest.mark.parametrize("override", ["input_key=question", "prompt_key=question", "data.prompt_key=question"])
def test_a_name_for_the_prompts_column_sets_the_key_of_the_runs_kind(override):
    rl = load_config("math-grpo-smollm2", [override])
    assert (rl.task.prompt_key, rl.data.prompt_key) == ("question", "prompt")
    for preset in ("sql-sft-smollm2", "dpo-smollm2", "rm-smollm2"):
        offline = load_config(preset, [override])
        assert (offline.task.prompt_key, offline.data.prompt_key) == ("prompt", "question")
    # the same command line decides the kind, wherever it sets run.trainer
    assert load_config("math-grpo-smollm2", [override, "run.trainer=sft"]).data.prompt_key == "question"


def test_a_yaml_file_for_an_offline_run_reads_verls_and_openrlhfs_column_names(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("base: math-grpo-smollm2\ninput_key: question\noutput_key: answer\ndata:\n  multiturn:\n"
                    "    messages_key: dialog\nrun:\n  trainer: sft\n")
    cfg = load_config(path)
    assert (cfg.data.prompt_key, cfg.data.response_key, cfg.data.messages_key) == ("question", "answer", "dialog")
    assert cfg.task.prompt_key == "prompt" and len(cfg.aliases) == 3


def test_a_config_that_writes_every_key_loads_back_as_it_was(tmp_path):
    # a saved config.yaml and `lmrl config`'s output hold data.prompt_key beside task.prompt_key: in an RL run
    # each is its own key there, not verl's name for task.prompt_key
    cfg = load_config("math-grpo-smollm2", ["task.prompt_key=question"])
    path = tmp_path / "config.yaml"
    path.write_text(describe_config(cfg))
    assert config_to_dict(load_config(path)) == config_to_dict(cfg)
    with pytest.raises(ConfigError, match=r"^data.prompt_key=input is for the offline trainers"):
        load_config("math-grpo-smollm2", ["task.prompt_key=question", "data.prompt_key=input"])


@pytest.mark.parametrize("preset, overrides, message", [
    ("sql-sft-smollm2", ["data.chosen_key=better"], "data.chosen_key=better is for run.trainer=dpo or reward; "
                                                    "run.trainer=sft does not read it"),
    ("sql-sft-smollm2", ["rejected_key=worse"], "data.rejected_key=worse is for run.trainer=dpo or reward; "
                                                "run.trainer=sft does not read it"),
    ("dpo-smollm2", ["output_key=answer"], "data.response_key=answer is for run.trainer=sft; run.trainer=dpo does "
                                           "not read it"),
    ("math-grpo-smollm2", ["task.prompt_key=question", "data.prompt_key=input"],
     "data.prompt_key=input is for the offline trainers (run.trainer=sft, dpo, reward); run.trainer=rl does not "
     "read it (an RL run's is task.prompt_key)"),
])
def test_a_column_key_the_run_does_not_read_is_refused_naming_the_trainers_that_do(preset, overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(preset, overrides)
    assert str(e.value) == message


# -- the trainers ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("offline-keys")
    save_tiny_llama(root / "model", max_positions=128)
    for name, rows in {"pairs": PAIRS, "renamed_pairs": RENAMED_PAIRS, "sft": SFT, "renamed_sft": RENAMED_SFT,
                       "chats": CHATS, "renamed_chats": RENAMED_CHATS}.items():
        write_jsonl(root / f"{name}.jsonl", rows)
    return root


def _run(root, run_dir, trainer_cls, trainer: str, data: str, *overrides, config=None) -> tuple[list, float]:
    """(the encoded training rows, the first step's loss) of a one-step run on `data`.jsonl."""
    cfg = load_config(config, [f"run.trainer={trainer}", f"run.dir={run_dir}", "model.type=hf",
                               f"model.path={root / 'model'}", *QUIET, f"data.train_file={root / data}.jsonl",
                               "data.batch_size=4", "data.max_length=64", "train.max_steps=1", "train.log_every=1",
                               "train.evaluate=false", "optim.lr=1e-2", *overrides])
    t = trainer_cls(cfg)
    rows = list(t.train_rows)
    t.train()
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return rows, first["loss"]


SFT_SPELLINGS = [["data.prompt_key=question", "data.response_key=answer"],  # lmrl's keys, verl's SFT names
                 ["input_key=question", "output_key=answer"],  # OpenRLHF's flags
                 ["data.input_key=question", "data.output_key=answer"]]  # OpenRLHF's newer dotted names


def test_sft_trains_on_renamed_columns_as_on_the_default_names(root, tmp_path):
    rows, loss = _run(root, tmp_path / "default", SFTTrainer, "sft", "sft")
    for i, spelled in enumerate(SFT_SPELLINGS):
        assert _run(root, tmp_path / f"renamed{i}", SFTTrainer, "sft", "renamed_sft", *spelled) == (rows, loss)
    rows, loss = _run(root, tmp_path / "chats", SFTTrainer, "sft", "chats")
    assert _run(root, tmp_path / "dialog", SFTTrainer, "sft", "renamed_chats", "data.messages_key=dialog") == \
        (rows, loss)
    verl = tmp_path / "verl.yaml"  # verl's nested spelling
    verl.write_text("data:\n  multiturn:\n    messages_key: dialog\n")
    assert _run(root, tmp_path / "verl", SFTTrainer, "sft", "renamed_chats", config=verl) == (rows, loss)


PAIR_SPELLINGS = [["data.prompt_key=question", "data.chosen_key=better", "data.rejected_key=worse"],
                  ["prompt_key=question", "chosen_key=better", "rejected_key=worse"],  # OpenRLHF's reward model, DPO
                  ["input_key=question", "data.chosen_key=better", "data.rejected_key=worse"]]


@pytest.mark.parametrize("trainer_cls, trainer", [(DPOTrainer, "dpo"), (RewardTrainer, "reward")])
def test_dpo_and_the_reward_model_train_on_renamed_columns_as_on_the_default_names(root, tmp_path, trainer_cls,
                                                                                   trainer):
    rows, loss = _run(root, tmp_path / "default", trainer_cls, trainer, "pairs")
    for i, spelled in enumerate(PAIR_SPELLINGS):
        assert _run(root, tmp_path / f"renamed{i}", trainer_cls, trainer, "renamed_pairs", *spelled) == (rows, loss)


@pytest.mark.parametrize("trainer, default, renamed, spelled", [
    ("sft", "sft", "renamed_sft", SFT_SPELLINGS[1]), ("sft", "chats", "renamed_chats", ["data.messages_key=dialog"]),
    ("dpo", "pairs", "renamed_pairs", PAIR_SPELLINGS[1]), ("reward", "pairs", "renamed_pairs", PAIR_SPELLINGS[0])])
def test_lmrl_plan_measures_renamed_columns_as_the_default_names(root, trainer, default, renamed, spelled):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(root / "model")

    def lengths(data: str, *overrides):
        cfg = load_config(None, [f"run.trainer={trainer}", "model.type=hf", f"model.path={root / 'model'}",
                                 f"data.train_file={root / data}.jsonl", "data.max_length=64", *overrides])
        found = sequence_lengths(cfg, tokenizer)
        return found.prompt, found.completion

    assert lengths(renamed, *spelled) == lengths(default) and lengths(default)[1] > 2  # a reply's tokens counted


def test_a_training_row_missing_a_renamed_column_stops_the_run_before_the_model_loads(root, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "bad.jsonl", RENAMED_PAIRS[:2] + [{"better": "yes", "worse": "no"}])

    def no_model(self):
        raise AssertionError("the model was built before the data was checked")

    monkeypatch.setattr(DPOTrainer, "build_model", no_model)
    cfg = load_config(None, ["run.trainer=dpo", f"run.dir={tmp_path / 'run'}", f"data.train_file={path}",
                             "prompt_key=question", "chosen_key=better", "rejected_key=worse"])
    with pytest.raises(DataError) as e:
        DPOTrainer(cfg)
    assert str(e.value) == f"{path}:3: missing key 'question' (data.prompt_key) (the row has keys: 'better', 'worse')"
