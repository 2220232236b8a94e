"""Chat templates rendered one way everywhere. `render_chat` is lmrl's one call of a tokenizer's
`apply_chat_template` (tests/test_chat_template_kwargs.py finds any other), and it passes the template
keyword arguments held on the tokenizer: the run's `model.chat_template_kwargs` (TRL's
`chat_template_kwargs`, e.g. `{"enable_thinking": False}` for Qwen3), with a data row's own on top.

    hold_template_kwargs(tokenizer, {"enable_thinking": False})    # once, where the run gets its tokenizer
    render_chat(tokenizer, messages, add_generation_prompt=True)   # Qwen3: "...assistant\\n<think>\\n\\n</think>\\n\\n"
    render_chat(tokenizer, messages, tools=schemas, **row_kwargs)  # a row's chat_template_kwargs win

The arguments sit on the tokenizer because every layer that renders already has it (a policy's, a
task's, a batch codec's), so a sampling prompt, the text between two agent turns, a training row's
loss mask and the probes that compare two renderings all see the same template variables."""

from __future__ import annotations

from collections.abc import Mapping

HELD = "lmrl_chat_template_kwargs"  # the tokenizer attribute holding the run's template arguments
# apply_chat_template's arguments that render_chat sets for each rendering: not the template's to take
SET_PER_CALL = ("conversation", "tools", "add_generation_prompt", "tokenize")


def template_kwargs_problem(value) -> str | None:
    """What is wrong with `value` as chat template keyword arguments, worded to follow the name of the key or
    column holding it ("model.chat_template_kwargs must be ..."), or None."""
    if not isinstance(value, Mapping):
        return f"must be a mapping of the chat template's variables (e.g. {{enable_thinking: false}}), got {value!r}"
    names = [k for k in value if not isinstance(k, str)]
    if names:
        return f"takes the template variables' names as string keys, got {names[0]!r}"
    taken = [k for k in SET_PER_CALL if k in value]
    if taken:
        return f"cannot set {taken[0]!r}: lmrl sets that argument of apply_chat_template for each rendering"
    return None


def hold_template_kwargs(tokenizer, kwargs: Mapping) -> None:
    """Every later `render_chat` with `tokenizer` passes `kwargs` to its chat template."""
    setattr(tokenizer, HELD, dict(kwargs))


def render_chat(tokenizer, messages: list[dict], *, add_generation_prompt: bool = False,
                tools: list[dict] | None = None, **template_kwargs) -> str:
    """`messages` as the chat template's text, with the generation prompt (the assistant's turn opened)
    when asked, `tools` (JSON schemas) when there are any (Llama's template writes its tool preamble
    even for an empty list), the template arguments held on the tokenizer, and `template_kwargs` over them."""
    kwargs = {**getattr(tokenizer, HELD, {}), **template_kwargs}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **({"tools": tools} if tools else {}), **kwargs)
