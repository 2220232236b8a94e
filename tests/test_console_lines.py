"""The console line of every trainer, end to end: two steps of the RL trainer (warm-up then RL) on the
tiny adder and of SFT, DPO and the reward trainer on a tiny Llama, read back from train.log (which
gets every console line). Step 1 carries the loss, the accuracy and the LR; the evaluation at the
last step adds the held-out numbers."""

from __future__ import annotations

import re

import pytest

from lmrl.config import load_config
from lmrl.common.data import write_jsonl
from lmrl.train.dpo_trainer import DPOTrainer
from lmrl.train.reward_trainer import RewardTrainer
from lmrl.train.rl_trainer import RLTrainer
from lmrl.train.sft_trainer import SFTTrainer
from tests.test_hf import save_tiny_llama

PAIRS = [{"prompt": f"What is {a}+{b}?", "chosen": f"yes {a + b}", "rejected": f"no {a + b}"}
         for a in range(4) for b in range(3)]
NUMBER = r"-?\d+\.\d{3}"
LR = r"\d\.\d{2}e[-+]\d{2}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    save_tiny_llama(root / "model", max_positions=128)
    write_jsonl(root / "pairs.jsonl", PAIRS)
    write_jsonl(root / "sft.jsonl", [{"prompt": p["prompt"], "response": p["chosen"]} for p in PAIRS])
    return root


def console_lines(run_dir) -> list[str]:
    """train.log's step lines, without their timestamps."""
    return [line.split(" ", 2)[2] for line in (run_dir / "train.log").read_text().splitlines() if "] Step " in line]


def offline_lines(data, run_dir, trainer_cls, trainer, train_file):
    cfg = load_config(None, [f"run.trainer={trainer}", f"run.dir={run_dir}", "model.type=hf",
                             f"model.path={data / 'model'}", "run.progress=false", "run.tensorboard=false",
                             "run.threads=1", f"data.train_file={data / train_file}",
                             f"data.eval_file={data / train_file}", "data.batch_size=4", "data.max_length=64",
                             "train.max_steps=2", "train.eval_every=2", "train.log_every=1", "optim.lr=1e-2"])
    trainer_cls(cfg).train()
    return console_lines(run_dir)


def test_rl_warmup_and_rl_lines_carry_loss_accuracy_reward_and_lr_from_step_1(tiny_config):
    cfg = tiny_config("sft.steps=2", "train.steps=2", "train.eval_every=2")
    RLTrainer(cfg).train()
    lines = console_lines(cfg.run_dir)
    assert re.fullmatch(rf"\[sft\] Step 1/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| LR: {LR}", lines[0])
    assert re.fullmatch(rf"\[sft\] Step 2/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| LR: {LR} "
                        rf"\| Eval: acc {NUMBER}, reward {NUMBER}", lines[1])
    assert re.fullmatch(rf"\[rl\] Step 1/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| Reward: {NUMBER} \| LR: {LR}",
                        lines[2])
    assert re.fullmatch(rf"\[rl\] Step 2/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| Reward: {NUMBER} \| LR: {LR} "
                        rf"\| Eval: acc {NUMBER}, reward {NUMBER}", lines[3])
    assert len(lines) == 4


def test_sft_lines_carry_loss_token_accuracy_and_lr_from_step_1(data, tmp_path):
    lines = offline_lines(data, tmp_path / "run", SFTTrainer, "sft", "sft.jsonl")
    assert re.fullmatch(rf"\[sft\] Step 1/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| LR: 1.00e-02", lines[0])
    assert re.fullmatch(rf"\[sft\] Step 2/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| LR: {LR} "
                        rf"\| Eval: loss {NUMBER}, acc {NUMBER}", lines[1])


def test_dpo_lines_carry_loss_accuracy_margin_and_lr_from_step_1(data, tmp_path):
    lines = offline_lines(data, tmp_path / "run", DPOTrainer, "dpo", "pairs.jsonl")
    # policy = reference at step 1: loss log 2, no pair ranked right, margin 0
    assert lines[0] == "[dpo] Step 1/2 | Loss: 0.693 | Acc: 0.000 | Margin: 0.000 | LR: 1.00e-02"
    assert re.fullmatch(rf"\[dpo\] Step 2/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| Margin: {NUMBER} \| LR: {LR} "
                        rf"\| Eval: loss {NUMBER}, acc {NUMBER}, margin {NUMBER}", lines[1])


def test_reward_model_lines_carry_loss_accuracy_margin_and_lr_from_step_1(data, tmp_path):
    lines = offline_lines(data, tmp_path / "run", RewardTrainer, "reward", "pairs.jsonl")
    assert re.fullmatch(rf"\[rm\] Step 1/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| Margin: {NUMBER} \| LR: 1.00e-02",
                        lines[0])
    assert re.fullmatch(rf"\[rm\] Step 2/2 \| Loss: {NUMBER} \| Acc: {NUMBER} \| Margin: {NUMBER} \| LR: {LR} "
                        rf"\| Eval: loss {NUMBER}, acc {NUMBER}, margin {NUMBER}", lines[1])
