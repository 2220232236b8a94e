"""Tool calling as TRL's GRPOTrainer does it, as an lmrl environment (lmrl/envs/tools.py): JSON schemas
from typed, documented functions; parsing Hermes `<tool_call>` calls (and hostile text, in linear time);
ToolEnv running calls, answering failures as tool messages, ending on a turn without a call; TRL's
`environment_factory` classes; whether a chat template renders `tools=` (a tokenizer built here, offline)."""

from __future__ import annotations

import asyncio
import time

import pytest
from transformers import PreTrainedTokenizerFast
from transformers.utils import get_json_schema

from lmrl.envs.protocol import as_reset, as_step, check_env
from lmrl.envs.tools import (
    ToolEnv, environment_tools, parse_tool_calls, template_renders_tools, tool_schemas, tools_system_prompt,
)


def calculator(a: float, b: float, op: str = "+") -> float:
    """Applies an arithmetic operator to two numbers.

    Args:
        a: The left operand.
        b: The right operand.
        op: One of "+", "-", "*", "/".
    """
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]  # "/" by 0 raises, as a failing tool would


def undocumented(a: int) -> int:
    return a


def untyped(a):
    """Returns its argument.

    Args:
        a: Anything.
    """
    return a


async def slow_echo(text: str) -> str:
    """Echoes text after a pause, as an async tool would after I/O.

    Args:
        text: What to echo.
    """
    await asyncio.sleep(0)
    return text.upper()


def _call(name, arguments) -> str:
    import json
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


PROMPT = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 6 * 7?"}]


# --- schemas ------------------------------------------------------------------------------------------------------

def test_schemas_are_transformers_json_schemas_with_the_docstrings_descriptions():
    (schema,) = tool_schemas([calculator])
    assert schema == get_json_schema(calculator)
    function = schema["function"]
    assert function["name"] == "calculator"
    assert function["description"] == "Applies an arithmetic operator to two numbers."
    assert function["parameters"]["properties"]["a"] == {"type": "number", "description": "The left operand."}
    assert function["parameters"]["required"] == ["a", "b"]  # op has a default


def test_a_tool_without_docstring_or_type_hints_is_refused_by_name():
    with pytest.raises(ValueError, match="'undocumented' has no docstring") as e:
        tool_schemas([calculator, undocumented])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="'untyped'.*type hint") as e:
        tool_schemas([untyped])
    assert "\n" not in str(e.value)


def test_duplicate_tool_names_are_refused_naming_them():
    def calculator_again(a: int) -> int:
        """Doc.

        Args:
            a: A.
        """
        return a

    calculator_again.__name__ = "calculator"
    with pytest.raises(ValueError, match="'calculator'"):
        tool_schemas([calculator, calculator_again])
    with pytest.raises(ValueError, match="'calculator'"):
        ToolEnv([calculator, calculator_again], prompt=PROMPT)


# --- parsing ------------------------------------------------------------------------------------------------------

def test_parse_one_call_amid_text():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"a": 6, "b": 7, "op": "*"}}\n'
            '</tool_call>')
    assert parse_tool_calls(text) == ([{"name": "calculator", "arguments": {"a": 6, "b": 7, "op": "*"}}], [])


def test_parse_two_calls_in_order():
    text = _call("calculator", {"a": 1, "b": 2}) + "\n" + _call("slow_echo", {"text": "hi"}) + "<|im_end|>"
    calls, errors = parse_tool_calls(text)
    assert calls == [{"name": "calculator", "arguments": {"a": 1, "b": 2}},
                     {"name": "slow_echo", "arguments": {"text": "hi"}}]
    assert errors == []


def test_parse_parameters_string_arguments_and_missing_arguments():
    text = ('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>'
            '<tool_call>{"name": "g", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>'
            '<tool_call>{"name": "h"}</tool_call>'
            '<tool_call>{"type": "function", "function": {"name": "k", "arguments": {"z": null}}}</tool_call>')
    calls, errors = parse_tool_calls(text)
    assert calls == [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {"y": [1, 2]}},
                     {"name": "h", "arguments": {}}, {"name": "k", "arguments": {"z": None}}]
    assert errors == []


@pytest.mark.parametrize("body, expected", [
    ('{"name": "f", "arguments": {"x": 1}', "not valid JSON"),
    ('{"arguments": {"x": 1}}', "no tool name"),
    ('{"name": 3, "arguments": {}}', "no tool name"),
    ('{"name": "f", "arguments": [1, 2]}', "arguments must be a JSON object"),
    ('{"name": "f", "arguments": "not json"}', "arguments are a string that is not a JSON object"),
    ('"just a string"', "expected a JSON object"),
    ("", "not valid JSON"),
    ("[" * 100_000, "not valid JSON"),  # deeper than Python's recursion limit
])
def test_malformed_calls_give_one_error_each_and_keep_the_good_ones(body, expected):
    text = f"<tool_call>{body}</tool_call>" + _call("ok", {})
    calls, errors = parse_tool_calls(text)
    assert calls == [{"name": "ok", "arguments": {}}]
    assert len(errors) == 1 and expected in errors[0] and errors[0].startswith("tool call 1")
    assert "\n" not in errors[0] and len(errors[0]) < 400  # quoted briefly, on one line


def test_unclosed_tag_is_an_error_after_the_closed_calls():
    calls, errors = parse_tool_calls(_call("a", {}) + '<tool_call>\n{"name": "b", "arguments": {}}')
    assert calls == [{"name": "a", "arguments": {}}]
    assert len(errors) == 1 and "without </tool_call>" in errors[0] and "tool call 2" in errors[0]


def test_text_without_calls_and_calls_inside_reasoning_are_not_calls():
    assert parse_tool_calls("The answer is 42. I might use <tool_ call> later.") == ([], [])
    thinking = "<think>maybe " + _call("a", {}) + "? no.</think>" + _call("b", {})
    assert parse_tool_calls(thinking) == ([{"name": "b", "arguments": {}}], [])


@pytest.mark.parametrize("hostile", [
    " " * 1_000_000,
    "<tool_call>" + " " * 1_000_000,
    "<tool_call>" * 100_000,
    "<tool_call>" + "{" * 1_000_000 + "</tool_call>",
    "<tool_call>{\"name\": \"" + "\\" * 1_000_000 + "</tool_call>",
    "</think>" * 100_000 + "<tool_call" * 100_000,
])
def test_hostile_input_parses_in_linear_time(hostile):
    start = time.perf_counter()
    calls, errors = parse_tool_calls(hostile)
    assert time.perf_counter() - start < 1.0  # milliseconds when linear; a backtracking parse takes minutes
    assert calls == [] and len(errors) <= 1


def test_many_empty_calls_are_each_an_error_in_linear_time():
    text = "<tool_call></tool_call>" * 40_000  # ~1 MB
    start = time.perf_counter()
    calls, errors = parse_tool_calls(text)
    assert time.perf_counter() - start < 1.0
    assert calls == [] and len(errors) == 40_000


# --- ToolEnv ------------------------------------------------------------------------------------------------------

def test_a_correct_call_returns_the_result_as_a_tool_message():
    env = ToolEnv([calculator], prompt=PROMPT)
    assert env.reset(seed=0) == PROMPT and env.reset() is not PROMPT
    observation, reward, terminated, truncated, info = env.step("Computing. " + _call("calculator", {"a": 6, "b": 7,
                                                                                                    "op": "*"}))
    assert observation == [{"role": "tool", "name": "calculator", "content": "42"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"tool_calls": 1, "tool_failures": 0, "tool_calls_total": 1, "tool_failures_total": 0}
    as_step((observation, reward, terminated, truncated, info), "ToolEnv")  # a valid protocol step


def test_no_tool_call_ends_the_episode():
    env = ToolEnv([calculator], prompt=PROMPT)
    env.reset()
    env.step(_call("calculator", {"a": 1, "b": 1}))
    assert env.step("The answer is 42.") == ("", 0.0, True, False, {
        "tool_calls": 0, "tool_failures": 0, "tool_calls_total": 1, "tool_failures_total": 0})
    check_env(ToolEnv([calculator], prompt=PROMPT))  # the protocol's own check: reset, then a turn that ends it


def test_failing_calls_answer_errors_and_count_failures_without_raising():
    env = ToolEnv([calculator], prompt=PROMPT, max_result_chars=200)
    env.reset()
    turn = (_call("nope", {"a": 1}) + _call("calculator", {"a": 1, "c": 2}) + _call("calculator", {"a": 1, "b": 0,
                                                                                                    "op": "/"})
            + "<tool_call>{not json}</tool_call>" + _call("calculator", {"a": 2, "b": 3}))
    observation, reward, terminated, _, info = env.step(turn)
    contents = [m["content"] for m in observation]
    assert [m["name"] for m in observation] == ["nope", "calculator", "calculator", "calculator", "invalid_tool_call"]
    assert "unknown tool 'nope'" in contents[0] and "calculator" in contents[0]  # names the tools there are
    assert "wrong arguments for tool 'calculator': unknown argument 'c'; missing required argument 'b'" in contents[1]
    assert "ZeroDivisionError" in contents[2]
    assert contents[3] == "5"  # the good call still runs
    assert "not valid JSON" in contents[4]
    assert all(c.startswith("{'error': ") for c in contents[:3] + contents[4:])  # TRL's {"error": ...} result
    assert not terminated and reward == 0.0
    assert info == {"tool_calls": 5, "tool_failures": 4, "tool_calls_total": 5, "tool_failures_total": 4}
    _, _, _, _, info = env.step(_call("nope", {}))
    assert (info["tool_calls"], info["tool_failures"], info["tool_calls_total"], info["tool_failures_total"]) == (
        1, 1, 6, 5)
    env.reset()
    assert env.step(_call("calculator", {"a": 1, "b": 1}))[4]["tool_calls_total"] == 1  # totals are per episode


def test_results_are_cut_to_max_result_chars():
    def long_text(n: int) -> str:
        """Returns n x's.

        Args:
            n: How many.
        """
        return "x" * n

    env = ToolEnv([long_text], prompt=PROMPT, max_result_chars=10)
    env.reset()
    assert env.step(_call("long_text", {"n": 50}))[0][0]["content"] == "x" * 10
    with pytest.raises(ValueError, match="max_result_chars=0"):
        ToolEnv([long_text], prompt=PROMPT, max_result_chars=0)


def test_async_tools_run_in_step_and_keep_the_call_order():
    async def broken(text: str) -> str:
        """Fails.

        Args:
            text: Ignored.
        """
        raise RuntimeError("backend down")

    env = ToolEnv([slow_echo, calculator, broken], prompt=PROMPT)
    env.reset()
    observation, _, _, _, info = env.step(_call("slow_echo", {"text": "hi"}) + _call("calculator", {"a": 1, "b": 2})
                                          + _call("broken", {"text": "x"}))
    assert [(m["name"], m["content"]) for m in observation] == [
        ("slow_echo", "HI"), ("calculator", "3"), ("broken", "{'error': 'RuntimeError: backend down'}")]
    assert info["tool_failures"] == 1


def test_async_tools_run_from_inside_a_running_event_loop():
    env = ToolEnv([slow_echo], prompt=PROMPT)

    async def main():
        env.reset()
        return env.step(_call("slow_echo", {"text": "loop"}))

    assert asyncio.run(main())[0][0]["content"] == "LOOP"


class Wordle:
    """An environment_factory class as TRL takes it: reset(**row), public methods as tools, get_reward."""

    def __init__(self):
        self.reset_with = None
        self.closed = False

    def reset(self, answer: str, **row) -> str:
        self.reset_with = {"answer": answer, **row}
        self.answer, self.solved = answer, False
        return "\nThe word has 5 letters."

    def guess(self, word: str) -> str:
        """Guesses the word.

        Args:
            word: A five-letter word.
        """
        self.solved = word == self.answer
        return "correct" if self.solved else "wrong"

    async def hint(self) -> str:
        """A hint: the first letter."""
        return self.answer[0]

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0

    def _secret(self) -> str:
        return self.answer

    @property
    def letters(self) -> int:
        raise AssertionError("properties are not tools and are not evaluated")

    def close(self) -> None:
        self.closed = True


def test_environment_factory_methods_become_tools():
    names = [tool.__name__ for tool in environment_tools(Wordle())]
    assert names == ["close", "guess", "hint"]  # TRL's rule: not reset, get_reward, _private, properties
    env = ToolEnv([calculator], prompt=PROMPT, environment=Wordle())
    assert [t.__name__ for t in env.tools] == ["calculator", "close", "guess", "hint"]
    assert [s["function"]["name"] for s in tool_schemas(env.tools[2:])] == ["guess", "hint"]


def test_environment_reset_row_get_reward_and_close():
    row = {"prompt": PROMPT, "answer": "crane", "level": 2}
    wordle = Wordle()
    env = ToolEnv([], prompt=PROMPT, row=row, environment=wordle)
    messages = env.reset(seed=3)
    assert wordle.reset_with == row  # every column of the row, as TRL's reset(**row)
    assert messages[:-1] == PROMPT[:-1]
    assert messages[-1] == {"role": "user", "content": "What is 6 * 7?\nThe word has 5 letters."}
    assert PROMPT[-1]["content"] == "What is 6 * 7?"  # the data set's prompt is left as it was
    as_reset(messages, "ToolEnv")
    assert env.reward_source_name == "Wordle"
    assert env.get_reward() == 0.0
    observation, _, _, _, info = env.step(_call("hint", {}) + _call("guess", {"word": "crane"}))
    assert [m["content"] for m in observation] == ["c", "correct"] and info["tool_failures"] == 0
    assert env.get_reward() == 1.0 and isinstance(env.get_reward(), float)
    env.close()
    assert wordle.closed


def test_get_reward_absent_async_and_none():
    class NoReward:
        def reset(self, **row):
            return None

    class AsyncReward:
        def reset(self, **row):
            return None

        async def get_reward(self) -> float:
            return 0.5

    plain = ToolEnv([calculator], prompt=PROMPT)
    assert plain.get_reward() is None and plain.reward_source_name is None
    plain.close()
    env = ToolEnv([], prompt=PROMPT, environment=NoReward())
    assert env.reset() == PROMPT and env.get_reward() is None and env.reward_source_name is None
    env = ToolEnv([], prompt=PROMPT, environment=AsyncReward())
    assert env.get_reward() == 0.5 and env.reward_source_name == "AsyncReward"


def test_an_environment_without_reset_is_refused():
    class NoReset:
        def guess(self, word: str) -> str:
            return word

    with pytest.raises(ValueError, match="NoReset has no reset"):
        ToolEnv([], prompt=PROMPT, environment=NoReset())


# --- prompts and chat templates -----------------------------------------------------------------------------------

def test_tools_system_prompt_lists_the_schemas_and_the_format():
    schemas = tool_schemas([calculator, slow_echo])
    text = tools_system_prompt(schemas)
    assert '"name": "calculator"' in text and '"name": "slow_echo"' in text
    assert "The left operand." in text
    assert "<tool_call>" in text and "</tool_call>" in text and '"arguments"' in text
    with pytest.raises(ValueError, match="no tool schemas"):
        tools_system_prompt([])


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML with a tools block in the style of Qwen2.5's template: the schemas in the system turn, tool results
# as <tool_response> in a user turn.
CHATML_TOOLS = (  # text in {{ }} expressions: transformers renders with trim_blocks, which eats a newline after %}
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{%- else %}{{ 'You are a helpful assistant.' }}{%- endif %}"
    "{{ '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools>\\n\\nCall a tool as:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif not (m['role'] == 'system' and loop.first) %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def _tokenizer(chat_template):
    """A byte-level BPE trained in memory (vocabulary ~100), as tests/test_hf.py builds one: nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]
    tok.train_from_iterator(["system user assistant tool: hello world", "<tool_call> {\"name\": 1} </tool_call>"],
                            trainers.BpeTrainer(vocab_size=100, special_tokens=special, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>",
                                   chat_template=chat_template)


def test_template_renders_tools_for_a_tools_template_only():
    with_tools = _tokenizer(CHATML_TOOLS)
    assert template_renders_tools(with_tools) is True
    assert template_renders_tools(_tokenizer(CHATML)) is False
    assert template_renders_tools(_tokenizer(None)) is False
    # The tools template renders what ToolEnv produces: the schemas, and the results as tool responses.
    env = ToolEnv([calculator], prompt=PROMPT)
    messages = env.reset() + [{"role": "assistant", "content": _call("calculator", {"a": 6, "b": 7, "op": "*"})}]
    messages += env.step(messages[-1]["content"])[0]
    text = with_tools.apply_chat_template(messages, tools=tool_schemas(env.tools), tokenize=False,
                                          add_generation_prompt=True)
    assert '"name": "calculator"' in text and "<tool_response>\n42\n</tool_response>" in text
    assert text.startswith("<|im_start|>system\nUse the tools.\n\n# Tools")
