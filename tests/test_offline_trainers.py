"""The offline trainers (SFT, DPO, reward model) on the built-in GPT and a tiny Llama built here:
losses on the right tokens, the reference, best model and early stopping, exact resume, export."""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from lmrl.config import ConfigError, load_config
from lmrl.common.data import write_jsonl
from lmrl.models.reference import is_reference_view
from lmrl.tasks.rewards import RewardModelScorer
from lmrl.tasks.text_batches import pair_batch
from lmrl.train.dpo_trainer import DPOTrainer
from lmrl.train.offline import OfflineTrainer, TokenMean
from lmrl.train.reward_trainer import RewardTrainer
from lmrl.train.sft_trainer import SFTTrainer
from lmrl.train.trainers import build_trainer
from tests.test_hf import save_tiny_llama

QUIET = ["run.progress=false", "run.tensorboard=false", "run.threads=1"]
# a preference a tiny random model learns in a few steps: "yes ..." over "no ..."
PAIRS = [{"prompt": f"What is {a}+{b}?", "chosen": f"yes {a + b}", "rejected": f"no {a + b}"}
         for a in range(4) for b in range(3)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("offline")
    save_tiny_llama(root / "model", max_positions=128)
    write_jsonl(root / "pairs.jsonl", PAIRS)
    write_jsonl(root / "pairs_eval.jsonl", PAIRS[:4])
    write_jsonl(root / "sft.jsonl", [{"prompt": p["prompt"], "response": p["chosen"]} for p in PAIRS])
    write_jsonl(root / "chars.jsonl", [{"prompt": f"{a}{b}=", "response": f"{b}{a}"} for a in range(10) for b in range(10)])
    return root


def _cfg(data, run_dir, trainer, *overrides, hf=True):
    model = [f"model.type=hf", f"model.path={data / 'model'}"] if hf else \
        ["model.type=gpt", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.n_position=16",
         "data.max_length=16"]
    files = {"sft": ("sft.jsonl", "sft.jsonl"), "dpo": ("pairs.jsonl", "pairs_eval.jsonl"),
             "reward": ("pairs.jsonl", "pairs_eval.jsonl")}[trainer]
    return load_config(None, [f"run.trainer={trainer}", f"run.dir={run_dir}", *model, *QUIET,
                              f"data.train_file={data / files[0]}", f"data.eval_file={data / files[1]}",
                              "data.batch_size=4", *(["data.max_length=64"] if hf else []), "train.max_steps=6", "train.eval_every=3",
                              "train.ckpt_every=2", "train.log_every=1", "optim.lr=1e-2", *overrides])


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sft_loss_is_the_cross_entropy_of_response_tokens_only(data, tmp_path):
    cfg = _cfg(data, tmp_path / "run", "sft", "data.train_file=" + str(data / "chars.jsonl"),
               "data.eval_file=" + str(data / "chars.jsonl"), hf=False)
    trainer = SFTTrainer(cfg)
    row = trainer.train_rows[0]
    assert row.mask == [0, 0, 0, 1, 1]  # "00=" prompt, "00" response: no end token for the char model
    batch = trainer.collate(trainer.train_rows[:3])
    loss, _ = trainer.compute_loss(batch)
    ids, _, mask = batch
    logp = torch.log_softmax(trainer.model(ids).float(), -1)[:, :-1]
    picked = logp.gather(-1, ids[:, 1:, None])[..., 0]
    expected = -(picked * mask[:, 1:]).sum() / mask[:, 1:].sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_sft_on_the_gpt_learns_and_resumes_exactly(data, tmp_path):
    over = ["data.train_file=" + str(data / "chars.jsonl"), "data.eval_file=" + str(data / "chars.jsonl"),
            "data.batch_size=16", "optim.lr=3e-3", "train.max_steps=8", "train.eval_every=4"]
    full = SFTTrainer(_cfg(data, tmp_path / "full", "sft", *over, hf=False)).train()
    SFTTrainer(_cfg(data, tmp_path / "part", "sft", *over, "train.max_steps=4", hf=False)).train()
    resumed = SFTTrainer(_cfg(data, tmp_path / "part", "sft", *over, "run.resume=auto", hf=False)).train()
    a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "part")
    losses = [r["sft/loss"] for r in a if "sft/loss" in r]
    assert losses[-1] < losses[0]
    assert [r["sft/loss"] for r in a if "sft/loss" in r] == [r["sft/loss"] for r in b if "sft/loss" in r]
    assert resumed["best"] == full["best"] and resumed["steps_done"] == 8
    assert (tmp_path / "full" / "model" / "model.safetensors").is_file()


def test_sft_on_an_hf_model_with_lora_exports_a_merged_model(data, tmp_path):
    trainer = SFTTrainer(_cfg(data, tmp_path / "run", "sft", "lora.r=4"))
    row = trainer.train_rows[0]
    text = trainer.tokenizer.decode([t for t, m in zip(row.ids, row.mask) if m])
    assert text == "yes 0<|im_end|>"  # the response and its end-of-turn token, nothing of the prompt
    summary = trainer.train()
    rows = _metrics(tmp_path / "run")
    assert rows[-1]["eval/loss"] < rows[0]["sft/loss"]
    merged = AutoModelForCausalLM.from_pretrained(summary["exported"])
    ids = torch.tensor([row.ids])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, trainer.model(ids), atol=1e-4)


def test_dpo_starts_at_log2_with_a_reference_view_and_learns_the_preference(data, tmp_path):
    trainer = DPOTrainer(_cfg(data, tmp_path / "run", "dpo", "lora.r=8", "dpo.beta=0.5", "train.max_steps=12",
                              "train.eval_every=12"))
    assert is_reference_view(trainer.reference)  # LoRA: the adapter switched off, no copy
    summary = trainer.train()
    rows = _metrics(tmp_path / "run")
    assert rows[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy = reference: h = 0
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "dpo/lr"):
        assert key in rows[0]
    assert rows[-1]["eval/accuracy"] == 1.0 and rows[-1]["eval/rewards/margins"] > 0
    assert summary["best"]["value"] == 1.0


def test_dpo_resumes_exactly_with_micro_batches_sorted_by_length(data, tmp_path):
    over = ["lora.r=4", "train.ga_steps=2", "train.max_steps=4", "train.eval_every=2"]
    DPOTrainer(_cfg(data, tmp_path / "full", "dpo", *over)).train()
    DPOTrainer(_cfg(data, tmp_path / "part", "dpo", *over, "train.max_steps=2")).train()
    DPOTrainer(_cfg(data, tmp_path / "part", "dpo", *over, "run.resume=auto")).train()
    full, part = _metrics(tmp_path / "full"), _metrics(tmp_path / "part")
    assert len(full) == 4 and [r["dpo/loss"] for r in full] == [r["dpo/loss"] for r in part]
    assert [r["num_tokens"] for r in full] == [r["num_tokens"] for r in part]  # the count goes on from the checkpoint
    assert [r.get("eval/loss") for r in full] == [r.get("eval/loss") for r in part]


def test_a_token_mean_is_over_all_the_steps_tokens_whichever_rows_share_a_micro_batch():
    """Micro-batch [0, 0]: one token of value 1; micro-batch [1, 1]: three tokens of value 0. The step's
    token mean is 1/4, where the mean of the micro-batches' means, weighted by rows, would be 1/2; a
    plain number stays a mean weighted by rows."""
    by_batch = {0: TokenMean(1.0, 1), 1: TokenMean(0.0, 3)}

    def compute_loss(rows):
        return torch.zeros((), requires_grad=True), {"entropy": by_batch[rows[0]], "row": float(rows[0])}

    trainer = SimpleNamespace(ordered=lambda rows: rows, collate=lambda rows: rows, compute_loss=compute_loss,
                              config=SimpleNamespace(train=SimpleNamespace(ga_steps=2)), device="cpu",
                              no_sync=lambda sync: nullcontext())
    _, metrics = OfflineTrainer.accumulate(trainer, [0, 0, 1, 1])
    assert metrics == {"entropy": 0.25, "row": 0.5}
    assert TokenMean(0.0, 0).value == 0.0  # no tokens: 0, as TRL logs it


def test_dpo_without_lora_uses_a_frozen_copy(data, tmp_path):
    trainer = DPOTrainer(_cfg(data, tmp_path / "run", "dpo", "train.max_steps=2", "dpo.loss_type=ipo"))
    assert not is_reference_view(trainer.reference) and trainer.reference is not trainer.model
    before = [p.clone() for p in trainer.reference.parameters()]
    trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.reference.parameters()))


def test_reward_model_learns_pairs_and_exports_a_model_transformers_loads(data, tmp_path):
    trainer = RewardTrainer(_cfg(data, tmp_path / "run", "reward", "train.max_steps=10", "train.eval_every=5"))
    summary = trainer.train()
    rows = _metrics(tmp_path / "run")
    assert rows[-1]["eval/accuracy"] == 1.0 and "rm/margin_mean" in rows[0]
    loaded = AutoModelForSequenceClassification.from_pretrained(summary["exported"])
    ids, attention, _ = pair_batch([pair for pair, _ in trainer.eval_rows], trainer.pad_id, "cpu")  # a row per side
    with torch.no_grad():
        ours = trainer.model(ids, attention)
        theirs = loaded(input_ids=ids, attention_mask=attention).logits[:, 0]
        # the training layout (one row per pair) scores each side as the loaded model does
        trained = trainer.compute_loss(trainer.collate(trainer.eval_rows))[1]
    assert torch.allclose(ours, theirs, atol=1e-5)
    n = len(trainer.eval_rows)
    assert trained["rm/chosen_mean"] == pytest.approx(theirs[:n].mean().item(), abs=1e-5)
    assert trained["rm/rejected_mean"] == pytest.approx(theirs[n:].mean().item(), abs=1e-5)
    scorer = RewardModelScorer(summary["exported"])
    chosen, rejected = scorer([PAIRS[0]["prompt"]] * 2, [PAIRS[0]["chosen"], PAIRS[0]["rejected"]])
    assert chosen > rejected


def test_early_stopping_keeps_the_best_model(data, tmp_path):
    # lr 0: the eval metric never improves after the first evaluation, so patience 2 stops at the third
    cfg = _cfg(data, tmp_path / "run", "reward", "optim.lr=0", "train.max_steps=20", "train.eval_every=2",
               "train.patience=2")
    summary = RewardTrainer(cfg).train()
    assert summary["stopped_early"] and summary["steps_done"] == 6
    assert summary["best"]["step"] == 2
    assert json.loads((tmp_path / "run" / "checkpoints" / "best" / "trainer_state.json").read_text())["step"] == 2


def test_build_trainer_dispatches_on_run_trainer_and_config_errors_name_keys(data, tmp_path):
    assert isinstance(build_trainer(_cfg(data, tmp_path / "a", "dpo", "train.max_steps=1")), DPOTrainer)
    with pytest.raises(ConfigError, match="dpo.loss_type"):
        _cfg(data, tmp_path / "b", "dpo", "dpo.loss_type=sigmoidd")
    with pytest.raises(ConfigError, match="run.trainer=dpo reads data.train_file .* or pass train_dataset="):
        build_trainer(load_config(None, ["run.trainer=dpo", f"run.dir={tmp_path / 'd'}"]))
    with pytest.raises(ConfigError, match="label_smoothing"):
        _cfg(data, tmp_path / "c", "dpo", "dpo.loss_type=ipo", "dpo.label_smoothing=0.1")


def test_over_long_pairs_are_cut_and_counted(data, tmp_path):
    trainer = DPOTrainer(_cfg(data, tmp_path / "run", "dpo", "data.max_length=12", "train.max_steps=1"))
    assert all(len(p.prompt) + max(len(p.chosen), len(p.rejected)) <= 12 for p in trainer.train_rows)
    assert any(f"of {len(PAIRS)} rows truncated" in note and not note.startswith("0 ") for note in trainer.data_notes)


def test_offline_trainers_take_a_datasets_dataset_instead_of_files(data, tmp_path):
    from datasets import Dataset

    pairs = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
                                "chosen": [{"role": "assistant", "content": f"yes {a + b}"}],
                                "rejected": [{"role": "assistant", "content": f"no {a + b}"}]}
                               for a in range(4) for b in range(2)])
    trainer = DPOTrainer(_cfg(data, tmp_path / "run", "dpo"), train_dataset=pairs, eval_dataset=pairs.select(range(4)))
    assert len(trainer.train_rows) == 8 and len(trainer.eval_rows) == 4  # not the files' 12 and 4 rows
    summary = trainer.train()
    assert summary["steps_done"] == 6 and summary["train_rows"] == 8
    assert "rows handed in" in (tmp_path / "run" / "train.log").read_text()


def test_a_malformed_row_is_reported_before_any_model_loads(data, tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, PAIRS[:3] + [{"prompt": "What is 1+1?", "chosen": "2", "rejected": 2}])

    def no_model(self):
        raise AssertionError("the model was built before the data was checked")

    monkeypatch.setattr(RewardTrainer, "build_model", no_model)
    with pytest.raises(Exception, match=r"bad.jsonl:4"):
        RewardTrainer(_cfg(data, tmp_path / "run", "reward", f"data.train_file={bad}"))
