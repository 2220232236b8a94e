"""The examples of TRL's GRPO and DPO pages (docs/source/grpo_trainer.md and dpo_trainer.md) on
lmrl.trl: each test runs one example's pattern with a tiny model and a few rows, its docstring naming
the section; an example lmrl cannot run is refused with the field and the reason. Reward functions
that must see a format, a tool call or a boxed answer get it from `write` (a tiny random model would
never write one); the others score what the model samples."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import random
import re

import pytest
import torch
import trl
from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from lmrl.config import ConfigError
from lmrl.tasks.rewards import RewardError
from lmrl.trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer
from tests.test_tool_training import save_byte_llama

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama whose byte-level tokenizer writes any text (tool calls, \\boxed{}) back unchanged."""
    root = tmp_path_factory.mktemp("trl-docs")
    save_byte_llama(root / "model")
    return root / "model"


def grpo_args(out, **kwargs) -> GRPOConfig:
    base = dict(output_dir=str(out), num_generations=2, per_device_train_batch_size=4, max_completion_length=8,
                max_steps=1, logging_steps=1, use_cpu=True, bf16=False, report_to="none", seed=7)
    return GRPOConfig(**{**base, **kwargs})


def dpo_args(out, **kwargs) -> DPOConfig:
    base = dict(output_dir=str(out), per_device_train_batch_size=2, max_steps=1, logging_steps=1, use_cpu=True,
                bf16=False, report_to="none", max_length=64)
    return DPOConfig(**{**base, **kwargs})


def write(trainer, answer):
    """The trainer's policy writes `answer(context)` as each of its turns (then its end token), where
    context is the text it is asked to continue: the prompt, earlier turns and tool results."""
    policy = trainer.inner.model
    tok = policy.tokenizer

    def generate_ids(ids, mask, max_new_tokens, **_):
        rows = []
        for row, keep in zip(ids, mask):
            text = answer(tok.decode(row[keep.bool()]))
            rows.append((tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:max_new_tokens])
        completion = torch.full((len(rows), max(map(len, rows))), tok.pad_token_id, device=ids.device)
        kept = torch.zeros_like(completion)
        for i, r in enumerate(rows):
            completion[i, :len(r)], kept[i, :len(r)] = torch.tensor(r), 1
        return completion, kept, torch.where(kept.bool(), -0.5, 0.0)

    policy.generate_ids = generate_ids


def step_log(trainer) -> dict:
    """The first training step's entry of the log history (TRL's metric names)."""
    return next(e for e in trainer.state.log_history if "loss" in e)


def step_calls(calls: list[dict]) -> list[dict]:
    """The reward calls of training steps (a held-out evaluation's trainer_state has no max_steps)."""
    return [c for c in calls if c["trainer_state"].max_steps > 0]


class StopAfterFirstStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = True


# ------------------------------------------------------------------------------------------- GRPO page

def test_grpo_quick_start_trains_at_trls_defaults_with_accuracy_reward(model_dir, tmp_path, monkeypatch):
    """GRPO, "Quick start": a model path, TRL's accuracy_reward, a conversational math set with a
    `solution` column, and no GRPOConfig at all (TRL's defaults, output_dir trainer_output)."""
    from lmrl.trl.rewards import accuracy_reward

    monkeypatch.chdir(tmp_path)
    sums = [(2, 3), (4, 4), (1, 6), (5, 2)]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                                  "solution": f"${a + b}$"} for a, b in sums])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=accuracy_reward, train_dataset=dataset,
                          callbacks=[StopAfterFirstStep])  # TRL's defaults run 12 steps: one is enough here
    write(trainer, lambda context: "The answer is \\boxed{%d}." % sum(map(int, re.findall(
        r"What is (\d+) \+ (\d+)\?", context)[-1])))
    trainer.train()
    cfg, trls = trainer.config, {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    assert (cfg.algo.group_size, cfg.train.rollout_size, cfg.task.max_new_tokens) == \
        (trls["num_generations"], trls["per_device_train_batch_size"], trls["max_completion_length"])
    assert cfg.run.dir.endswith("trainer_output") and trainer.state.global_step == 1
    assert step_log(trainer)["rewards/accuracy_reward/mean"] == 1.0  # the boxed sums match the solutions


def test_grpo_vllm_colocate_mode_is_carried(model_dir, tmp_path):
    """GRPO, "Speed up training with vLLM-powered generation", Option 1: colocate mode (use_vllm=True)."""
    args = grpo_args(tmp_path / "run", use_vllm=True)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=[{"prompt": "Hi"}] * 4)
    assert trainer.config.rollout.engine == "vllm"
    if importlib.util.find_spec("vllm") is None:  # no vLLM here: the run says what it needs in one line
        with pytest.raises(ImportError, match="rollout.engine=vllm needs vLLM"):
            trainer.train()


def test_grpo_vllm_server_mode_and_the_multi_node_script_run_vllm_colocated(model_dir, tmp_path):
    """GRPO, "Option 2: Server mode" and "GRPO at scale: train a 70B+ Model on multiple nodes" (the
    training script's GRPOConfig): lmrl has no vLLM server client, so vllm_mode and the server's
    address change nothing (named in the run log) and vLLM runs inside the trainer."""
    args = grpo_args(tmp_path / "run", per_device_train_batch_size=4, use_vllm=True, vllm_mode="server",
                     vllm_server_host="10.0.0.5")
    cfg = args.to_config(model_path=str(model_dir), train_rows=8)
    assert cfg.rollout.engine == "vllm" and args.ignored == ["vllm_mode", "vllm_server_host"]


def test_grpo_transformers_continuous_batching_is_refused(tmp_path):
    """GRPO, "Speed up training with transformers continuous batching"."""
    args = grpo_args(tmp_path, use_transformers_continuous_batching=True,
                     transformers_continuous_batching_config={"use_cuda_graph": False, "max_memory_percent": 0.4})
    with pytest.raises(ConfigError, match=r"use_transformers_continuous_batching=True\): lmrl samples with its own"):
        args.to_config(model_path="m", train_rows=8)


@pytest.mark.parametrize("loss_type, level", [("grpo", "sequence"), ("dapo", "token"), ("dr_grpo", "constant")])
def test_grpo_loss_types_of_the_loss_section_are_carried(tmp_path, loss_type, level):
    """GRPO, "Loss Types": loss_type="dapo" / "dr_grpo" (and the original grpo)."""
    assert grpo_args(tmp_path, loss_type=loss_type).to_config(model_path="m", train_rows=8).algo.loss_level == level


def test_grpo_sapo_loss_is_refused(tmp_path):
    """GRPO, "Loss Types": loss_type="sapo"."""
    with pytest.raises(ConfigError, match=r"loss_type='sapo'\): lmrl's losses are grpo, dapo, bnpo, dr_grpo"):
        grpo_args(tmp_path, loss_type="sapo").to_config(model_path="m", train_rows=8)


def test_reward_functions_get_the_documented_keyword_arguments(model_dir, tmp_path):
    """GRPO, "Using a custom reward function", input arguments: prompts, completions, completion_ids,
    trainer_state, log_extra, log_metric and every dataset column but prompt (no environments
    without environment_factory)."""
    calls = []

    def spy(**kwargs):
        calls.append(kwargs)
        return [0.0] * len(kwargs["completions"])

    rows = [{"prompt": f"Say {w}.", "ground_truth": w, "level": i} for i, w in enumerate(["red", "blue", "green"])]
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=spy, args=grpo_args(tmp_path / "run", max_steps=2),
                          train_dataset=rows)
    trainer.train()
    steps = step_calls(calls)
    assert len(steps) == 2
    assert set(steps[0]) == {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                             "ground_truth", "level"}
    assert [(c["trainer_state"].global_step, c["trainer_state"].max_steps) for c in steps] == [(0, 2), (1, 2)]
    first = steps[0]
    assert all(isinstance(p, str) and isinstance(c, str) for p, c in zip(first["prompts"], first["completions"]))
    for prompt, truth, level in zip(first["prompts"], first["ground_truth"], first["level"]):
        assert prompt == f"Say {truth}." and rows[level]["ground_truth"] == truth  # the row's own columns


def test_example_1_reward_longer_completions_in_tokens(model_dir, tmp_path):
    """GRPO, "Example 1: Reward longer completions": completion_ids' lengths."""
    calls = []

    def reward_func(completion_ids, **kwargs):
        calls.append({"ids": completion_ids, **kwargs})
        return [float(len(ids)) for ids in completion_ids]

    assert reward_func(prompts=["The sky is", "The sun is"], completions=[" blue.", " in the sky."],
                       completion_ids=[[6303, 13], [304, 279, 12884, 13]]) == [2.0, 4.0]
    calls.clear()
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_func, args=grpo_args(tmp_path / "run"),
                          train_dataset=[{"prompt": p} for p in ("The sky is", "The sun is", "Grass is")])
    trainer.train()
    (step,) = step_calls(calls)
    tok = trainer.processing_class
    assert [tok.decode(ids, skip_special_tokens=True) for ids in step["ids"]] == step["completions"]
    lengths = [len(ids) for ids in step["ids"]]
    assert step_log(trainer)["rewards/reward_func/mean"] == pytest.approx(sum(lengths) / len(lengths))


def test_example_1_1_reward_longer_completions_in_characters(model_dir, tmp_path):
    """GRPO, "Example 1.1: Reward longer completions (based on the number of characters)"."""
    calls = []

    def reward_func(completions, **kwargs):
        calls.append({"completions": completions, **kwargs})
        return [float(len(completion)) for completion in completions]

    assert reward_func(prompts=["The sky is", "The sun is"], completions=[" blue.", " in the sky."],
                       completion_ids=[[6303, 13], [304, 279, 12884, 13]]) == [6.0, 12.0]
    calls.clear()
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_func, args=grpo_args(tmp_path / "run"),
                          train_dataset=[{"prompt": p} for p in ("The sky is", "The sun is")])
    trainer.train()
    (step,) = step_calls(calls)
    log = step_log(trainer)
    assert log["reward"] == log["rewards/reward_func/mean"] == pytest.approx(
        sum(map(len, step["completions"])) / 4)


def format_reward_func(completions, **kwargs):
    """Example 2's reward: 1.0 for a completion shaped <think>...</think><answer>...</answer>."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    return [1.0 if re.match(pattern, completion[0]["content"]) else 0.0 for completion in completions]


def test_example_2_format_reward_on_conversations(model_dir, tmp_path):
    """GRPO, "Example 2: Reward completions with a specific format": conversational prompts, the
    completions message lists."""
    assert format_reward_func(completions=[[{"role": "assistant", "content": "<think>3 * 4</think><answer>12"
                                                                          "</answer>"}],
                                           [{"role": "assistant", "content": "It is 8."}]]) == [1.0, 0.0]
    calls = []

    def spy(prompts, completions, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, **kwargs})
        return format_reward_func(completions)

    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is the result of ({a} + 2) * 4?"}]}
                              for a in (1, 2, 3, 4)])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=spy, args=grpo_args(tmp_path / "run",
                          max_completion_length=64), train_dataset=chat)
    write(trainer, lambda context: "<think>Add, then multiply.</think><answer>12</answer>" if "(1 + 2)" in context
          else "It is more than 12.")  # the format for the first prompt only
    trainer.train()
    (step,) = step_calls(calls)
    assert all(p[-1]["role"] == "user" and c == [{"role": "assistant", "content": c[0]["content"]}]
               for p, c in zip(step["prompts"], step["completions"]))
    shaped = [float("(1 + 2)" in p[-1]["content"]) for p in step["prompts"]]
    assert step_log(trainer)["rewards/spy/mean"] == pytest.approx(sum(shaped) / 4)


def boxed_reward(completions, ground_truth, **kwargs):
    """Example 3's reward: 1.0 where the \\boxed{} content is the ground truth."""
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    return [1.0 if (m.group(1) if m else "") == truth else 0.0 for m, truth in zip(matches, ground_truth)]


def test_example_3_reward_against_a_ground_truth_column(model_dir, tmp_path):
    """GRPO, "Example 3: Reward completions based on a reference": the `ground_truth` column of each
    row reaches the function beside its completions (standard format)."""
    assert boxed_reward(completions=[r" The solution is \boxed{2}.", r" The solution is \boxed{6}."],
                        ground_truth=["2", "5"]) == [1.0, 0.0]
    calls = []

    def spy(completions, ground_truth, **kwargs):
        calls.append({"completions": completions, "ground_truth": ground_truth, **kwargs})
        return boxed_reward(completions, ground_truth)

    rows = [{"prompt": "Problem: Solve the equation $2x + 3 = 7$. Solution:", "ground_truth": "2"},
            {"prompt": "Problem: Solve the equation $3x - 5 = 10$.", "ground_truth": "5"}]
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=spy, args=grpo_args(tmp_path / "run",
                          max_completion_length=32), train_dataset=rows)
    write(trainer, lambda context: r" The solution is \boxed{2}." if "2x + 3" in context else r" It is \boxed{6}.")
    trainer.train()
    (step,) = step_calls(calls)
    assert step["completions"] == [r" The solution is \boxed{2}." if t == "2" else r" It is \boxed{6}."
                                   for t in step["ground_truth"]]  # each row's column beside its completion
    assert step_log(trainer)["rewards/spy/mean"] == step["ground_truth"].count("2") / 4


def check_math_solution(prompt: str, completion: str) -> bool:
    a, op, b = re.search(r"(\d+)\s*([+*])\s*(\d+)", prompt).groups()
    return completion.strip() == str(int(a) + int(b) if op == "+" else int(a) * int(b))


def test_code_solution(prompt: str, completion: str) -> bool:
    return completion.lstrip().startswith("def ")


test_code_solution.__test__ = False  # the example's helper, not a test


def math_reward_func(prompts, completions, task, **kwargs):
    return [(1.0 if check_math_solution(p, c) else -1.0) if t == "math" else None
            for p, c, t in zip(prompts, completions, task)]


def coding_reward_func(prompts, completions, task, **kwargs):
    return [(1.0 if test_code_solution(p, c) else -1.0) if t == "coding" else None
            for p, c, t in zip(prompts, completions, task)]


def test_example_4_multi_task_rewards_leave_other_tasks_out(model_dir, tmp_path):
    """GRPO, "Example 4: Multi-task reward functions": each function scores its own task's rows and
    returns None for the others, which are left out of the sum and of its mean."""
    rows = [{"prompt": "What is 2+2?", "task": "math"},
            {"prompt": "Write a function that returns the sum of two numbers.", "task": "coding"},
            {"prompt": "What is 3*4?", "task": "math"},
            {"prompt": "Write a function that returns the product of two numbers.", "task": "coding"}]
    steps = []

    def math_spy(prompts, completions, task, trainer_state, **kwargs):
        rewards = math_reward_func(prompts, completions, task)
        if trainer_state.max_steps:  # a training step's batch
            steps.append(rewards)
        return rewards

    math_spy.__name__ = "math_reward_func"
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[math_spy, coding_reward_func],
                          args=grpo_args(tmp_path / "run", max_steps=2, max_completion_length=32,
                                         shuffle_dataset=False), train_dataset=rows)  # batches of a math and a coding row
    write(trainer, lambda context: "def f(a, b): return a" if "Write" in context else
          "4" if "2+2" in context else "13")  # 3*4 answered wrong
    trainer.train()
    assert len(steps) == 2 and any(None in r and set(r) - {None} for r in steps)  # a step with both tasks
    for math, log in zip(steps, [e for e in trainer.state.log_history if "loss" in e]):
        scored = [r for r in math if r is not None]
        coding = len(math) - len(scored)  # the coding rows, each scored 1.0 by coding_reward_func
        if scored:  # a function's mean is over the rows it scored
            assert log["rewards/math_reward_func/mean"] == pytest.approx(sum(scored) / len(scored))
        if coding:
            assert log["rewards/coding_reward_func/mean"] == 1.0
        assert log["reward"] == pytest.approx((sum(scored) + coding) / 4)  # one function's reward per completion


def test_example_4_as_printed_a_row_no_function_scores_is_refused(model_dir, tmp_path):
    """GRPO, "Example 4", as the page prints it: the data set's task is "code" while
    coding_reward_func looks for "coding", so no function scores the coding rows. TRL warns and counts
    0 for them; lmrl refuses the batch, naming the functions and the row."""
    rows = [{"prompt": "What is 2+2?", "task": "math"},
            {"prompt": "Write a function that returns the sum of two numbers.", "task": "code"}] * 2
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[math_reward_func, coding_reward_func],
                          args=grpo_args(tmp_path / "run"), train_dataset=rows)
    with pytest.raises(RewardError, match=r"every reward function \(math_reward_func, coding_reward_func\) returned "
                                          r"None for prompt 'Write a function"):
        trainer.train()


async def async_reward_func(prompts, completions, **kwargs):
    """Example 5's reward, awaited: 1.0 for a non-empty completion."""
    await asyncio.sleep(0.01)
    return [1.0 if completion else 0.0 for completion in completions]


def test_example_5_async_reward_function_is_awaited(model_dir, tmp_path):
    """GRPO, "Example 5: Asynchronous reward functions"."""
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=async_reward_func, args=grpo_args(tmp_path / "run"),
                          train_dataset=[{"prompt": "Say anything."}] * 2)
    write(trainer, lambda context: "Something.")
    trainer.train()
    assert step_log(trainer)["rewards/async_reward_func/mean"] == 1.0


def test_example_6_log_metric_is_logged_under_its_name_and_log_extra_is_taken(model_dir, tmp_path):
    """GRPO, "Example 6: Logging extra columns and metrics": log_metric("accuracy", ...) is in the step's
    log under that name; log_extra's columns are accepted (lmrl keeps no completions table to show them)."""
    extra = {}

    def reward_func(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
        extracted = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
        extracted = [m.group(1) if m else None for m in extracted]
        rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]
        if log_extra:
            log_extra("golden_answer", list(ground_truth))
            log_extra("extracted_answer", [e or "[none]" for e in extracted])
            extra.setdefault("columns", []).append(len(ground_truth))
        if log_metric:
            log_metric("accuracy", sum(rewards) / len(rewards))
        return rewards

    rows = [{"prompt": "What is 1+1?", "ground_truth": "2"}, {"prompt": "What is 2+2?", "ground_truth": "4"}]
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_func, args=grpo_args(tmp_path / "run",
                          max_completion_length=16), train_dataset=rows)
    write(trainer, lambda context: r"\boxed{2}")
    trainer.train()
    log = step_log(trainer)
    assert log["accuracy"] == log["rewards/reward_func/mean"] == 0.5 and 4 in extra["columns"]


def test_passing_several_reward_functions_sums_them_with_reward_weights(model_dir, tmp_path):
    """GRPO, "Passing the reward function to the trainer": a list of sync and async functions, summed
    with GRPOConfig's reward_weights."""

    def reward_func(completions, **kwargs):
        return [2.0] * len(completions)

    async def async_reward_func1(completions, **kwargs):
        return [1.0] * len(completions)

    async def async_reward_func2(completions, **kwargs):
        await asyncio.sleep(0.01)
        return [-1.0] * len(completions)

    args = grpo_args(tmp_path / "run", reward_weights=[1.0, 0.5, 3.0])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward_func, async_reward_func1, async_reward_func2],
                          args=args, train_dataset=[{"prompt": "Hi"}] * 4)
    trainer.train()
    log = step_log(trainer)
    assert (log["rewards/reward_func/mean"], log["rewards/async_reward_func1/mean"],
            log["rewards/async_reward_func2/mean"]) == (2.0, 1.0, -1.0)
    assert log["reward"] == pytest.approx(2.0 * 1.0 + 1.0 * 0.5 - 1.0 * 3.0)


def test_static_entropy_regularization_subtracts_the_bonus(model_dir, tmp_path):
    """GRPO, "Entropy regularization", static: entropy_coef=0.05 (loss = policy loss - 0.05 x entropy)."""
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=grpo_args(tmp_path / "run", entropy_coef=0.05), train_dataset=[{"prompt": "Hi"}] * 4)
    trainer.train()
    log = step_log(trainer)
    assert trainer.config.algo.ent_coef == 0.05 and log["entropy"] > 0
    assert log["loss"] == pytest.approx(log["policy_loss"] - 0.05 * log["entropy"], rel=1e-4)


def test_adaptive_entropy_is_refused(tmp_path):
    """GRPO, "Entropy regularization", adaptive (use_adaptive_entropy=True)."""
    args = grpo_args(tmp_path, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=5.0,
                     entropy_coef_delta=0.005, entropy_coef_min=0.0, entropy_coef_max=1.0)
    with pytest.raises(ConfigError, match=r"use_adaptive_entropy=True\): a fixed entropy_coef only"):
        args.to_config(model_path="m", train_rows=8)


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def call(name: str, **arguments) -> str:
    """A tool call as the model writes it (the Hermes format lmrl's tool task parses)."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_tools_sync_and_async_are_called_and_their_results_reach_the_reward(model_dir, tmp_path):
    """GRPO, "Agent Training" / "Tools": tools=[multiply, async_add]."""
    seen = []

    def reward_func(completions, **kwargs):
        seen.append({"completions": completions, **kwargs})
        return [float(any(m["role"] == "tool" and m["content"] == "408" for m in c)) for c in completions]

    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward_func, tools=[multiply, async_add],
                          args=grpo_args(tmp_path / "run", max_completion_length=192, max_tool_calling_iterations=1),
                          train_dataset=[{"prompt": [{"role": "user", "content": "What is 12 * 34, and 2 + 3?"}]}] * 2)
    assert [s["function"]["name"] for s in trainer.task.schemas] == ["multiply", "async_add"]
    write(trainer, lambda context: "408 and 5." if "<|im_start|>tool" in context else
          call("multiply", a=12, b=34) + "\n" + call("async_add", a=2, b=3))
    trainer.train()
    episode = step_calls(seen)[0]["completions"][0]
    assert [m["role"] for m in episode] == ["assistant", "tool", "tool", "assistant"]
    assert [m["content"] for m in episode if m["role"] == "tool"] == ["408", "5"]
    log = step_log(trainer)
    assert log["rewards/reward_func/mean"] == 1.0 and log["tools/calls"] == 2


class IncrementEnv:
    """The Environments section's environment: reset() draws a target and returns the prompt, the
    public method is the tool, get_reward() scores the episode."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def increment_as_asked(context: str) -> str:
    """One increment call by the number the prompt asks for, then a closing turn."""
    if "<|im_start|>tool" in context:
        return "Done."
    asked = re.findall(r"Increment the counter (?:by|to) (\d+)", context)[-1]
    return call("increment", step=int(asked))


def test_an_environment_that_owns_its_data_and_reward_trains(model_dir, tmp_path):
    """GRPO, "Environments": environment_factory=IncrementEnv, no train_dataset (reset() makes each
    prompt), max_steps sets the length, get_reward is a reward source named after the class; the
    example's chat_template_kwargs={"enable_thinking": False} go to the chat template
    (tests/test_chat_template_kwargs.py follows them into every rendering, on Qwen3's template)."""
    random.seed(0)
    args = grpo_args(tmp_path / "run", max_completion_length=96, chat_template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer(model=str(model_dir), args=args, environment_factory=IncrementEnv)
    assert trainer.config.model.chat_template_kwargs == {"enable_thinking": False}
    write(trainer, increment_as_asked)
    trainer.train()
    log = step_log(trainer)
    assert trainer.state.global_step == 1 and log["rewards/IncrementEnv/mean"] == 1.0 and log["reward"] == 1.0


class TargetEnv:
    """The external-dataset variant: the row's `target` column arrives in reset()."""

    targets: list = []

    def reset(self, target, **kwargs) -> None:
        self.counter, self.target = 0, target
        TargetEnv.targets.append(target)

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter


def test_an_environment_reads_its_task_from_the_dataset_row(model_dir, tmp_path):
    """GRPO, "Providing an external dataset (optional)": the prompt column is the prompt, the row's
    other columns reach reset() as keywords."""
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}]
                                            for i in range(1, 7)], "target": list(range(1, 7))})
    TargetEnv.targets = []
    trainer = GRPOTrainer(model=str(model_dir), train_dataset=dataset, environment_factory=TargetEnv,
                          args=grpo_args(tmp_path / "run", max_completion_length=96))
    write(trainer, increment_as_asked)
    trainer.train()
    assert set(TargetEnv.targets) <= set(range(1, 7)) and len(TargetEnv.targets) >= 4
    assert step_log(trainer)["rewards/TargetEnv/mean"] == 1.0


def test_trainer_owned_and_environment_owned_rewards_are_summed(model_dir, tmp_path):
    """GRPO, "Rewards": reward_funcs=format_reward beside an environment's get_reward (reward_weights
    weigh the functions only)."""

    def format_reward(completions, environments=None, **kwargs):
        assert len(environments) == len(completions)  # one environment instance per completion
        return [0.5 if c[0]["content"].startswith("<tool_call>") else 0.0 for c in completions]

    random.seed(1)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=format_reward, environment_factory=IncrementEnv,
                          args=grpo_args(tmp_path / "run", max_completion_length=96, reward_weights=[2.0]))
    write(trainer, increment_as_asked)
    trainer.train()
    log = step_log(trainer)
    assert (log["rewards/format_reward/mean"], log["rewards/IncrementEnv/mean"]) == (0.5, 1.0)
    assert log["reward"] == pytest.approx(2.0 * 0.5 + 1.0)


def test_multiple_environments_are_refused(model_dir, tmp_path):
    """GRPO, "Multiple environments": environment_factory={"coding": ..., "game": ...}."""

    class CodingEnv(IncrementEnv):
        pass

    with pytest.raises(ValueError, match=r"environment_factory=\{'coding': \.\.\., 'game': \.\.\.\}: several "
                                         r"environments .* are not supported"):
        GRPOTrainer(model=str(model_dir), args=grpo_args(tmp_path / "run"), reward_funcs=format_reward_func,
                    train_dataset=Dataset.from_dict({"environment": ["coding", "game"] * 2}),
                    environment_factory={"coding": CodingEnv, "game": IncrementEnv})


# -------------------------------------------------------------------------------------------- DPO page

PAIR_FORMATS = {
    "standard, explicit prompt": {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    "standard, implicit prompt": {"chosen": "The sky is blue.", "rejected": "The sky is green."},
    "conversational, explicit prompt": {"prompt": [{"role": "user", "content": "What color is the sky?"}],
                                        "chosen": [{"role": "assistant", "content": "It is blue."}],
                                        "rejected": [{"role": "assistant", "content": "It is green."}]},
    "conversational, implicit prompt": {"chosen": [{"role": "user", "content": "What color is the sky?"},
                                                   {"role": "assistant", "content": "It is blue."}],
                                        "rejected": [{"role": "user", "content": "What color is the sky?"},
                                                     {"role": "assistant", "content": "It is green."}]},
}
TRL_DPO_METRICS = {"loss", "learning_rate", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins",
                   "rewards/accuracies", "logps/chosen", "logps/rejected", "epoch"}


def test_dpo_quick_start_trains_at_trls_defaults(model_dir, tmp_path, monkeypatch):
    """DPO, "Quick start": a model path and a preference set, no DPOConfig (TRL's defaults: 3 epochs
    of batches of 8, output_dir trainer_output); "Logged metrics": TRL's names."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"Is {a} more than {b}?", "chosen": " Yes." if a > b else " No.",
             "rejected": " No." if a > b else " Yes."} for a, b in [(3, 1), (2, 5), (9, 4), (1, 7)]]
    trainer = DPOTrainer(model=str(model_dir), train_dataset=Dataset.from_list(rows))
    trainer.train()
    assert trainer.config.run.dir.endswith("trainer_output") and trainer.config.data.batch_size == 8
    assert trainer.state.global_step == 2  # 3 epochs x 4 rows in batches of 8
    assert TRL_DPO_METRICS <= step_log(trainer).keys()


@pytest.mark.parametrize("name", PAIR_FORMATS)
def test_dpo_trains_on_each_preference_format(model_dir, tmp_path, name):
    """DPO, "Expected dataset type and format": standard and conversational rows, explicit and implicit
    prompt; a conversation goes through the chat template."""
    trainer = DPOTrainer(model=str(model_dir), args=dpo_args(tmp_path / "run"), train_dataset=[PAIR_FORMATS[name]] * 4)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    assert trainer.config.data.chat == name.startswith("conversational")
    log = step_log(trainer)
    # the policy is its reference at step 1: margin 0, loss -log σ(0)
    assert log["rewards/margins"] == 0.0 and log["loss"] == pytest.approx(0.693147, rel=1e-5)
    assert log["logps/chosen"] < 0 and log["logps/rejected"] < 0
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_dpo_trains_on_a_set_mapped_into_the_conversational_format(model_dir, tmp_path):
    """DPO, "Expected dataset type and format": the Code-Preference-Pairs preprocessing (map to
    conversational prompt/chosen/rejected, drop the other columns)."""
    raw = DatasetDict({"train": Dataset.from_list([
        {"instruction": "", "input": f"Print the numbers up to {n}.", "accepted": f"for i in range({n}): print(i)",
         "rejected": f"print({n})", "ID": str(n)} for n in range(1, 5)])})

    def preprocess_function(example):
        return {"prompt": [{"role": "user", "content": example["input"]}],
                "chosen": [{"role": "assistant", "content": example["accepted"]}],
                "rejected": [{"role": "assistant", "content": example["rejected"]}]}

    dataset = raw.map(preprocess_function, remove_columns=["instruction", "input", "accepted", "ID"])
    assert set(next(iter(dataset["train"]))) == {"prompt", "chosen", "rejected"}
    trainer = DPOTrainer(model=str(model_dir), args=dpo_args(tmp_path / "run"), train_dataset=dataset["train"])
    trainer.train()
    assert trainer.config.data.chat and trainer.state.global_step == 1


@pytest.mark.parametrize("loss_type, label_smoothing, first_loss", [
    ("sigmoid", 0.0, 0.693147),  # -log σ(0)
    ("hinge", 0.0, 1.0),  # max(0, 1 - β·0)
    ("ipo", 0.0, 25.0),  # (0 - 1/(2·0.1))²
    ("robust", 0.1, 0.693147),  # (-(1 - ε) log σ(0) + ε log σ(0)) / (1 - 2ε)
])
def test_dpo_loss_types_lmrl_has_train(model_dir, tmp_path, loss_type, label_smoothing, first_loss):
    """DPO, "Loss Types": sigmoid (default), hinge, ipo and robust (with label_smoothing, the chance a
    label is flipped); at step 1 the policy is its reference, so the loss is the formula at margin 0."""
    args = dpo_args(tmp_path / "run", loss_type=loss_type, label_smoothing=label_smoothing)
    trainer = DPOTrainer(model=str(model_dir), args=args, train_dataset=[PAIR_FORMATS["standard, explicit prompt"]] * 4)
    trainer.train()
    assert (trainer.config.dpo.loss_type, trainer.config.dpo.label_smoothing) == (loss_type, label_smoothing)
    assert step_log(trainer)["loss"] == pytest.approx(first_loss, rel=1e-4)


def test_dpo_label_smoothing_with_sigmoid_changes_nothing_as_in_trl(tmp_path):
    """DPO, "Loss Types": label_smoothing is read by robust (and EXO) only; TRL's sigmoid ignores it."""
    args = dpo_args(tmp_path, label_smoothing=0.1)
    assert args.to_config(model_path="m", train_rows=4).dpo.label_smoothing == 0.0
    assert any("label_smoothing=0.1 changes nothing with loss_type='sigmoid'" in note for note in args.notes)


@pytest.mark.parametrize("loss_type", ["exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
                                       "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"])
def test_dpo_loss_types_lmrl_lacks_are_refused(tmp_path, loss_type):
    """DPO, "Loss Types": the rest of the table."""
    args = dpo_args(tmp_path, loss_type=loss_type, label_smoothing=1e-3 if loss_type == "exo_pair" else 0.0)
    with pytest.raises(ConfigError, match=rf"loss_type=\['{loss_type}'\]\): lmrl takes one of sigmoid, ipo, hinge, "
                                          rf"robust"):
        args.to_config(model_path="m", train_rows=4)


def test_dpo_multi_loss_combinations_are_refused(tmp_path):
    """DPO, "Multi-loss combinations": MPO's loss_type=[sigmoid, bco_pair, sft] with loss_weights."""
    args = dpo_args(tmp_path, loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0])
    with pytest.raises(ConfigError, match=r"loss_weights=\[0.8, 0.2, 1.0\]\): one loss type, weight 1"):
        args.to_config(model_path="m", train_rows=4)


def test_dpo_model_init_kwargs_load_the_model_in_bfloat16(model_dir, tmp_path):
    """DPO, "Model initialization": model_init_kwargs={"dtype": torch.bfloat16}."""
    args = dpo_args(tmp_path / "run", model_init_kwargs={"dtype": torch.bfloat16})
    trainer = DPOTrainer(model=str(model_dir), args=args, train_dataset=[PAIR_FORMATS["standard, explicit prompt"]] * 4)
    trainer.train()
    assert trainer.config.model.dtype == "bf16" and next(trainer.model.parameters()).dtype == torch.bfloat16


def test_dpo_trains_a_lora_adapter_from_peft_config(model_dir, tmp_path):
    """DPO, "Train adapters with PEFT": DPOTrainer(path, train_dataset=, peft_config=LoraConfig())
    (the model positional); save_model writes the adapter."""
    from peft import LoraConfig, PeftModel

    trainer = DPOTrainer(str(model_dir), train_dataset=[PAIR_FORMATS["standard, explicit prompt"]] * 4,
                         peft_config=LoraConfig(), args=dpo_args(tmp_path / "run", learning_rate=1e-5))
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    assert isinstance(trainer.model, PeftModel) and (tmp_path / "adapter" / "adapter_config.json").is_file()


def test_dpo_continues_training_a_loaded_peft_model(model_dir, tmp_path):
    """DPO, "Train adapters with PEFT": a PeftModel loaded with AutoPeftModelForCausalLM(...,
    is_trainable=True) and passed without peft_config or processing_class (the tokenizer is the base
    model's, as TRL loads it)."""
    from peft import AutoPeftModelForCausalLM, LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora).save_pretrained(tmp_path / "adapter")
    model = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter"), is_trainable=True)
    before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    trainer = DPOTrainer(model=model, train_dataset=Dataset.from_list([PAIR_FORMATS["standard, explicit prompt"]] * 4),
                         args=dpo_args(tmp_path / "run", learning_rate=1e-3))
    trainer.train()
    assert trainer.processing_class.chat_template == AutoTokenizer.from_pretrained(model_dir).chat_template
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items() if k in before)


def test_dpo_takes_a_loaded_reference_model(model_dir, tmp_path):
    """DPOTrainer(ref_model=...), TRL 1.16's argument (not on the page at HEAD): the loss's reference."""
    ref = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(0.5)  # a reference away from the policy: the margin at step 1 is no longer 0
    trainer = DPOTrainer(model=str(model_dir), ref_model=ref, args=dpo_args(tmp_path / "run"),
                         processing_class=AutoTokenizer.from_pretrained(model_dir),
                         train_dataset=[PAIR_FORMATS["standard, explicit prompt"]] * 4)
    assert trainer.inner.reference.model is ref
    trainer.train()
    assert step_log(trainer)["loss"] != pytest.approx(0.693147, abs=1e-6)


def test_dpo_liger_kernel_is_refused(tmp_path):
    """DPO, "Train with Liger Kernel" (prose): use_liger_kernel=True."""
    with pytest.raises(ConfigError, match=r"use_liger_kernel=True\): no Liger kernels in lmrl"):
        dpo_args(tmp_path, use_liger_kernel=True).to_config(model_path="m", train_rows=4)


def test_dpo_max_length_none_cuts_no_row(model_dir, tmp_path):
    """DPO, "Training Vision Language Models": DPOConfig(max_length=None) (the VLM itself is out of
    scope: lmrl trains text models), on text rows."""
    long = {"prompt": "The sky is " * 40, "chosen": " blue.", "rejected": " green."}
    trainer = DPOTrainer(model=str(model_dir), args=dpo_args(tmp_path / "run", max_length=None),
                         train_dataset=[long] * 4)
    trainer.train()
    assert trainer.config.data.max_length >= 10**9 and trainer.state.global_step == 1
    assert re.search(r"\b0 of 4 rows truncated", (tmp_path / "run" / "train.log").read_text())
