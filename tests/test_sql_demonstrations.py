"""Demonstrations for the SQL agent's supervised warm-up: scripted episodes in the real environment,
written as SFT rows, trained on, and the exported model as RL's starting point. A tiny Llama built
here, no hub."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from lmrl.cli import main
from lmrl.config import ConfigError, load_config
from lmrl.common.data import DataError
from lmrl.tasks.preference_data import TruncationCounter, read_sft
from lmrl.tasks.sql.agent_task import SQLAgentTask, episode_preamble
from lmrl.tasks.sql.demonstrations import DemoStats, demonstration, demonstrations, write_demo_splits
from lmrl.tasks.sql.env import SQLEnv, SQLEnvConfig
from lmrl.tasks.sql.procedural import SKILLS, ProceduralSQLTasks, is_heldout
from lmrl.tasks.text_batches import TextCodec, encode_sft
from tests.test_hf import save_tiny_llama

ENV = SQLEnvConfig(max_rounds=3, max_chars=300)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sql-demos")
    save_tiny_llama(root / "model", max_positions=2048)  # its byte-level tokenizer: ~1,300 tokens a demonstration
    return root / "model"


def replay(task, messages, env_config=ENV):
    """Plays a demonstration's agent turns in a fresh environment; checks each observation is the
    one recorded. Returns the episode's last info."""
    env = SQLEnv(env_config)
    start = len(episode_preamble(env_config))
    assert messages[start] == {"role": "user", "content": env.reset(task)}
    info = None
    for k in range(start + 1, len(messages), 2):
        assert messages[k]["role"] == "assistant"
        observation, _, done, info = env.step(messages[k]["content"])
        if k + 1 < len(messages):
            assert not done and messages[k + 1] == {"role": "user", "content": observation}
        else:
            assert done
    return info


@pytest.mark.parametrize("skill", SKILLS)
def test_every_skills_demonstration_replays_in_the_env_to_the_correct_answer_reward(skill):
    for task, messages in demonstrations(5, ENV, seed=3, skills=(skill,)):
        assert task.skill == skill and task.reference_sql in messages[-3]["content"]
        info = replay(task, messages)
        assert info["outcome"] == "correct" and info["episode_reward"] == ENV.reward_correct
        assert info["invalid_actions"] == 0 and info["rounds"] == 2
        if task.is_modification:
            assert messages[-1]["content"].endswith("Final Answer: []")


def test_a_demonstration_opens_with_the_agent_tasks_own_messages(tiny_dir):
    from transformers import AutoTokenizer

    task = SQLAgentTask(AutoTokenizer.from_pretrained(tiny_dir), replace(ENV, train_tasks=3, heldout_per_skill=1))
    messages, _ = demonstration(task.tasks[0], ENV)
    assert messages[:len(task.preamble)] == task.preamble
    assert [m.get("training", True) for m in messages if m["role"] == "assistant"] == [False, False, True, True]


def test_a_task_whose_scripted_episode_is_not_rewarded_is_skipped_and_counted():
    task = ProceduralSQLTasks(seed=0, skills=("filter",)).take(1)[0]
    assert demonstration(task, ENV)[0] is not None
    messages, why = demonstration(task, SQLEnvConfig(max_rounds=3, max_chars=5))  # every result cut: unreadable
    assert messages is None and "max_chars" in why
    stats = DemoStats()
    with pytest.raises(RuntimeError, match="no demonstrable"):
        demonstrations(1, SQLEnvConfig(max_rounds=3, max_chars=5), skills=("filter",), stats=stats)
    assert sum(stats.skipped.values()) > 0
    with pytest.raises(ValueError, match="2 turns"):
        demonstration(task, SQLEnvConfig(max_rounds=1))


def test_demonstrations_use_training_tasks_only_and_train_and_test_share_none(tmp_path, tiny_dir):
    from transformers import AutoTokenizer

    train, test, stats = write_demo_splits(tmp_path, 48, 24, ENV, seed=5)
    rows = {name: [json.loads(line) for line in path.read_text().splitlines()] for name, path in
            (("train", train), ("test", test))}
    assert len(rows["train"]) == 48 and len(rows["test"]) == 24
    assert dict(stats.train) == {s: 4 for s in SKILLS} and dict(stats.test) == {s: 2 for s in SKILLS}
    ids = {name: {r["task_id"] for r in split} for name, split in rows.items()}
    assert len(ids["train"]) == 48 and not ids["train"] & ids["test"]
    # the agent task's held-out set (the benchmark's) holds none of them
    agent = SQLAgentTask(AutoTokenizer.from_pretrained(tiny_dir), replace(ENV, train_tasks=1))
    heldout = {agent.tasks[i].id for i in agent.heldout_ids.tolist()}
    assert not (ids["train"] | ids["test"]) & heldout
    for task, _ in demonstrations(60, ENV, seed=5):
        assert not is_heldout(task)


def test_demo_rows_load_through_the_sft_reader_with_loss_on_the_agents_two_turns_only(tmp_path, tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    train, _, _ = write_demo_splits(tmp_path, 12, 12, ENV)
    rows = read_sft(train)
    assert len(rows) == 12 and all(r.chat for r in rows)
    examples = encode_sft(rows, TextCodec(tok), 4096, TruncationCounter())
    for row, ex in zip(rows, examples):
        trained = tok.decode([t for t, m in zip(ex.ids, ex.mask) if m])
        # the two agent turns, each with its end-of-turn token; not the system prompt, the task, the
        # observation or the worked example's turns (compared through the tiny tokenizer, which drops
        # the characters it has no token for)
        turns = row.messages[-3]["content"] + "<|im_end|>" + row.messages[-1]["content"] + "<|im_end|>"
        assert trained == tok.decode(tok(turns, add_special_tokens=False)["input_ids"])


def test_an_sft_row_whose_assistant_turns_all_say_training_false_is_refused(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a", "training": False}]}) + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl:1: every assistant turn"):
        read_sft(path)
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a", "training": "no"}]}) + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl:1: 'messages'\[1\] 'training' must be true or false"):
        read_sft(path)


def test_lmrl_data_sql_demos_writes_train_and_test_files(tmp_path, capsys):
    assert main(["data", "sql-demos", str(tmp_path / "demos"), "--train", "24", "--test", "12", "--seed", "2"]) == 0
    assert "24 train and 12 test demonstrations" in capsys.readouterr().out
    rows = read_sft(tmp_path / "demos" / "train.jsonl")
    # played in the RL preset's env: its round limit is in the system prompt
    rounds = load_config("sql-agent-smollm2").sql.max_rounds
    assert f"at most {rounds} rounds" in rows[0].messages[0]["content"]
    assert len(read_sft(tmp_path / "demos" / "test.jsonl")) == 12


def test_sql_demos_generation_needs_two_rounds():
    with pytest.raises(ConfigError, match="sql.max_rounds must be >= 2"):
        load_config("sql-sft-smollm2", ["sql.max_rounds=1"])


def test_sft_on_demonstrations_then_rl_from_its_exported_model(tiny_dir, tmp_path):
    """The warm-up writes its demonstrations, trains, exports a merged model; RL loads that model
    with a fresh adapter, so its starting point (and its KL reference) is the SFT model."""
    from transformers import AutoModelForCausalLM

    from lmrl.train.rl_trainer import RLTrainer
    from lmrl.train.sft_trainer import SFTTrainer

    common = ["lora.r=4", "lora.target_modules=[all-linear]", "sql.max_rounds=2", "sql.skills=[count, max, insert]",
              "run.tensorboard=false", "run.threads=1", "run.progress=false"]
    sft_cfg = load_config("sql-sft-smollm2", [
        *common, f"model.path={tiny_dir}", f"run.dir={tmp_path / 'sft'}", f"data.train_file={tmp_path}/demos/train.jsonl",
        f"data.eval_file={tmp_path}/demos/test.jsonl", "data.generate_train=6", "data.generate_test=3",
        "data.max_length=1600", "data.batch_size=3", "train.max_steps=2", "train.eval_every=1", "optim.lr=1e-2"])
    summary = SFTTrainer(sft_cfg).train()
    assert summary["steps_done"] == 2 and len(read_sft(tmp_path / "demos" / "train.jsonl")) == 6
    exported = tmp_path / "sft" / "model"
    assert (exported / "config.json").exists()

    rl = RLTrainer(load_config("sql-agent-smollm2", [
        *common, f"model.path={exported}", f"run.dir={tmp_path / 'rl'}", "task.max_new_tokens=8",
        "env.max_context=1800", "sql.train_tasks=6", "sql.heldout_per_skill=1", "train.steps=1",
        "train.rollout_size=2", "train.ga_steps=1", "train.eval_every=1", "eval.size=3", "eval.batch_size=3"]))
    merged = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    base = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
            for n, p in rl.model.model.named_parameters() if "lora_" not in n}
    assert base and all(torch.equal(p, merged[n]) for n, p in base.items())  # RL's base weights are SFT's
    rl_summary = rl.train()
    assert rl_summary["rl_steps"] == 1 and 0.0 <= rl_summary["final_accuracy"] <= 1.0
