"""RLHF on a tiny Llama: a reward model trained here scores open prompts for PPO, and the critic
starts as that reward model. Bad input: a reward model with another tokenizer."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.common.data import write_jsonl
from lmrl.models.reward_model import build_reward_model, load_reward_model
from lmrl.train.rl_trainer import RLTrainer
from lmrl.train.reward_trainer import RewardTrainer
from tests.test_hf import save_tiny_llama

QUIET = ["run.progress=false", "run.tensorboard=false", "run.threads=1"]


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    """A tiny policy dir, prompts, and a reward model trained from the same base to prefer 'yes'."""
    root = tmp_path_factory.mktemp("rlhf")
    save_tiny_llama(root / "model", max_positions=128)
    pairs = [{"prompt": f"What is {a}+{b}?", "chosen": "yes", "rejected": "no"} for a in range(4) for b in range(4)]
    write_jsonl(root / "pairs.jsonl", pairs)
    (root / "prompts").mkdir()
    write_jsonl(root / "prompts" / "train.jsonl", [{"prompt": p["prompt"]} for p in pairs[:12]])
    write_jsonl(root / "prompts" / "test.jsonl", [{"prompt": p["prompt"]} for p in pairs[12:]])
    summary = RewardTrainer(load_config(None, [
        "run.trainer=reward", f"run.dir={root / 'rm-run'}", "model.type=hf", f"model.path={root / 'model'}",
        f"data.train_file={root / 'pairs.jsonl'}", "data.batch_size=8", "train.max_steps=8", "optim.lr=1e-2",
        *QUIET])).train()
    return root, summary["exported"]


def _ppo(root, rm_dir, run_dir, *overrides):
    return load_config(None, [
        "model.type=hf", f"model.path={root / 'model'}", "task.name=prompts", "sft.steps=0",
        f"task.train_file={root / 'prompts' / 'train.jsonl'}", f"task.test_file={root / 'prompts' / 'test.jsonl'}",
        f"reward.model={rm_dir}", "algo.name=ppo", "algo.value_model=separate", "algo.kl_coef=0.05",
        "algo.kl_in_reward=true", "task.max_new_tokens=4", "train.steps=2", "train.rollout_size=4",
        "train.eval_every=1", "eval.size=4", "eval.batch_size=4",
        "lora.r=4", f"run.dir={run_dir}", *QUIET, *overrides])


def test_ppo_against_a_reward_model_starts_its_critic_as_the_reward_model(rm, tmp_path):
    root, rm_dir = rm
    trainer = RLTrainer(_ppo(root, rm_dir, tmp_path / "run"))
    trainer.build_rl_modules()
    reward_model, tok = load_reward_model(rm_dir)
    text = trainer.task.prompt_texts[0] + "yes"
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        _, values = trainer.module(ids, attention_mask=torch.ones_like(ids))
        score = reward_model(ids, torch.ones_like(ids))
    assert values[0, -1].item() == pytest.approx(score.item(), abs=1e-4)  # V(last token) = r(prompt + completion)

    trainer = RLTrainer(_ppo(root, rm_dir, tmp_path / "run2"))
    assert trainer.best_metric == "eval/reward"  # open prompts have no accuracy: best/ is picked by the reward
    summary = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run2" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/reward" in summary["final_eval"] and summary["best"]["value"] == max(
        r["eval/reward"] for r in rows if "eval/reward" in r)
    assert all("train/value_loss" in r for r in rows if "train/policy_loss" in r)


def test_a_reward_model_with_another_tokenizer_is_refused(rm, tmp_path):
    root, rm_dir = rm
    other = tmp_path / "other-rm"
    reward_model, tok = load_reward_model(rm_dir)
    tok.add_tokens(["<extra>"])
    reward_model.save(other)
    with pytest.raises(ConfigError, match="different tokenizer"):
        RLTrainer(_ppo(root, other, tmp_path / "run"))


def test_open_prompts_need_a_reward(rm, tmp_path):
    root, _ = rm
    with pytest.raises(ConfigError, match="task.name=prompts needs a reward: reward.model"):
        RLTrainer(_ppo(root, "", tmp_path / "run"))  # refused before the policy loads


def test_a_missing_reward_model_is_one_line_before_the_policy_loads(tmp_path, monkeypatch):
    # `lmrl train ppo-rm-smollm2` on a fresh clone loaded SmolLM2, then failed deep in transformers (issue 45)
    def no_policy(*args, **kwargs):
        raise AssertionError("the policy was loaded before the reward model was checked")

    monkeypatch.setattr("lmrl.train.build.build_model", no_policy)
    missing = tmp_path / "runs" / "rm-smollm2" / "reward_model"
    cfg = load_config("ppo-rm-smollm2", [f"reward.model={missing}", f"run.dir={tmp_path / 'run'}", *QUIET])
    with pytest.raises(ConfigError) as raised:
        RLTrainer(cfg)
    assert str(raised.value) == (f"reward.model={missing} does not exist: train one with `lmrl train rm-smollm2`, "
                                 f"or set reward.model= to a reward model dir")


def test_a_reward_model_for_a_task_with_its_own_verifier_is_refused_in_the_config():
    # the adder (or math) scores with its verifier: a reward model there would be ignored
    with pytest.raises(ConfigError) as raised:
        load_config("adder", ["reward.model=runs/rm-smollm2/reward_model"])
    assert str(raised.value) == ("reward.model scores tasks without a verifier of their own (task.name=prompts); "
                                 "task.name=addition is scored by its own verifier, which reward.funcs or reward.cls "
                                 "replace")
    with pytest.raises(ConfigError, match="^reward.model scores RL completions; run.trainer=dpo does not read it"):
        load_config("dpo-smollm2", ["reward.model=runs/rm-smollm2/reward_model"])
    assert load_config("ppo-rm-smollm2").reward.model == "runs/rm-smollm2/reward_model"


def test_a_reward_model_dir_without_its_score_head_is_refused_not_scored_at_random(tmp_path):
    save_tiny_llama(tmp_path / "rm")
    config = json.loads((tmp_path / "rm" / "config.json").read_text())
    config.update(architectures=["LlamaForSequenceClassification"], num_labels=1)  # a causal LM's weights under it
    (tmp_path / "rm" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as raised:
        load_reward_model(tmp_path / "rm")
    assert str(raised.value).startswith(f"reward model {tmp_path / 'rm'}: its weights lack score.weight (a causal LM's "
                                        f"weights under a sequence-classification config?); transformers would "
                                        f"initialize them at random")


def test_a_reward_model_built_on_a_causal_lm_says_its_score_head_is_new(tmp_path):
    save_tiny_llama(tmp_path / "model")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lmrl")  # a run's logging stops its records reaching the root logger (caplog's)
    logger.addHandler(handler)
    try:
        build_reward_model(str(tmp_path / "model"))
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno == logging.WARNING] == [
        f"reward model: {tmp_path / 'model'} holds a causal LM (LlamaForCausalLM); its trunk gets a newly initialized "
        f"score head (LlamaForSequenceClassification), which training learns"]
