"""Tool calling as TRL's GRPOTrainer does it (`tools=[fn, ...]`, `environment_factory=`), as a text
environment of lmrl's protocol (lmrl/envs/protocol.py), so lmrl's multi-turn loop can run it.

    def add(a: int, b: int) -> int:
        \"\"\"Adds two integers.

        Args:
            a: The first integer.
            b: The second integer.
        \"\"\"
        return a + b

    env = ToolEnv([add], prompt=[{"role": "user", "content": "What is 2 + 3?"}])
    messages = env.reset()                          # the prompt, as chat messages
    schemas = tool_schemas(env.tools)               # for tokenizer.apply_chat_template(..., tools=schemas)
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 3}}\\n</tool_call>')
    # obs == [{"role": "tool", "name": "add", "content": "5"}]; info["tool_calls"] == 1
    env.step("The answer is 5.")                    # no tool call: the episode ends ("", 0.0, True, False, info)

The model writes its calls in the Hermes format that Qwen2.5, Qwen3, SmolLM3 and Hermes models were
trained on, one JSON object per `<tool_call>` tag:

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>

With `environment=` (one instance of TRL's `environment_factory`), `reset` calls `environment.reset(**row)`
with the data set row's columns, appends a returned string to the prompt's last message, and the
environment's public methods become tools; when it defines `get_reward()`, that is the episode's reward
(`ToolEnv.get_reward`, logged under the environment's class name as TRL does).

A tool that fails (unknown name, wrong arguments, or an exception) answers `{'error': '...'}` as its
tool message, as in TRL, and counts as a failure in `info`: a model's mistake is feedback, never an
exception out of `step`. For chat templates that do not render `tools=` (`template_renders_tools` is
False), `tools_system_prompt(schemas)` is a system message that lists the tools and the format."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
from typing import Any, Callable

from lmrl.common.chat import render_chat
from lmrl.envs.protocol import as_reward, env_name

__all__ = [
    "ToolEnv", "environment_tools", "parse_tool_calls", "template_renders_tools", "tool_schemas",
    "tools_system_prompt",
]

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
THINK_CLOSE = "</think>"
EXCERPT_CHARS = 80  # how much of a bad call an error string quotes: enough to recognise it, short in a prompt


def _tool_name(fn: Callable) -> str:
    """A tool's name as TRL keys it (`__name__`); callables without one are named by their repr."""
    return getattr(fn, "__name__", None) or repr(fn)


def _excerpt(text: str) -> str:
    return repr(text) if len(text) <= EXCERPT_CHARS else f"{text[:EXCERPT_CHARS]!r}... ({len(text)} characters)"


def _check_unique(tools: list[Callable], who: str) -> None:
    """Refuse two tools of one name: calls are dispatched by name, so one would silently shadow the other."""
    seen: set[str] = set()
    duplicates: list[str] = []
    for fn in tools:
        name = _tool_name(fn)
        if name in seen and name not in duplicates:
            duplicates.append(name)
        seen.add(name)
    if duplicates:
        raise ValueError(f"{who}: two or more tools are named {', '.join(map(repr, duplicates))}; tool names must be "
                         f"unique (calls are dispatched by name)")


def tool_schemas(tools: list[Callable]) -> list[dict]:
    """The JSON schema of each tool (`{"type": "function", "function": {"name", "description", "parameters"}}`),
    from its signature's type hints and its Google-style docstring, as transformers' `get_json_schema` builds
    them for `apply_chat_template(..., tools=...)`."""
    try:
        from transformers.utils import get_json_schema
    except ImportError as e:
        raise ImportError(f"tool_schemas needs transformers ({e}); pip install 'lmrl[hf]'") from None
    _check_unique(list(tools), "tool_schemas")
    schemas = []
    for fn in tools:
        if not callable(fn):
            raise ValueError(f"tool_schemas: {fn!r} ({type(fn).__name__}) is not a function")
        name = _tool_name(fn)
        if not (inspect.getdoc(fn) or "").strip():
            raise ValueError(f"tool {name!r} has no docstring; a tool needs a Google-style docstring (a description "
                             f"and an Args: line per argument) for its JSON schema")
        try:
            schemas.append(get_json_schema(fn))
        except Exception as e:  # transformers' own parsing errors are not ValueErrors; one kind for callers
            reason = " ".join(str(e).split())  # one line, whatever transformers wrote
            raise ValueError(f"tool {name!r}: no JSON schema from its signature and docstring: {reason} (every "
                             f"argument needs a type hint and an Args: line in a Google-style docstring)") from None
    return schemas


def _class_functions(env) -> list[str]:
    """Names of the plain functions defined on the environment's class (and its bases), as TRL lists them:
    on the class, so properties are not evaluated."""
    return [name for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)]


def environment_tools(env) -> list[Callable]:
    """The bound methods of an `environment_factory` instance that TRL exposes as tools: the functions of its
    class whose names do not start with `_`, other than `reset` and `get_reward` (in name order)."""
    return [getattr(env, name) for name in _class_functions(env)
            if not name.startswith("_") and name not in ("reset", "get_reward")]


def _call_from_json(value: Any, index: int, body: str) -> tuple[dict | None, str | None]:
    """One decoded call object as `{"name", "arguments"}`, or the error string saying what is wrong with it
    (quoting the call's text `body`: re-encoding the value could recurse as deep as the model nested it)."""
    if not isinstance(value, dict):
        return None, (f"tool call {index}: expected a JSON object with a name and arguments, got "
                      f"{type(value).__name__}: {_excerpt(body)}")
    # The OpenAI shape {"type": "function", "function": {...}} is accepted too: some models write it.
    if "name" not in value and isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f"tool call {index}: no tool name (a \"name\" string) in {_excerpt(body)}"
    arguments = value.get("arguments", value.get("parameters"))
    if arguments is None:
        arguments = {}  # a call of a tool without arguments may leave them out (TRL does the same)
    if isinstance(arguments, str):  # arguments given as a JSON string, as in OpenAI's API
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            return None, (f"tool call {index} ({name}): arguments are a string that is not a JSON object ({e}): "
                          f"{_excerpt(arguments)}")
    if not isinstance(arguments, dict):
        return None, (f"tool call {index} ({name}): arguments must be a JSON object, got "
                      f"{type(arguments).__name__}: {_excerpt(body)}")
    return {"name": name.strip(), "arguments": arguments}, None


def parse_tool_calls(text: str) -> tuple[list[dict], list[str]]:
    """The tool calls in a model's turn, in the Hermes format (`<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`, any number per turn): `([{"name": str, "arguments": dict}, ...], [error, ...])`, one error
    string per malformed call (not JSON, no name, arguments not an object, an unclosed tag). "parameters" is read
    as "arguments", and arguments given as a JSON string are decoded. Calls inside reasoning (before the last
    `</think>`) are not actions and are ignored. Never raises on a string; linear in its length (`str.find`
    scans, no backtracking regex), so hostile output cannot stall a rollout."""
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls: text is {type(text).__name__}, not str")
    calls: list[dict] = []
    errors: list[str] = []
    think_end = text.rfind(THINK_CLOSE)
    position = 0 if think_end < 0 else think_end + len(THINK_CLOSE)
    index = 0
    while True:
        start = text.find(OPEN_TAG, position)
        if start < 0:
            break
        index += 1
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        if end < 0:  # cut off (length limit) or forgotten: what follows is not a call we can trust
            errors.append(f"tool call {index}: {OPEN_TAG} without {CLOSE_TAG}: {_excerpt(text[body_start:].strip())}")
            break
        body = text[body_start:end].strip()
        position = end + len(CLOSE_TAG)
        try:
            value = json.loads(body)
        except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, and ints past Python's digit limit
            errors.append(f"tool call {index}: not valid JSON ({e}): {_excerpt(body)}")
            continue
        # A JSON list of calls in one tag is read as those calls (some models batch them so).
        for item in value if isinstance(value, list) and value else [value]:
            call, error = _call_from_json(item, index, body)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
    return calls, errors


def tools_system_prompt(schemas: list[dict]) -> str:
    """A system message's text listing the tools (their JSON schemas) and the Hermes `<tool_call>` format to
    call them in, for chat templates that do not render `tools=` themselves (`template_renders_tools`)."""
    if not schemas:
        raise ValueError("tools_system_prompt: no tool schemas given (schemas is empty)")
    for schema in schemas:
        if not isinstance(schema, dict):
            raise ValueError(f"tools_system_prompt: a schema is a dict (from tool_schemas), got "
                             f"{_excerpt(repr(schema))}")
    listing = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return ("You can call tools to help you with the task. The tools are described by these JSON schemas, one a "
            f"line, between <tools> and </tools>:\n<tools>\n{listing}\n</tools>\n\n"
            "To call a tool, write its name and arguments as a JSON object between <tool_call> and </tool_call>, "
            "one call per pair of tags (you may make several calls in one turn):\n"
            '<tool_call>\n{"name": <tool name>, "arguments": <the arguments as a JSON object>}\n</tool_call>\n\n'
            "Each call's result comes back to you in a message of its own. When you need no more tools, "
            "give your final answer without a tool call.")


# A tool no template would list by itself: the probe for `template_renders_tools`.
_PROBE_TOOL = {"type": "function", "function": {
    "name": "lmrl_probe_tool_5e1d", "description": "A probe tool.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": "A probe argument."}},
                   "required": ["x"]}}}


def template_renders_tools(tokenizer) -> bool:
    """True when the tokenizer's chat template uses `tools`: rendering a conversation with a probe tool changes
    the text (both renderings with the template arguments every prompt gets). False for templates that ignore
    it (then put `tools_system_prompt` in a system message)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return False
    messages = [{"role": "user", "content": "hi"}]
    try:
        plain = render_chat(tokenizer, messages, add_generation_prompt=True)
        with_tools = render_chat(tokenizer, messages, add_generation_prompt=True, tools=[_PROBE_TOOL])
    except Exception:  # jinja2's TemplateError and the like: a template that cannot take tools does not render them
        return False
    return plain != with_tools


def run_coroutines(coroutines: list) -> list:
    """The coroutines' results (or the exceptions they raised), run concurrently to completion. `asyncio.run`
    refuses to run inside a running event loop, so there (an async caller) they run in a thread of their own."""

    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _argument_problem(fn: Callable, arguments: dict) -> str | None:
    """What is wrong with calling `fn(**arguments)` (unknown and missing argument names, all of them, so the
    model can fix its call at once), or None."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None  # no signature to check against (some builtins): the call itself will tell
    named = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    unknown = [k for k in arguments if k not in named and not takes_any]
    missing = [k for k, p in named.items() if p.default is p.empty and k not in arguments]
    problems = []
    if unknown:
        problems.append(f"unknown argument{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}")
    if missing:
        problems.append(f"missing required argument{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}")
    if problems:
        takes = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return "; ".join(problems) + f" (it takes {', '.join(takes) or 'no arguments'})"
    try:
        inspect.signature(fn).bind(**arguments)  # what the name checks above do not cover (positional-only, ...)
    except TypeError as e:
        return str(e)
    return None


def _error(message: str) -> dict:
    return {"error": message}


class ToolEnv:
    """One episode with tools, in lmrl's environment protocol. `reset` returns the prompt (chat messages);
    each `step` runs the tool calls in the model's turn and returns their results as `{"role": "tool"}`
    messages, or ends the episode when the turn has no call. The reward is 0 at every step: it comes from
    the task's reward functions, or from `get_reward()` when the environment defines it."""

    def __init__(self, tools: list[Callable], *, prompt: list[dict], row: dict | None = None, environment=None,
                 max_result_chars: int = 4000):
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
            raise ValueError(f"ToolEnv: prompt is a list of chat messages, got {_excerpt(repr(prompt))}")
        if row is not None and not isinstance(row, dict):
            raise ValueError(f"ToolEnv: row is a dict of the data set row's columns, got {type(row).__name__}")
        if isinstance(max_result_chars, bool) or not isinstance(max_result_chars, int) or max_result_chars < 1:
            raise ValueError(f"ToolEnv: max_result_chars={max_result_chars!r}; it is a positive integer")
        for fn in tools:
            if not callable(fn):
                raise ValueError(f"ToolEnv: tool {fn!r} ({type(fn).__name__}) is not callable")
        if environment is not None and "reset" not in _class_functions(environment):
            raise ValueError(f"ToolEnv: environment {env_name(environment)} has no reset() method (an "
                             f"environment_factory instance defines reset(**row))")
        self.prompt = prompt
        self.row = dict(row or {})
        self.environment = environment
        self.max_result_chars = max_result_chars
        self.tools: list[Callable] = list(tools) + (environment_tools(environment) if environment is not None else [])
        _check_unique(self.tools, "ToolEnv")
        self._by_name = {_tool_name(fn): fn for fn in self.tools}
        self.calls_total = 0
        self.failures_total = 0

    @property
    def name(self) -> str:
        """How errors name this environment (protocol.env_name): the wrapped environment's class, if any."""
        return f"ToolEnv({env_name(self.environment)})" if self.environment is not None else "ToolEnv"

    @property
    def reward_source_name(self) -> str | None:
        """The environment's class name when it defines `get_reward` (TRL's reward column), else None."""
        if self.environment is not None and "get_reward" in _class_functions(self.environment):
            return type(self.environment).__name__
        return None

    def reset(self, seed: int | None = None) -> list[dict]:
        """The opening messages: the prompt, with the environment's `reset(**row)` text appended to its last
        message. `seed` is not used: the episode is the row's (an environment draws from its row, as in TRL)."""
        self.calls_total = 0
        self.failures_total = 0
        messages = [dict(m) for m in self.prompt]  # copies: the data set's prompt stays as it was
        if self.environment is None:
            return messages
        observation = self.environment.reset(**self.row)
        if observation is None:
            return messages
        if not isinstance(observation, str):
            raise ValueError(f"environment {env_name(self.environment)}: reset(**row) returned "
                             f"{_excerpt(repr(observation))} ({type(observation).__name__}); return a string "
                             f"(appended to the prompt) or None")
        if not messages:
            return [{"role": "user", "content": observation}]
        last = messages[-1]
        content = last.get("content") or ""
        if isinstance(content, list):  # multimodal content parts: the text joins as one more part (TRL's way)
            messages[-1] = {**last, "content": content + [{"type": "text", "text": observation}]}
        else:
            messages[-1] = {**last, "content": content + observation}  # TRL appends with no separator
        return messages

    def _result(self, name: str, arguments: dict) -> tuple[Any, bool, Any]:
        """(result, failed, coroutine): a sync tool's result now; an async tool's coroutine to run later."""
        fn = self._by_name.get(name)
        if fn is None:
            known = ", ".join(self._by_name) or "none"
            return _error(f"unknown tool {name!r}; the tools are: {known}"), True, None
        problem = _argument_problem(fn, arguments)
        if problem:  # a wrong or missing argument name: say which, before running anything
            return _error(f"wrong arguments for tool {name!r}: {problem}"), True, None
        try:
            result = fn(**arguments)
        except Exception as e:  # the tool's own failure is the model's feedback, not the rollout's crash
            return _error(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__), True, None
        if inspect.isawaitable(result):
            return None, False, result
        return result, False, None

    def _content(self, result: Any) -> tuple[str, bool]:
        try:
            return str(result)[: self.max_result_chars], False
        except Exception as e:  # e.g. an int past Python's digit limit
            return str(_error(f"the result could not be written as text: {type(e).__name__}: {e}")), True

    def step(self, action_text: str) -> tuple[str | list[dict], float, bool, bool, dict]:
        """Runs the tool calls in the model's turn. No call at all ends the episode: `("", 0.0, True, False,
        info)`; otherwise one tool message per call (malformed calls answered with their error), reward 0."""
        calls, errors = parse_tool_calls(action_text)
        if not calls and not errors:
            return "", 0.0, True, False, self._info(0, 0)
        # Sync tools run in order as they come; async tools' coroutines run together afterwards, and every
        # result goes back in the order the model wrote the calls.
        slots: list[list] = []  # [name, result, failed]
        pending: list[tuple[int, Any]] = []
        for call in calls:
            result, failed, coroutine = self._result(call["name"], call["arguments"])
            if coroutine is not None:
                pending.append((len(slots), coroutine))
            slots.append([call["name"], result, failed])
        if pending:
            for (slot, _), result in zip(pending, run_coroutines([c for _, c in pending])):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):  # KeyboardInterrupt and the like stop the run
                        raise result
                    slots[slot][1:] = [_error(f"{type(result).__name__}: {result}" if str(result)
                                              else type(result).__name__), True]
                else:
                    slots[slot][1] = result
        messages = []
        failures = 0
        for name, result, failed in slots:
            content, unwritable = self._content(result)
            failures += failed or unwritable
            messages.append({"role": "tool", "name": name, "content": content})
        for error in errors:
            content = str(_error(error))[: self.max_result_chars]
            messages.append({"role": "tool", "name": "invalid_tool_call", "content": content})
        return messages, 0.0, False, False, self._info(len(calls) + len(errors), failures + len(errors))

    def _info(self, calls: int, failures: int) -> dict:
        self.calls_total += calls
        self.failures_total += failures
        return {"tool_calls": calls, "tool_failures": failures, "tool_calls_total": self.calls_total,
                "tool_failures_total": self.failures_total}

    def get_reward(self) -> float | None:
        """The environment's `get_reward()` as a float (awaited when async); None when it defines none, or
        returned None (no reward for this episode, as TRL reads it)."""
        if self.reward_source_name is None:
            return None
        value = self.environment.get_reward()
        if inspect.isawaitable(value):
            (value,) = run_coroutines([value])
            if isinstance(value, BaseException):
                raise value
        if value is None:
            return None
        return as_reward(value, env_name(self.environment), "get_reward()")

    def close(self) -> None:
        """Closes the environment when it has `close()`; a ToolEnv itself holds nothing."""
        close = getattr(self.environment, "close", None)
        if callable(close):
            close()
