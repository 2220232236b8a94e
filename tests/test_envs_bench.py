"""benchmarks/envs_smollm2.py's own parts, without a model: the multiplication prompts, the reward, the
tool-use verdicts on hand-written transcripts, the rates and the skyrl held-out rows; and, marked slow,
the smallest run of each mode on SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import envs_smollm2 as bench


def call(a, b):
    return {"role": "assistant",
            "content": f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'}


def result(content, name="multiply"):
    return {"role": "tool", "name": name, "content": str(content)}


def say(text):
    return {"role": "assistant", "content": text}


# ------------------------------------------------------------------------------------------- the prompts

def test_multiplication_pairs_are_four_digit_seeded_and_train_and_heldout_never_share_one():
    train, held = bench.multiplication_pairs(300, 50, seed=3)
    assert len(train) == 300 and len(held) == 50
    assert not set(train) & set(held)
    assert len(set(train)) == 300 and len(set(held)) == 50
    assert all(1000 <= x <= 9999 for pair in train + held for x in pair)
    assert bench.multiplication_pairs(300, 50, seed=3) == (train, held)
    assert bench.multiplication_pairs(300, 50, seed=4) != (train, held)


def test_tool_rows_are_conversational_prompts_with_the_product_as_answer():
    [row] = bench.tool_rows([(1234, 5678)])
    assert row["answer"] == str(1234 * 5678)
    assert row["prompt"] == [{"role": "user", "content": "What is 1234 * 5678? Use the multiply tool, then give the "
                                                         "number."}]


def test_multiply_is_a_tool_with_a_schema():
    from lmrl.envs.tools import tool_schemas

    [schema] = tool_schemas([bench.multiply])
    assert schema["function"]["name"] == "multiply"
    assert schema["function"]["parameters"]["required"] == ["a", "b"]
    assert bench.multiply(1234, 5678) == 7006652


# -------------------------------------------------------------------------------------------- the reward

def test_the_reward_reads_the_last_number_of_the_last_assistant_message():
    truth = str(1234 * 5678)
    right = [call(1234, 5678), result(truth), say("The product is 7,006,652.")]
    wrong = [call(1234, 5678), result(truth), say("It is 7006652, or maybe 12.")]
    silent = [call(1234, 5678), result(truth)]  # no answer after the tool: its call holds only operands
    plain = [say("1234 * 5678 = 7006652")]
    assert bench.product_reward([right, wrong, silent, plain], [truth] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert bench.product_reward(["so 7006652"], [truth]) == [1.0]


def test_numbers_inside_a_tool_call_are_not_the_answer():
    turn = say('7006652 <tool_call>{"name": "multiply", "arguments": {"a": 1234, "b": 5678}}</tool_call>')
    assert bench.last_answer([turn]) == "7006652"
    assert bench.last_answer([say('<tool_call>{"a": 1234, "b": 5678')]) is None  # an unclosed call too


# ---------------------------------------------------------------------------------------- the tool use

def test_a_correct_call_is_a_multiply_result_holding_the_true_product():
    product = 1234 * 5678
    good = [call(1234, 5678), result(product), say(str(product))]
    swapped_digits = [call(1243, 5678), result(1243 * 5678), say("done")]
    failed = [call("x", 5678), result({"error": "TypeError"}), say("sorry")]
    other_tool = [say("<tool_call>{...}</tool_call>"), result("{'error': 'not JSON'}", "invalid_tool_call")]
    none = [say(str(product))]
    assert bench.tool_use(good, product) == {"called": True, "called_correctly": True}
    assert bench.tool_use(swapped_digits, product) == {"called": True, "called_correctly": False}
    assert bench.tool_use(failed, product) == {"called": True, "called_correctly": False}
    assert bench.tool_use(other_tool, product) == {"called": False, "called_correctly": False}
    assert bench.tool_use(none, product) == {"called": False, "called_correctly": False}
    assert bench.tool_episode(none, product) == {"correct": True, "called": False, "called_correctly": False}
    assert bench.tool_episode(swapped_digits, str(product))["correct"] is False


def test_the_verdicts_read_the_tool_messages_lmrls_tool_env_writes():
    from lmrl.envs.tools import ToolEnv

    env = ToolEnv([bench.multiply], prompt=bench.tool_rows([(1234, 5678)])[0]["prompt"])
    env.reset()
    right, wrong = call(1234, 5678), call(1234, 5679)
    answered_right, _, _, _, _ = env.step(right["content"])
    answered_wrong, _, _, _, _ = env.step(wrong["content"])
    bad_arguments, _, _, _, _ = env.step('<tool_call>{"name": "multiply", "arguments": {"x": 1}}</tool_call>')
    product = 1234 * 5678
    assert bench.tool_episode([right, *answered_right, say(f"It is {product}.")], product) == \
        {"correct": True, "called": True, "called_correctly": True}
    assert bench.tool_use([wrong, *answered_wrong], product) == {"called": True, "called_correctly": False}
    assert bench.tool_use([say("..."), *bad_arguments], product) == {"called": True, "called_correctly": False}


# ------------------------------------------------------------------------------------------- the maths

def test_rates_carry_wilson_intervals_and_gains_the_paired_interval():
    from lmrl.train.file_eval import paired_difference_interval, wilson_interval

    r = bench.rate([True, False, False, True])
    assert (r["k"], r["n"], r["rate"]) == (2, 4, 0.5) and r["ci95"] == list(wilson_interval(2, 4))
    before, after = [False, False, True, False], [True, True, True, False]
    g = bench.paired_gain(before, after)
    assert g["gain"] == pytest.approx(0.5) and g["ci95"] == list(paired_difference_interval(after, before))
    assert bench.fmt_gain(g).startswith("+50.0 pts")


def test_arguments():
    args = bench.parse_args(["env", "train.rollout_size=8", "--env-kwargs", '{"max_turns": 4}'])
    assert args.overrides == ["train.rollout_size=8"] and args.max_new_tokens == 32
    assert args.out.endswith("env.json")
    assert bench.parse_args(["tools"]).max_new_tokens == 64
    with pytest.raises(SystemExit):
        bench.parse_args(["trl", "train.steps=3"])
    with pytest.raises(SystemExit):
        bench.parse_args(["env", "--env-kwargs", "[1]"])


# ----------------------------------------------------------------------------------- SmolLM2, end to end

@pytest.mark.slow
@pytest.mark.parametrize("mode", ["env", "tools"])
def test_the_smallest_run_of_a_mode_writes_every_figure(tmp_path, mode):
    pytest.importorskip("trl")
    if mode == "env":
        pytest.importorskip("textarena")
    out = tmp_path / f"{mode}.json"
    cmd = [sys.executable, "-m", "benchmarks.envs_smollm2", mode, "--minutes", "0.3", "--heldout", "2",
           "--threads", "1", "--work-dir", str(tmp_path), "--out", str(out), "train.rollout_size=4",
           "--max-new-tokens", "16"]
    if mode == "env":
        cmd += ["--env-kwargs", '{"max_number": 5, "max_turns": 2}', "--max-turns", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=bench.REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == mode and result["heldout"] == 2
    for measure in result["measures"].values():
        assert measure["before"]["n"] == measure["after"]["n"] == 2
    assert result["rl"]["steps"] >= 0
