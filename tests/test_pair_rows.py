"""One row per preference pair (`tasks.text_batches.pair_rows`): each prompt runs once for both
replies, and the DPO log-probs, reward-model scores and their gradients equal those of each side in
a row of its own (`pair_batch`, the plain full forward); a step's micro-batches sorted by length
keep the step's loss and gradients. Tiny random Llamas built here; no hub."""

from __future__ import annotations

import types

import pytest
import torch

from lmrl.models.reward_model import build_reward_model
from lmrl.tasks.text_batches import (PairExample, pair_batch, pair_logps, pair_rows, pair_scores,
                                     takes_pair_rows)
from tests.test_hf_generate import tiny_lora_policy

PAD = 0


pytestmark = pytest.mark.usefixtures("one_thread")


def ragged_pairs(seed: int = 0) -> list[PairExample]:
    """Prompts of 7, 1, 0 and 12 tokens; replies of different lengths, one pair with loss masks that
    leave tokens out (a conversational reply's markup) and replies ending in the pad token (pad = end
    of turn, as in SmolLM2), one reply nothing but it."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(n):
        return torch.randint(3, 90, (n,), generator=gen).tolist()

    return [PairExample(tokens(7), tokens(5), tokens(2)),
            PairExample(tokens(1), tokens(3), tokens(6)),
            PairExample([], tokens(4), tokens(4)),
            PairExample(tokens(12), tokens(3) + [PAD], tokens(1) + [PAD], [1, 0, 1, 1], [1, 1]),
            PairExample(tokens(4), tokens(2) + [PAD, PAD], [PAD])]


def lora_grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_same_grads(got: dict, expected: dict):
    assert got.keys() == expected.keys()
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, atol=1e-5, rtol=1e-4, msg=name)
    assert any(g.abs().sum() > 0 for n, g in expected.items() if "lora_A" in n)


def test_a_pair_row_is_the_prompt_head_then_each_reply_after_the_prompts_last_token():
    pair = PairExample([11, 12, 13], [21, 22], [31], [1, 1], [1])
    rows = pair_rows([pair, PairExample([14], [23], [32, 33])], PAD, "cpu")
    assert rows.ids.tolist() == [[11, 12, 13, 21, 22, 13, 31], [14, 23, 14, 32, 33, 0, 0]]
    assert rows.positions[0].tolist() == [0, 1, 2, 3, 4, 2, 3]  # the rejected reply goes on from the prompt too
    allowed = rows.attention[0, 0].int().tolist()
    assert allowed[5] == [1, 1, 0, 0, 0, 1, 0]  # the rejected segment sees the head and itself, not the chosen one
    assert allowed[4] == [1, 1, 1, 1, 1, 0, 0]
    # logits at 13 (twice), 21 and 13 predict 21, 22 and 31: chosen side 0, rejected side 2 (B = 2)
    assert rows.scored[0].tolist() == [False, False, True, True, False, True, False]
    assert rows.targets.tolist()[:3] == [21, 22, 31] and rows.sides.tolist() == [0, 0, 2, 1, 3, 3]
    assert rows.ends.tolist() == [4, 7 + 1, 6, 7 + 4]  # each side's last token that is not pad


def test_dpo_log_probs_on_pair_rows_equal_each_side_in_its_own_row_with_gradients(tmp_path, monkeypatch):
    """The policy (gradients) and its reference view (adapter off, no gradients) on pair rows give the
    plain full forward's per-side log-probs, token counts and LoRA gradients, with sdpa and eager
    attention, with a transformers that keeps logits by columns only, and under gradient checkpointing."""
    import lmrl.models.hf as hf
    from lmrl.models.reference import reference_view

    policy = tiny_lora_policy(tmp_path)
    pairs = ragged_pairs()
    weights = torch.arange(1.0, 2 * len(pairs) + 1)

    def run(batch):
        policy.zero_grad()
        logps, counted = pair_logps(policy, batch)
        (logps * weights).sum().backward()
        with torch.no_grad():
            reference = pair_logps(reference_view(policy), batch)[0]
        return logps.detach(), counted, reference, lora_grads(policy)

    policy.share_prompts = False  # the plain pass: every row runs in full
    plain = run(pair_batch(pairs, PAD, "cpu"))
    assert takes_pair_rows(policy) and takes_pair_rows(reference_view(policy))
    for attention, by_mask, checkpointing in (("sdpa", True, False), ("eager", True, False), ("sdpa", False, False),
                                              ("sdpa", True, True)):
        policy.hf_model.set_attn_implementation(attention)
        monkeypatch.setattr(hf, "_keeps_masked_positions", lambda cls: by_mask)
        if checkpointing:  # one ordinary forward pass: activations recomputed in backward as usual
            policy.hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            assert policy.training and policy.hf_model.is_activation_checkpointing
        logps, counted, reference, grads = run(pair_rows(pairs, PAD, "cpu"))
        torch.testing.assert_close(logps, plain[0], atol=1e-5, rtol=1e-5)
        assert counted.tolist() == plain[1].tolist() == [5, 3, 3, 3, 4, 2, 6, 3, 2, 1]
        torch.testing.assert_close(reference, plain[2], atol=1e-5, rtol=1e-5)
        assert_same_grads(grads, plain[3])


def test_reward_scores_on_pair_rows_equal_the_sequence_classifiers_own_forward_with_gradients(tmp_path):
    """Scores (read at each side's last token that is not pad, as transformers does) and the gradients
    of the LoRA adapter and the score head equal the plain forward of each side in its own row."""
    from tests.test_hf import save_tiny_llama

    save_tiny_llama(tmp_path / "m", max_positions=128)
    torch.manual_seed(0)
    lora = types.SimpleNamespace(r=4, alpha=8, dropout=0.0, target_modules=["all-linear"])
    rm, _ = build_reward_model(str(tmp_path / "m"), lora=lora)
    for name, p in rm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    pairs = ragged_pairs(1)
    weights = torch.arange(1.0, 2 * len(pairs) + 1)

    def run(batch):
        rm.zero_grad()
        scores = pair_scores(rm, batch)
        (scores * weights).sum().backward()
        return scores.detach(), lora_grads(rm)

    plain_scores, plain_grads = run(pair_batch(pairs, PAD, "cpu"))
    assert takes_pair_rows(rm)
    scores, grads = run(pair_rows(pairs, PAD, "cpu"))
    torch.testing.assert_close(scores, plain_scores, atol=1e-5, rtol=1e-5)
    assert_same_grads(grads, plain_grads)
    assert any("score" in n and g.abs().sum() > 0 for n, g in grads.items())


def test_a_step_in_micro_batches_sorted_by_length_has_the_loss_metrics_and_gradients_of_data_order(tmp_path):
    """DPO and the reward model: the same rows per optimizer step, sorted by length into micro-batches
    and laid out one row per pair, give the loss, metrics and gradients of data order and the plain
    layout (a mean over pairs does not depend on which pairs share a micro-batch)."""
    from lmrl.train.dpo_trainer import DPOTrainer
    from lmrl.train.reward_trainer import RewardTrainer
    from tests.test_offline_trainers import _cfg, PAIRS
    from tests.test_hf import save_tiny_llama
    from lmrl.common.data import write_jsonl

    save_tiny_llama(tmp_path / "model", max_positions=128)
    rows = [{**p, "prompt": p["prompt"] + " Please answer." * (i % 3)} for i, p in enumerate(PAIRS)]
    write_jsonl(tmp_path / "pairs.jsonl", rows)
    write_jsonl(tmp_path / "pairs_eval.jsonl", rows[:4])
    for cls, kind in ((DPOTrainer, "dpo"), (RewardTrainer, "reward")):
        trainer = cls(_cfg(tmp_path, tmp_path / kind, kind, "lora.r=4", "data.batch_size=8", "train.ga_steps=4"))
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
        assert trainer.uses_pair_rows()
        batch = trainer.batch_rows(0)
        results = []
        for share, sort in ((False, False), (True, True)):
            trainer.share_prompts, trainer.sort_by_length = share, sort
            trainer.model.zero_grad()
            loss, metrics = trainer.accumulate(batch)
            results.append((loss.item(), metrics, lora_grads(trainer.model)))
        (plain_loss, plain_metrics, plain_grads), (loss, metrics, grads) = results
        assert trainer.ordered(batch) != batch  # the sort did reorder this step's rows
        assert loss == pytest.approx(plain_loss, abs=1e-6)
        assert metrics.keys() == plain_metrics.keys()
        for key, value in plain_metrics.items():
            assert metrics[key] == pytest.approx(value, abs=1e-5), key
        assert_same_grads(grads, plain_grads)


def test_models_without_a_custom_mask_get_the_plain_layout(tmp_path):
    """The built-in GPT takes no attention mask, flash attention no 4-D one: their pairs stay one row per side."""
    from lmrl.models.gpt import GPT, GPTConfig

    assert not takes_pair_rows(GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=1, n_embd=8, n_position=8)))
    policy = tiny_lora_policy(tmp_path)
    policy.hf_model.config._attn_implementation = "flash_attention_2"  # set directly: not installed here
    assert not takes_pair_rows(policy)
