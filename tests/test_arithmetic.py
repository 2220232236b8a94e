import pytest
import torch

from lmrl.tasks.arithmetic import ArithmeticTask


def test_addition_prompt_and_reversed_zero_padded_answer():
    t = ArithmeticTask("addition", ndigit=3)
    assert t.prompt_text(12, 345) == "012+345="
    assert t.target(12, 345) == "7530"  # 0357 written least-significant digit first
    assert t.answer_len == 4 and t.prompt_len == 8


def test_multiplication_answer_has_2n_digits():
    t = ArithmeticTask("multiplication", ndigit=2)
    assert t.prompt_text(7, 86) == "07*86="
    assert t.target(7, 86) == "2060"  # 602 -> 0602 -> reversed
    assert t.answer_len == 4


def test_unformatted_prompt_and_unreversed_answer():
    t = ArithmeticTask("addition", ndigit=2, use_format=False, reverse_answer=False)
    assert t.prompt_text(5, 99) == "0599"
    assert t.target(5, 99) == "104"
    assert t.operands("0599") == (5, 99)


def test_exact_reward_is_all_or_nothing():
    t = ArithmeticTask(reward="exact")
    assert t.score("012+345=", "7530") == 1.0
    assert t.score("012+345=", "7531") == 0.0


def test_digit_reward_gives_partial_credit_per_position():
    t = ArithmeticTask(reward="digits")
    assert t.score("012+345=", "7530") == 1.0
    assert t.score("012+345=", "7500") == 0.75
    assert t.score("012+345=", "0000") == 0.25  # the leading zero (last reversed digit) is right


def test_verifier_reads_operands_from_the_prompt_only():
    t = ArithmeticTask()
    rows = t.batch(torch.tensor([12_345, 999_999]))
    completions = torch.tensor([t.tokenizer.encode("7530"), t.tokenizer.encode("8991")])
    rewards, exact = t.score_batch(rows.prompts, completions)
    assert exact.tolist() == [1.0, 1.0] and rewards.tolist() == [1.0, 1.0]


def test_heldout_is_fixed_and_training_never_draws_from_it():
    t1, t2 = ArithmeticTask(heldout_size=1000), ArithmeticTask(heldout_size=1000)
    assert torch.equal(t1.heldout_ids, t2.heldout_ids) and len(t1.heldout_ids.unique()) == 1000
    train = t1.sample_train_ids(200_000, torch.Generator().manual_seed(0))
    assert not torch.isin(train, t1.heldout_ids).any()
    assert len(train) == 200_000


def test_small_space_training_draws_avoid_heldout():
    t = ArithmeticTask(ndigit=1, heldout_size=50)  # 100 problems, half held out
    train = t.sample_train_ids(1000, torch.Generator().manual_seed(1))
    assert set(train.tolist()).isdisjoint(set(t.heldout_ids.tolist()))
    assert len(set(train.tolist())) == 50


def test_labeled_rows_are_prompt_then_answer():
    t = ArithmeticTask()
    rows = t.labeled(torch.tensor([12_345]))
    assert t.tokenizer.decode(rows[0]) == "012+345=7530"


def test_distinct_train_ids_are_exactly_n_different_training_problems():
    t = ArithmeticTask(name="multiplication", ndigit=2)  # 10,000 problems, 1,000 held out
    ids = t.sample_distinct_train_ids(8000, torch.Generator().manual_seed(0))
    assert len(ids) == 8000 and len(ids.unique()) == 8000
    assert not torch.isin(ids, t.heldout_ids).any()
    again = t.sample_distinct_train_ids(8000, torch.Generator().manual_seed(0))
    assert torch.equal(ids, again)  # a function of the seed
    assert not torch.equal(ids[:50].sort().values, ids[:50])  # random order, not sorted
    with pytest.raises(ValueError, match="asked for 9001 distinct training problems but only 9000 exist"):
        t.sample_distinct_train_ids(9001, torch.Generator())


def test_multiplication_scratchpad_writes_partial_products_then_the_product():
    t = ArithmeticTask("multiplication", ndigit=2, scratchpad=True)
    # 12*34 = 12*4 + 12*30 = 48 + 360: partials 048 and 036 reversed, then 0408 reversed
    assert t.target(12, 34) == "840|630|8040"
    assert t.answer_len == len("840|630|8040") and t.decode_answer("840|630|8040") == "0408"
    for a, b in [(99, 99), (7, 86), (0, 5), (10, 10)]:
        answer = t.target(a, b)
        assert len(answer) == t.answer_len and int(t.decode_answer(answer)) == a * b
    assert t.score(t.prompt_text(12, 34), "840|630|8040") == 1.0
    assert t.score(t.prompt_text(12, 34), "840|631|8040") == 0.0  # a wrong partial product is a wrong answer


def test_scratchpad_is_refused_for_addition():
    with pytest.raises(ValueError, match="multiplication only"):
        ArithmeticTask("addition", ndigit=2, scratchpad=True)


def test_per_step_reward_checks_the_product_against_the_partial_products_written():
    t = ArithmeticTask("multiplication", ndigit=2, scratchpad=True, reward="per_step")
    prompt = t.prompt_text(14, 29)  # 14*9 = 126, 14*2 = 28, 14*29 = 406
    assert t.target(14, 29) == "621|820|6040"
    # 14*9 written as 196: the product 196 + 280 = 476 is the right sum of what was written
    wrong_fact = "691|820|6740"
    assert t.step_target(14, 29, wrong_fact) == "621|820|6740"
    assert t.score(prompt, wrong_fact) == 11 / 12  # only the wrong partial-product digit loses
    assert ArithmeticTask("multiplication", ndigit=2, scratchpad=True, reward="per_digit").score(
        prompt, wrong_fact) == 10 / 12  # per_digit also marks the correctly added 7 wrong
    # the true product after a wrong partial product is not consistent with it: its digit loses
    assert t.score(prompt, "691|820|6040") == 10 / 12
    # partial products that do not parse (a separator misplaced, a non-digit) fall back to the truth
    assert t.step_target(14, 29, "6921|20|6040") == t.target(14, 29)
    assert t.step_target(14, 29, "6|1|820|6040") == t.target(14, 29)
    # a sum too wide for the product's 4 digits falls back to the truth: 999 + 9990
    assert t.step_target(14, 29, "999|999|6040") == t.target(14, 29)

    completions = torch.tensor([t.tokenizer.encode(c) for c in [t.target(14, 29), wrong_fact]])
    prompts = torch.tensor([t.tokenizer.encode(prompt)] * 2)
    rewards, exact = t.score_batch(prompts, completions)
    assert exact.tolist() == [1.0, 0.0]  # exact match is still against the true answer
    assert rewards.shape == (2, t.answer_len) and rewards[0].all()
    assert rewards[1].tolist() == [1, 0] + [1] * 10


def test_per_step_reward_needs_a_scratchpad():
    with pytest.raises(ValueError, match="needs task.scratchpad"):
        ArithmeticTask("multiplication", ndigit=2, reward="per_step")
