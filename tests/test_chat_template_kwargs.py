"""model.chat_template_kwargs (TRL's chat_template_kwargs: Qwen3's enable_thinking=False) reach the chat
template wherever lmrl renders one: the run holds them on its tokenizer and `lmrl.common.chat.render_chat`,
lmrl's one call of apply_chat_template, passes them, with a data row's own chat_template_kwargs column over
them. On Qwen3's tokenizer (scripts/gpu_check_assets/qwen2.5-1.5b holds it) and a tiny random Qwen2 over it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from datasets import Dataset  # noqa: E402
from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoTokenizer,  # noqa: E402
                          PreTrainedTokenizerBase)

import lmrl  # noqa: E402
from lmrl.common.chat import hold_template_kwargs  # noqa: E402
from lmrl.common.data import DataError, write_jsonl  # noqa: E402
from lmrl.config import ConfigError, load_config  # noqa: E402
from lmrl.tasks.preference_data import TruncationCounter, read_preference, read_sft  # noqa: E402
from lmrl.tasks.text_batches import TextCodec, assistant_token_mask, encode_preferences, encode_sft  # noqa: E402
from lmrl.train.build import build_run  # noqa: E402
from lmrl.train.dpo_trainer import DPOTrainer  # noqa: E402
from lmrl.train.inspect import load_run  # noqa: E402
from lmrl.train.plan import plan  # noqa: E402
from lmrl.train.rl_trainer import RLTrainer  # noqa: E402
from lmrl.train.sft_trainer import SFTTrainer  # noqa: E402
from lmrl.trl import DPOConfig, GRPOConfig, GRPOTrainer, SFTConfig, TrlParser  # noqa: E402
from lmrl.trl import DPOTrainer as TrlDPOTrainer, SFTTrainer as TrlSFTTrainer  # noqa: E402
from tests.test_tool_training import multiply  # noqa: E402
from tests.test_trl_docs_examples import write  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

GPU_CHECK = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
NO_THINKING = {"enable_thinking": False}
EMPTY_THINK = "<think>\n\n</think>\n\n"  # what Qwen3's generation prompt adds under enable_thinking=False
OPENED = "<|im_start|>assistant\n"
SKY = [{"role": "user", "content": "What color is the sky?"}]
BLUE, GREEN = [{"role": "assistant", "content": "It is blue."}], [{"role": "assistant", "content": "It is green."}]
QUIET = ["run.progress=false", "run.tensorboard=false", "run.threads=1", "run.mixed_precision="]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A 2-layer, 64-wide Qwen2 with random weights and Qwen3's tokenizer and chat template."""
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check.random_model_dir("qwen1.5b", tmp_path_factory.mktemp("qwen"), cpu=True)


@pytest.fixture
def qwen3(qwen_dir):
    """Qwen3's tokenizer, fresh (a run holds its template arguments on the tokenizer object)."""
    return AutoTokenizer.from_pretrained(qwen_dir)


@pytest.fixture
def renderings(monkeypatch) -> list[dict]:
    """The keyword arguments of every apply_chat_template call while the test runs, any tokenizer's."""
    calls = []
    original = PreTrainedTokenizerBase.apply_chat_template

    def recorded(self, conversation, **kwargs):
        calls.append(kwargs)
        return original(self, conversation, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "apply_chat_template", recorded)
    return calls


def assert_every_rendering_without_thinking(calls: list[dict]) -> None:
    missing = [c for c in calls if c.get("enable_thinking") is not False]
    assert calls and not missing, f"{len(missing)} of {len(calls)} renderings lack enable_thinking=False: {missing[:3]}"


def decoded(tok, ids, mask=None) -> str:
    return tok.decode(ids if mask is None else [t for t, m in zip(ids, mask) if m])


# ------------------------------------------------------------------------------------------ the mechanism

def test_lmrl_calls_apply_chat_template_only_in_render_chat():
    """A direct call would render without the run's template arguments."""
    package = Path(lmrl.__file__).parent
    calls = [f"{path.relative_to(package.parent)}:{node.lineno}" for path in sorted(package.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == "apply_chat_template"]
    assert [c.partition(":")[0] for c in calls] == ["lmrl/common/chat.py"], calls


def test_qwen3_opens_the_assistants_turn_with_an_empty_think_block_under_enable_thinking_false(qwen3):
    """What the tests below look for, as Qwen3's template writes it."""
    assert qwen3.apply_chat_template(SKY, tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False).endswith(OPENED + EMPTY_THINK)
    assert qwen3.apply_chat_template(SKY, tokenize=False, add_generation_prompt=True).endswith(OPENED)


# --------------------------------------------------------------------------------- what the renderings hold

@pytest.mark.parametrize("overrides, ending", [
    ([], OPENED), (["model.chat_template_kwargs.enable_thinking=false"], OPENED + EMPTY_THINK)])
def test_an_rl_tasks_generation_prompt_is_rendered_with_the_configs_kwargs(qwen3, tmp_path, overrides, ending):
    write_jsonl(tmp_path / "prompts.jsonl", [{"messages": SKY}, {"prompt": "What color is grass?"}])
    cfg = load_config("adder", ["model.type=hf", "model.path=unused", "task.name=prompts", "sft.steps=0",
                                f"task.train_file={tmp_path / 'prompts.jsonl'}",
                                f"task.test_file={tmp_path / 'prompts.jsonl'}", *overrides])
    task = build_run(cfg, model=SimpleNamespace(tokenizer=qwen3)).task
    assert all(text.endswith(ending) for text in task.prompt_texts)


def test_an_sft_rows_prompt_holds_the_think_block_and_the_loss_stays_on_the_answer(qwen3):
    rows = read_sft([{"prompt": "What color is the sky?", "completion": "It is blue."},
                     {"prompt": SKY, "completion": BLUE}])
    plain = encode_sft(rows, TextCodec(qwen3, chat=True), 256, TruncationCounter())
    hold_template_kwargs(qwen3, NO_THINKING)
    thinking_off = encode_sft(rows, TextCodec(qwen3, chat=True), 256, TruncationCounter())
    # a text row: the assistant's turn opens as the template opens it at inference, and nothing of it has loss
    assert decoded(qwen3, plain[0].ids) == "<|im_start|>user\nWhat color is the sky?<|im_end|>\n" + OPENED + \
        "It is blue.<|im_end|>"
    assert decoded(qwen3, thinking_off[0].ids) == "<|im_start|>user\nWhat color is the sky?<|im_end|>\n" + \
        OPENED + EMPTY_THINK + "It is blue.<|im_end|>"
    # a conversation: Qwen3 writes the block before its last assistant turn either way
    assert thinking_off[1].ids == plain[1].ids
    for example in plain + thinking_off:
        assert decoded(qwen3, example.ids, example.mask) == "It is blue.<|im_end|>"


def test_a_dpo_pairs_prompt_holds_the_think_block_and_the_replies_keep_their_loss(qwen3):
    pairs = read_preference([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}])
    (plain,) = encode_preferences(pairs, TextCodec(qwen3, chat=True), 256, TruncationCounter())
    hold_template_kwargs(qwen3, NO_THINKING)
    (pair,) = encode_preferences(pairs, TextCodec(qwen3, chat=True), 256, TruncationCounter())
    assert decoded(qwen3, plain.prompt).endswith(OPENED)
    assert decoded(qwen3, pair.prompt).endswith(OPENED + EMPTY_THINK)
    assert decoded(qwen3, pair.chosen) == "It is blue.<|im_end|>"  # the block is the prompt's now
    assert plain.prompt + plain.chosen == pair.prompt + pair.chosen  # the same tokens, cut elsewhere
    for example in (plain, pair):
        assert decoded(qwen3, example.chosen, example.chosen_mask) == "It is blue.<|im_end|>"
        assert decoded(qwen3, example.rejected, example.rejected_mask) == "It is green.<|im_end|>"


def test_every_assistant_turn_of_a_conversation_has_loss_under_enable_thinking_false(qwen3):
    """Qwen3 opens a new turn with the empty think block but renders earlier turns without it, so the
    conversation before a past turn, rendered with the generation prompt, is not where that turn starts."""
    conversation = SKY + BLUE + [{"role": "user", "content": "And grass?"}, {"role": "assistant", "content": "Green."}]
    hold_template_kwargs(qwen3, NO_THINKING)
    ids, mask = assistant_token_mask(qwen3, conversation)
    assert decoded(qwen3, ids, mask) == "It is blue.<|im_end|>Green.<|im_end|>"
    assert decoded(qwen3, ids).count(EMPTY_THINK) == 1  # before the last turn only


def test_a_rows_chat_template_kwargs_column_renders_that_row_over_the_runs(qwen3):
    rows = [{"prompt": "What color is the sky?", "completion": "It is blue.", "chat_template_kwargs": NO_THINKING},
            {"prompt": "What color is the sky?", "completion": "It is blue."}]
    sft = encode_sft(read_sft(rows), TextCodec(qwen3, chat=True), 256, TruncationCounter())
    assert [EMPTY_THINK in decoded(qwen3, e.ids) for e in sft] == [True, False]
    pairs = read_preference([{"prompt": SKY, "chosen": BLUE, "rejected": GREEN, "chat_template_kwargs": NO_THINKING},
                             {"prompt": SKY, "chosen": BLUE, "rejected": GREEN}])
    encoded = encode_preferences(pairs, TextCodec(qwen3, chat=True), 256, TruncationCounter())
    assert [decoded(qwen3, e.prompt).endswith(EMPTY_THINK) for e in encoded] == [True, False]
    assert [decoded(qwen3, e.chosen) for e in encoded] == ["It is blue.<|im_end|>", EMPTY_THINK + "It is blue.<|im_end|>"]
    hold_template_kwargs(qwen3, NO_THINKING)  # the run's; a row's own win
    thinking = read_sft([{**rows[1], "chat_template_kwargs": {"enable_thinking": True}}])
    (example,) = encode_sft(thinking, TextCodec(qwen3, chat=True), 256, TruncationCounter())
    assert EMPTY_THINK not in decoded(qwen3, example.ids)


def test_a_datasets_column_keeps_its_rows_entries_and_drops_what_it_filled_with_none():
    rows = Dataset.from_list([{"prompt": SKY, "completion": BLUE, "chat_template_kwargs": NO_THINKING},
                              {"prompt": SKY, "completion": BLUE, "chat_template_kwargs": {"reasoning": "low"}}])
    assert [r.chat_template_kwargs for r in read_sft(rows)] == [NO_THINKING, {"reasoning": "low"}]


@pytest.mark.parametrize("value, message", [
    ("enable_thinking=False", "row 0: 'chat_template_kwargs' must be a mapping of the chat template's variables"),
    ({"tools": []}, "row 0: 'chat_template_kwargs' cannot set 'tools': lmrl sets that argument of "
                    "apply_chat_template for each rendering"),
])
def test_a_chat_template_kwargs_column_that_is_no_template_arguments_names_its_row(value, message):
    for reader, row in ((read_sft, {"prompt": SKY, "completion": BLUE}),
                        (read_preference, {"prompt": SKY, "chosen": BLUE, "rejected": GREEN})):
        with pytest.raises(DataError) as e:
            reader([{**row, "chat_template_kwargs": value}])
        assert str(e.value).startswith(message) and "\n" not in str(e.value)


# ------------------------------------------------------------------------ every rendering of a whole run

def _rl_config(qwen_dir, run_dir, *overrides):
    return load_config("adder", ["model.type=hf", f"model.path={qwen_dir}", f"run.dir={run_dir}", "task.name=prompts",
                                 "task.max_new_tokens=4", "sft.steps=0", "algo.name=grpo", "algo.group_size=2",
                                 "train.steps=1", "train.rollout_size=4", "train.eval_every=1", "eval.size=2",
                                 "eval.batch_size=2", "train.stopping_threshold=null", "train.ema_decay=0",
                                 "model.chat_template_kwargs={enable_thinking: false}", *QUIET, *overrides])


def _length(completions, **_):
    return [float(len(str(c))) for c in completions]


def test_every_rendering_of_an_rl_step_and_of_its_run_loaded_back_gets_the_configs_kwargs(qwen_dir, tmp_path,
                                                                                         renderings):
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + 1?"}]} for a in range(4)]
    trainer = RLTrainer(_rl_config(qwen_dir, tmp_path / "run"), train_dataset=rows, reward_funcs=_length)
    assert trainer.train()["steps_done"] == 1
    assert_every_rendering_without_thinking(renderings)
    assert all(text.endswith(EMPTY_THINK) for text in trainer.task.prompt_texts)
    renderings.clear()
    loaded = load_run(tmp_path / "run")  # what `lmrl eval` and `lmrl generate` prompt it with
    assert_every_rendering_without_thinking(renderings)
    assert loaded.task.prompt_texts == trainer.task.prompt_texts


def test_a_reward_models_texts_are_rendered_with_the_configs_kwargs(qwen_dir, qwen3, tmp_path, renderings):
    """TRL renders a reward model's texts with GRPOConfig's chat_template_kwargs too."""
    config = AutoConfig.from_pretrained(qwen_dir, num_labels=1, pad_token_id=qwen3.pad_token_id)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    qwen3.save_pretrained(tmp_path / "rm")
    write_jsonl(tmp_path / "prompts.jsonl", [{"messages": SKY}])
    cfg = load_config("adder", ["model.type=hf", "model.path=unused", "task.name=prompts", "sft.steps=0",
                                f"task.train_file={tmp_path / 'prompts.jsonl'}", f"reward.model={tmp_path / 'rm'}",
                                f"task.test_file={tmp_path / 'prompts.jsonl'}",
                                "model.chat_template_kwargs.enable_thinking=false"])
    scorer = build_run(cfg, model=SimpleNamespace(tokenizer=qwen3)).task.reward
    renderings.clear()
    scorer([SKY], [BLUE])  # a conversational prompt and reply, as TRL passes a chat task's
    assert_every_rendering_without_thinking(renderings)


def _offline_config(qwen_dir, run_dir, trainer, data):
    return load_config(None, [f"run.trainer={trainer}", f"run.dir={run_dir}", "model.type=hf",
                              f"model.path={qwen_dir}", f"data.train_file={data}", f"data.eval_file={data}",
                              "data.batch_size=2", "data.max_length=64", "train.max_steps=1", "train.eval_every=1",
                              "model.chat_template_kwargs={enable_thinking: false}", *QUIET])


def test_every_rendering_of_an_sft_step_gets_the_configs_kwargs(qwen_dir, tmp_path, renderings):
    data = write_jsonl(tmp_path / "sft.jsonl", [{"messages": SKY + BLUE}, {"prompt": SKY, "completion": GREEN}])
    assert SFTTrainer(_offline_config(qwen_dir, tmp_path / "run", "sft", data)).train()["steps_done"] == 1
    assert_every_rendering_without_thinking(renderings)


def test_every_rendering_of_a_dpo_step_gets_the_configs_kwargs(qwen_dir, tmp_path, renderings):
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}] * 2)
    assert DPOTrainer(_offline_config(qwen_dir, tmp_path / "run", "dpo", data)).train()["steps_done"] == 1
    assert_every_rendering_without_thinking(renderings)


CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'


def test_every_rendering_of_trls_grpo_with_tools_gets_its_chat_template_kwargs(qwen_dir, tmp_path, renderings):
    """GRPOConfig(chat_template_kwargs=...) with tools=: the prompts, the template's tools probe and the
    text between two turns (the tool's result, then the next turn opened with the empty think block)."""
    args = GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=48, max_tool_calling_iterations=1, max_steps=1, logging_steps=1,
                      use_cpu=True, bf16=False, report_to="none", chat_template_kwargs=NO_THINKING)
    trainer = GRPOTrainer(model=str(qwen_dir), args=args, reward_funcs=_length, tools=[multiply],
                          train_dataset=[{"prompt": [{"role": "user", "content": "What is 12 * 34?"}]}] * 4)
    assert trainer.config.model.chat_template_kwargs == NO_THINKING
    write(trainer, lambda context: "It is 408." if "<tool_response>" in context else CALL)
    trainer.train()
    assert_every_rendering_without_thinking(renderings)
    policy = trainer.inner.model
    episode = policy.tokenizer.decode(trainer.task.rollout(policy, trainer.task.heldout_ids[:1]).sequences[0])
    assert "<tool_response>\n408\n</tool_response><|im_end|>\n" + OPENED + EMPTY_THINK + "It is 408." in episode


@pytest.mark.parametrize("config, trainer, row", [
    (SFTConfig, TrlSFTTrainer, {"prompt": SKY, "completion": BLUE}),
    (DPOConfig, TrlDPOTrainer, {"prompt": SKY, "chosen": BLUE, "rejected": GREEN}),
])
def test_every_rendering_of_trls_sft_and_dpo_gets_each_rows_chat_template_kwargs(qwen_dir, tmp_path, renderings,
                                                                                  config, trainer, row):
    """TRL's SFTConfig and DPOConfig have no chat_template_kwargs: their trainers read a row's column."""
    rows = Dataset.from_list([{**row, "chat_template_kwargs": NO_THINKING}] * 2)
    args = config(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, max_steps=1, use_cpu=True,
                  bf16=False, report_to="none", max_length=64)
    trainer(model=str(qwen_dir), args=args, train_dataset=rows).train()
    assert_every_rendering_without_thinking(renderings)


def test_plan_counts_prompts_as_the_run_renders_them(qwen_dir, tmp_path, renderings):
    from lmrl.tasks.word_problems import write_addition_chat

    train, test = write_addition_chat(tmp_path / "data", n_train=8, n_test=2, seed=0)
    overrides = [f"model.path={qwen_dir}", f"task.train_file={train}", f"task.test_file={test}", "run.device=cpu"]
    plain = plan(load_config("math-grpo-smollm2", overrides), device="cpu")
    renderings.clear()
    thinking_off = plan(load_config("math-grpo-smollm2", [*overrides, "chat_template_kwargs={enable_thinking: false}"]),
                        device="cpu")
    assert_every_rendering_without_thinking(renderings)
    think_tokens = len(AutoTokenizer.from_pretrained(qwen_dir)(EMPTY_THINK, add_special_tokens=False)["input_ids"])
    assert thinking_off.lengths.prompt == plain.lengths.prompt + think_tokens


# ----------------------------------------------------------------------------------------- TRL's spellings

def test_trls_command_line_json_reaches_the_config(tmp_path):
    (args,) = TrlParser((GRPOConfig,)).parse_args_and_config(
        ["--output_dir", str(tmp_path), "--use_cpu", "--chat_template_kwargs", '{"enable_thinking": false}'])
    assert args.to_config(model_path="m", train_rows=64).model.chat_template_kwargs == NO_THINKING


def test_a_grpo_config_whose_chat_template_kwargs_is_no_mapping_is_refused_in_one_line(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, chat_template_kwargs="enable_thinking=False")
    with pytest.raises(ConfigError) as e:
        args.to_config(model_path="m", train_rows=64)
    assert str(e.value) == "model.chat_template_kwargs must be a mapping, got 'enable_thinking=False' (from " \
                           "GRPOConfig(...))"
