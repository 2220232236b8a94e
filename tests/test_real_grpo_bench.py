"""benchmarks/real_grpo.py's own parts, without training: the marks and the training clock, the answer
and the reward, the targets and the report, and the one held-out scorer both arms are measured by
(on the tiny "parrot" Llama of tests/test_file_eval.py, with an adapter written the way an arm writes one)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import real_grpo as bench
from lmrl.models.hf import load_hf_policy
from lmrl.models.lora import add_lora, export_merged
from lmrl.tasks.reasoning_gym import generate
from lmrl.train.file_eval import wilson_interval
from tests.test_file_eval import parrot  # noqa: F401  (the fixture)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


# ------------------------------------------------------------------------------------------------ marks

def test_marks_fall_every_interval_and_the_budget_is_always_the_last():
    assert bench.mark_minutes(20, 2) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert bench.mark_minutes(5, 2) == [2, 4, 5]
    assert bench.mark_minutes(1, 0.5) == [0.5, 1] and bench.mark_minutes(1, 2) == [1]
    with pytest.raises(ValueError):
        bench.mark_minutes(0, 2)


def test_a_mark_gets_the_state_after_the_last_step_that_ended_within_it():
    clock = FakeClock()
    marks = bench.MarkClock([1, 2], clock=clock)
    clock.now += 5  # model loading and the like, before the first step
    marks.begin()
    clock.now += 40
    assert marks.step_end(1, lambda: "after 1") == []          # 40 s: before the 1-minute mark
    clock.now += 40
    [first] = marks.step_end(2, lambda: "after 2")             # 80 s: step 2 ended past 1 minute
    assert (first["minute"], first["step"], first["train_s"], first["state"]) == (1, 1, 40, "after 1")
    clock.now += 60
    [second] = marks.step_end(3, lambda: "after 3")            # 140 s: past 2 minutes, the last mark
    assert (second["minute"], second["step"], second["state"]) == (2, 2, "after 2")
    assert marks.done and marks.steps == 3


def test_a_step_longer_than_the_marks_gives_them_the_same_state_and_none_is_the_base_model():
    clock = FakeClock()
    marks = bench.MarkClock([0.5, 1, 1.5], clock=clock)
    marks.begin()
    clock.now += 70
    passed = marks.step_end(1, lambda: "after 1")  # the first step alone outlasts two marks
    assert [(m["minute"], m["step"], m["state"]) for m in passed] == [(0.5, 0, None), (1, 0, None)]
    clock.now += 30
    assert [(m["minute"], m["step"]) for m in marks.step_end(2, lambda: "after 2")] == [(1.5, 1)]


def test_time_spent_paused_is_not_training_time():
    clock = FakeClock()
    marks = bench.MarkClock([1], clock=clock)
    marks.begin(at=clock.now - 10)  # lmrl's arm: the first step began 10 s before its end
    assert marks.elapsed() == 10
    with marks.paused():
        clock.now += 100
    clock.now += 5
    assert marks.elapsed() == 15 and marks.excluded == 100

    def slow_snapshot():
        clock.now += 30  # copying the adapter does not count
        return "state"

    marks.step_end(1, slow_snapshot)
    assert marks.elapsed() == 15


def test_adapter_marks_write_one_adapter_per_step_and_record_the_base_model_as_none(tmp_path, parrot):  # noqa: F811
    policy = load_hf_policy(str(parrot))[0]
    add_lora(policy, r=2, alpha=4, target_modules=["o_proj"])
    clock = FakeClock()
    marks = bench.AdapterMarks(bench.MarkClock([0.5, 1, 1.5, 2], clock=clock), tmp_path / "adapters")
    marks.clock.begin()
    clock.now += 40
    assert not marks.step_end(1, policy.model)   # 40 s: no step had ended by 0.5 min
    clock.now += 30
    assert not marks.step_end(2, policy.model)   # 70 s: 1 min had step 1 ready
    clock.now += 60
    assert marks.step_end(3, policy.model)       # 130 s: 1.5 and 2 min both had step 2 ready; the last mark
    assert [(r["minute"], r["step"]) for r in marks.records] == [(0.5, 0), (1, 1), (1.5, 2), (2, 2)]
    assert marks.records[0]["adapter"] is None
    assert marks.records[2]["adapter"] == marks.records[3]["adapter"] == str(tmp_path / "adapters" / "step_2")
    assert sorted(p.name for p in (tmp_path / "adapters" / "step_2").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]


# ------------------------------------------------------------------------------------ answer and reward

@pytest.mark.parametrize("completion, answer", [
    ("The GCD of 18 and 20 is 2.", "2"),
    ("84 - 12 = 72", "72"),
    ("It is -3, not 1,000", "1000"),
    ("so <answer> -28 </answer> and 5", "-28"),
    ([{"role": "assistant", "content": "<answer>4</answer>"}], "4"),
    ("no number here", None),
])
def test_the_answer_is_the_last_answer_block_else_the_last_number(completion, answer):
    assert bench.final_answer(completion) == answer


def test_the_reward_is_reasoning_gyms_score_of_the_answer_from_the_dataset_columns():
    rows = generate(["chain_sum"], 2, seed=5, config=bench.TASKS["chain_sum"])
    columns = bench.prompt_dataset_rows(rows)
    assert columns[0]["prompt"] == [{"role": "user", "content": bench.PROMPT.format(prompt=rows[0]["prompt"])}]
    kwargs = {k: [c[k] for c in columns] for k in ("task", "ground_truth", "metadata", "rg_config")}
    right, wrong = f"The answer is {rows[0]['ground_truth']}.", "The answer is 1000."
    assert bench.correctness_reward([right, wrong], prompts=None, **kwargs) == [1.0, 0.0]


def test_a_training_row_whose_question_is_held_out_is_dropped():
    train, held, dropped = bench.task_rows("gcd", 300, 40)  # two numbers up to 20: questions repeat
    assert dropped > 0 and len(train) == 300 - dropped
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}


def test_both_arms_get_the_same_grpo_arguments_and_trl_knows_every_one():
    trl = pytest.importorskip("trl")
    spec = {"prompts": 8, "group_size": 4, "max_new_tokens": 64, "temperature": 0.7, "lr": 2e-4, "seed": 0}
    kwargs = bench.grpo_kwargs(spec, "out", use_cpu=True)
    config = trl.GRPOConfig(**kwargs)
    assert (config.num_generations, config.max_completion_length, config.loss_type, config.beta) == (4, 64, "dapo", 0)
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 32
    from lmrl.trl import GRPOConfig

    lmrl = GRPOConfig(**kwargs).to_config(model_path="m", train_rows=100)
    assert (lmrl.algo.group_size, lmrl.train.rollout_size, lmrl.task.max_new_tokens) == (4, 32, 64)
    assert (lmrl.optim.lr, lmrl.train.temperature, lmrl.algo.loss_level, lmrl.schedule.name) == (
        2e-4, 0.7, "token", "constant")


# --------------------------------------------------------------------------------------- targets, report

def test_targets_pass_when_lmrl_gains_reaches_trls_end_early_and_ends_ahead():
    lmrl = [(0, 0.2), (2, 0.25), (4, 0.32), (6, 0.36), (8, 0.40), (10, 0.45)]
    trl = [(0, 0.2), (2, 0.2), (4, 0.22), (6, 0.28), (8, 0.30), (10, 0.36)]
    t = bench.targets(0.2, lmrl, trl, minutes=10)
    assert t["gain"]["pass"] and t["gain"]["value"] == pytest.approx(0.25)
    assert t["reach_trl_end"]["minute"] == 6 and t["reach_trl_end"]["limit"] == 4 and not t["reach_trl_end"]["pass"]
    assert t["ahead_at_end"]["pass"]


def test_targets_fail_when_lmrl_never_reaches_trl_and_a_tie_is_not_ahead():
    t = bench.targets(0.2, [(0, 0.2), (2, 0.25)], [(0, 0.2), (2, 0.3)], minutes=2)
    assert not t["gain"]["pass"] and t["reach_trl_end"]["minute"] is None and not t["reach_trl_end"]["pass"]
    t = bench.targets(0.2, [(0, 0.2), (2, 0.3)], [(0, 0.2), (2, 0.3)], minutes=2)
    assert t["gain"]["pass"] and not t["ahead_at_end"]["pass"]
    # TRL ending no better than the base model is reached at minute 0
    assert bench.targets(0.2, [(0, 0.2), (2, 0.3)], [(0, 0.2), (2, 0.1)], minutes=2)["reach_trl_end"]["minute"] == 0


def test_the_report_has_a_row_per_mark_with_each_arms_step_and_the_three_targets(tmp_path):
    marks = [{"minute": 1, "step": 3, "adapter": "a1"}, {"minute": 2, "step": 6, "adapter": "a2"}]
    trl_marks = [{"minute": 1, "step": 0, "adapter": None}, {"minute": 2, "step": 2, "adapter": "t2"}]
    accuracy = {"a1": 0.4, "a2": 0.5, "t2": 0.3}
    result = {"base": {"accuracy": 0.25, "ci95": [0.1, 0.4], "rows": 8}, "train_rows": 16, "train_rows_dropped": 0,
              "arms": {"lmrl": {"marks": marks, "curve": bench.curve(0.25, marks, accuracy)},
                       "trl": {"marks": trl_marks, "curve": bench.curve(0.25, trl_marks, accuracy)}}}
    assert result["arms"]["trl"]["curve"] == [(0, 0.25), (1, 0.25), (2, 0.3)]
    result["targets"] = bench.targets(0.25, result["arms"]["lmrl"]["curve"], result["arms"]["trl"]["curve"], 2)
    text = "\n".join(bench.task_report("gcd", result, 2))
    assert "| 1 | 40.0% (step 3) | 25.0% (step 0) |" in text and "| 2 | 50.0% (step 6) | 30.0% (step 2) |" in text
    assert "+25.0 points: PASS" in text and "50.0% vs 30.0%: PASS" in text
    assert "TRL's 2-minute accuracy (30.0%) within 0.8 min: at 1 min: FAIL" in text
    png = bench.plot({"gcd": result}, 2, tmp_path / "acc.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------ the shared scorer

def test_the_held_out_scorer_answers_with_an_arms_adapter_as_the_merged_model(tmp_path, parrot):  # noqa: F811
    rows = generate(["chain_sum"], 3, seed=7, config=bench.TASKS["chain_sum"])
    held = bench.write_jsonl(tmp_path / "heldout.jsonl", rows)
    policy = load_hf_policy(str(parrot))[0]
    add_lora(policy, r=4, alpha=8, target_modules=["o_proj"])  # the parrot's attention output is all adapter
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 2.0)
    adapter = bench.write_adapter(policy.model, bench.adapter_state(policy.model), tmp_path / "adapter")
    merged = export_merged(policy, policy.tokenizer, tmp_path / "merged")

    def score(model, adapter_dir, name):
        out = tmp_path / f"{name}.jsonl"
        result = bench.heldout_accuracy(str(model), str(held), adapter_dir and str(adapter_dir), max_new_tokens=4,
                                        batch_size=2, out=out)
        return result, [json.loads(line)["completion"] for line in out.read_text().splitlines()]

    base, base_text = score(parrot, None, "base")
    with_adapter, adapter_text = score(parrot, adapter, "adapter")
    merged_result, merged_text = score(merged, None, "merged")
    assert adapter_text == merged_text and with_adapter == merged_result
    assert adapter_text != base_text
    assert base["rows"] == 3 and base["accuracy"] == base["correct"] / 3
    assert base["ci95"] == pytest.approx(list(wilson_interval(base["correct"], 3)))
    expected = [bench.score_completion(text, row) >= 1 for text, row in zip(adapter_text, rows)]
    assert with_adapter["correct"] == sum(expected)
