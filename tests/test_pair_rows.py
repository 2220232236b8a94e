"""One row per preference pair (`tasks.text_batches.pair_rows`): each prompt runs once for both
replies, and the DPO log-probs, reward-model scores and their gradients equal those of each side in
a row of its own (`pair_batch`, the plain full forward); a step's micro-batches sorted by length
keep the step's loss and gradients. Tiny random Llamas built here; no hub."""

from __future__ import annotations

import math
import types

import pytest
import torch

from lmrl.models.reward_model import build_reward_model
from lmrl.tasks.text_batches import (PairExample, pair_batch, pair_logps, pair_logps_and_sums, pair_rows,
                                     pair_scores, takes_pair_rows)
from lmrl.train.dpo_trainer import dpo_token_metrics
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
    plain full forward's per-side log-probs, token counts, token diagnostics and LoRA gradients, with sdpa and eager
    attention, with a transformers that keeps logits by columns only, and under gradient checkpointing."""
    import lmrl.models.hf as hf
    from lmrl.models.reference import reference_view

    policy = tiny_lora_policy(tmp_path)
    pairs = ragged_pairs()
    weights = torch.arange(1.0, 2 * len(pairs) + 1)

    def run(batch):
        policy.zero_grad()
        logps, counted, sums = pair_logps_and_sums(policy, batch)
        (logps * weights).sum().backward()
        with torch.no_grad():
            reference = pair_logps(reference_view(policy), batch)[0]
        return logps.detach(), counted, reference, lora_grads(policy), sums

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
        logps, counted, reference, grads, sums = run(pair_rows(pairs, PAD, "cpu"))
        torch.testing.assert_close(logps, plain[0], atol=1e-5, rtol=1e-5)
        assert counted.tolist() == plain[1].tolist() == [5, 3, 3, 3, 4, 2, 6, 3, 2, 1]
        torch.testing.assert_close(reference, plain[2], atol=1e-5, rtol=1e-5)
        assert_same_grads(grads, plain[3])
        for got, expected in ((sums.entropy, plain[4].entropy), (sums.mean_logit, plain[4].mean_logit)):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(sums.top1, plain[4].top1)


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


class Bigram:
    """A model whose logits at a position are `table[its token]`, whatever came before, so both layouts
    give every position the same logits: (B, T) ids -> (B, T, V); `logits_to_keep` a (B, T) bool mask:
    the kept positions (K, V); an int k > 0: the last k positions."""

    takes_pair_rows = True

    def __init__(self, table: torch.Tensor):
        self.table = table

    def __call__(self, ids, attention_mask=None, position_ids=None, logits_to_keep=0):
        logits = self.table[ids]
        if isinstance(logits_to_keep, torch.Tensor):
            return logits[logits_to_keep]
        return logits[:, -logits_to_keep:] if logits_to_keep else logits


# words 0 (pad) .. 4; the logits that follow each token, with their mean, entropy and argmax
HAND_TABLE = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0],             # 0: pad, never followed by a scored token
                           [0.0, 0.0, 0.0, 0.0, 0.0],             # 1: mean 0, entropy ln 5, argmax 0
                           [-100.0, 0.0, 0.0, -100.0, -100.0],    # 2: mean -60, entropy ln 2, argmax 1 (tied with 2)
                           [0.0, 0.0, 0.0, 4.0, 0.0],             # 3: mean 0.8, entropy H3, argmax 3
                           [0.0, 0.0, 0.0, 0.0, 0.0]])
H3 = math.log(math.exp(4) + 4) - 4 * math.exp(4) / (math.exp(4) + 4)  # -Σ p log p of softmax(0, 0, 0, 4, 0)


def test_reply_token_sums_of_hand_written_logits_are_the_same_in_both_layouts():
    """Pair A: prompt 1 3, chosen 3 2 (the 2 without loss), rejected 1; pair B: prompt 2, chosen 2,
    rejected 1 3. Each reply token is predicted by the logits after the token before it:
      chosen A   3 after 3: the argmax         entropy H3   mean 0.8
      chosen B   2 after 2: tied with 1, not   entropy ln 2 mean -60
      rejected A 1 after 3                     entropy H3   mean 0.8
      rejected B 1 after 2: the argmax         entropy ln 2 mean -60;  3 after 1: entropy ln 5, mean 0"""
    pairs = [PairExample([1, 3], [3, 2], [1], [1, 0], [1]), PairExample([2], [2], [1, 3])]
    model = Bigram(HAND_TABLE)
    for batch in (pair_batch(pairs, PAD, "cpu"), pair_rows(pairs, PAD, "cpu")):
        logps, counted, sums = pair_logps_and_sums(model, batch)  # sides: chosen A, chosen B, rejected A, B
        assert counted.tolist() == [1, 1, 1, 2]
        torch.testing.assert_close(sums.entropy, torch.tensor([H3, math.log(2), H3, math.log(2) + math.log(5)]))
        torch.testing.assert_close(sums.mean_logit, torch.tensor([0.8, -60.0, 0.8, -60.0]))
        assert sums.top1.tolist() == [1.0, 0.0, 0.0, 1.0]
        log_p = HAND_TABLE.log_softmax(-1)  # log_p[a, b]: token b after token a
        expected = torch.stack([log_p[3, 3], log_p[2, 2], log_p[3, 1], log_p[2, 1] + log_p[1, 3]])
        torch.testing.assert_close(logps, expected)
        assert torch.equal(logps, pair_logps(model, batch)[0])
        metrics = {k: v.value for k, v in dpo_token_metrics(sums, counted).items()}
        assert metrics == pytest.approx({"entropy": (2 * H3 + 2 * math.log(2) + math.log(5)) / 5,
                                         "logits/chosen": (0.8 - 60) / 2, "logits/rejected": (0.8 - 60 + 0) / 3,
                                         "mean_token_accuracy": 1 / 2})
