"""Tool calling: Python functions as tools, the Hermes call parser, safe execution.

A tool is a plain function (sync or async) with type hints and a docstring.
`Tool.from_function` turns it into an OpenAI-format schema
(`{"type": "function", "function": {"name", "description", "parameters"}}`):
the description is the docstring's text before its sections, and each
argument's description comes from a Google-style `Args:` section. Supported
argument types: int, float, str, bool, list[...], dict / dict[str, ...],
Literal[...], and `X | None`; arguments without a default are required.

`parse_tool_calls` reads Hermes blocks, `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, several per turn for parallel calls. `execute_tool_calls`
validates each call against its tool's schema and runs it with a timeout.
Anything wrong (bad JSON, unknown tool, bad arguments, an exception, a
timeout) becomes a `tool` message whose content starts with "error: " and a
count under `tool_error_<kind>`; it never raises. `ToolEnv` wires this into
the Env protocol.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.errors import InfraError
from temper.models.tool_calls import ToolCall, ToolCallError
from temper.records import Task

_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def type_schema(annotation: Any) -> dict[str, Any]:
    """JSON schema of a type hint; raises TypeError for unsupported hints."""
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is list or origin is list:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"dict keys must be str, got {annotation!r}")
        schema: dict[str, Any] = {"type": "object"}
        if args:
            schema["additionalProperties"] = type_schema(args[1])
        return schema
    if origin is Literal:
        kinds = {_SCALARS.get(type(a)) for a in args}
        if None in kinds or len(kinds) != 1:
            raise TypeError(f"Literal values must share one of str/int/float/bool: {annotation!r}")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise TypeError(f"only `X | None` unions are supported, got {annotation!r}")
        inner = type_schema(rest[0])
        if "enum" not in inner and isinstance(inner.get("type"), str):
            return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    raise TypeError(f"unsupported argument type {annotation!r}")


_SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section, current, arg_indent = None, None, None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current, arg_indent = header.group(1), None, None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments") and line.strip():
            indent = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(line.strip())
            if match and (arg_indent is None or indent <= arg_indent):
                arg_indent, current = indent, match.group(1).lstrip("*")
                args[current] = match.group(2).strip()
            elif current is not None:  # a continuation line of the current argument
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


@dataclass(frozen=True)
class Tool:
    """A callable tool and its JSON schema. Build one with `Tool.from_function`."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], name: str | None = None, description: str | None = None
    ) -> Tool:
        """Derive the schema from `fn`'s signature, type hints and docstring.

        Raises TypeError naming the tool and argument when an argument has no
        type hint, an unsupported type, or is `*args` / `**kwargs`.
        """
        tool_name = name or fn.__name__
        summary, arg_docs = parse_docstring(fn.__doc__)
        hints = get_type_hints(fn)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            where = f"tool {tool_name!r} argument {pname!r}"
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"{where}: *args / **kwargs are not supported")
            if pname not in hints:
                raise TypeError(f"{where}: missing type hint")
            try:
                prop = type_schema(hints[pname])
            except TypeError as exc:
                raise TypeError(f"{where}: {exc}") from None
            if pname in arg_docs:
                prop["description"] = arg_docs[pname]
            if param.default is inspect.Parameter.empty:
                required.append(pname)
            elif _is_json(param.default):
                prop["default"] = param.default
            properties[pname] = prop
        parameters = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        return cls(tool_name, description or summary, parameters, fn)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI-format function schema."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}

    async def call(self, arguments: Mapping[str, Any], timeout_s: float | None) -> Any:
        """Run the tool with a timeout. Sync tools run in a worker thread.

        On timeout asyncio.TimeoutError is raised; a sync tool's thread cannot be
        killed and runs on in the background until it returns.
        """
        if inspect.iscoroutinefunction(self.fn):
            coro = self.fn(**arguments)
        else:
            coro = asyncio.to_thread(self.fn, **arguments)
        return await asyncio.wait_for(coro, timeout_s)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":  # bool is an int subclass in Python, not in JSON
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":  # an integer is a valid number
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return True


def _check(value: Any, schema: Mapping[str, Any], where: str) -> list[str]:
    """Problems with `value` against the subset of JSON schema `type_schema` writes."""
    if "anyOf" in schema:
        options = [_check(value, s, where) for s in schema["anyOf"]]
        return [] if any(not o for o in options) else options[0]
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
    if kinds and not any(_type_ok(value, k) for k in kinds):
        return [f"{where} must be {' or '.join(kinds)}, got {_json_type(value)}"]
    if value is None:
        return []
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}"]
    if isinstance(value, list) and "items" in schema:
        return [e for i, v in enumerate(value) for e in _check(v, schema["items"], f"{where}[{i}]")]
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        sub = schema["additionalProperties"]
        return [e for k, v in value.items() for e in _check(v, sub, f"{where}[{k!r}]")]
    return []


def _json_type(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _type_ok(value, kind):
            return kind
    return type(value).__name__


def validate_arguments(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """Every problem with `arguments` against a tool's `parameters` schema ([] if valid).

    Checks required and unexpected arguments, types (recursively into lists
    and dict values) and enums. Integers are accepted for numbers; booleans
    are not integers; 3.0 is not an integer.
    """
    properties = parameters.get("properties", {})
    errors = [
        f"missing required argument {name!r}"
        for name in parameters.get("required", [])
        if name not in arguments
    ]
    if parameters.get("additionalProperties") is False:
        errors += [f"unexpected argument {name!r}" for name in arguments if name not in properties]
    for name, value in arguments.items():
        if name in properties:
            errors += _check(value, properties[name], f"argument {name!r}")
    return errors


def format_result(value: Any, max_chars: int | None) -> str:
    """A tool's return value as message text: strings as-is, else JSON (else str)."""
    text = (
        value if isinstance(value, str) else (json.dumps(value) if _is_json(value) else str(value))
    )
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + f"... [truncated {len(text) - max_chars} chars]"
    return text


async def _run_one(
    tools: Mapping[str, Tool], call: ToolCall, timeout_s: float | None, max_chars: int | None
) -> tuple[str, str]:
    """(content, outcome) for one call; outcome is "ok" or an error kind."""
    tool = tools.get(call.name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        return f"error: unknown tool {call.name!r}; available tools: {names}", "unknown_tool"
    problems = validate_arguments(tool.parameters, call.arguments)
    if problems:
        return f"error: invalid arguments for {call.name!r}: {'; '.join(problems)}", "invalid_args"
    try:
        result = await tool.call(call.arguments, timeout_s)
    except TimeoutError:
        return f"error: tool {call.name!r} timed out after {timeout_s}s", "timeout"
    except InfraError:
        raise  # the infrastructure failed (a sandbox server lost): the episode is retried
    except Exception as exc:  # a tool's bug must not end the episode
        return f"error: tool {call.name!r} raised {type(exc).__name__}: {exc}", "exception"
    return format_result(result, max_chars), "ok"


async def execute_tool_calls(
    tools: Mapping[str, Tool],
    turn: AssistantTurn,
    *,
    timeout_s: float | None = 10.0,
    max_output_chars: int | None = 4000,
    max_calls: int | None = 8,
) -> tuple[list[Message], dict[str, float]]:
    """Run a turn's tool calls concurrently; one `tool` message per block, in order.

    Parse errors, unknown tools, invalid arguments, exceptions, timeouts and
    calls beyond `max_calls` each give an "error: ..." message. Metrics:
    `tool_calls` (blocks seen), `tool_ok`, `tool_errors` and `tool_error_<kind>`.
    """
    blocks: list[ToolCall | ToolCallError] = sorted(
        [*turn.tool_calls, *turn.parse_errors], key=lambda b: b.index
    )
    counts: Counter[str] = Counter()

    async def answer(position: int, block: ToolCall | ToolCallError) -> Message:
        if isinstance(block, ToolCallError):
            content, outcome = f"error: {block.message}", block.kind
        elif max_calls is not None and position >= max_calls:
            content, outcome = (
                f"error: too many tool calls (at most {max_calls} per turn)",
                "too_many",
            )
        else:
            content, outcome = await _run_one(tools, block, timeout_s, max_output_chars)
        counts["tool_ok" if outcome == "ok" else f"tool_error_{outcome}"] += 1
        name = block.name if isinstance(block, ToolCall) else "invalid"
        return {
            "role": "tool",
            "name": name,
            "tool_call_id": f"call_{block.index}",
            "content": content,
        }

    messages = list(await asyncio.gather(*[answer(i, b) for i, b in enumerate(blocks)]))
    metrics = {"tool_calls": float(len(blocks)), **{k: float(v) for k, v in counts.items()}}
    metrics["tool_errors"] = float(len(blocks) - counts["tool_ok"])
    return messages, metrics


class ToolEnv:
    """Base class for envs whose assistant turns call Python tools.

    A turn with tool-call blocks gets their results (or error messages) as
    the observation, and the episode goes on. A turn without any block is
    the final answer: `answer(turn)` decides the reward and whether the
    episode ends (by default: done, no reward). Subclasses override `reset`
    (default: the task's messages) and `answer`; they get tool schemas,
    validation, timeouts and error counting from here.
    """

    def __init__(
        self,
        tools: Iterable[Callable[..., Any] | Tool],
        *,
        tool_timeout_s: float | None = 10.0,
        max_output_chars: int | None = 4000,
        max_calls_per_turn: int | None = 8,
    ) -> None:
        built = [t if isinstance(t, Tool) else Tool.from_function(t) for t in tools]
        self.tool_map: dict[str, Tool] = {t.name: t for t in built}
        if len(self.tool_map) != len(built):
            raise ValueError(f"duplicate tool names: {[t.name for t in built]}")
        self.tool_timeout_s = tool_timeout_s
        self.max_output_chars = max_output_chars
        self.max_calls_per_turn = max_calls_per_turn

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tool_map.values()]

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        return task.messages()

    async def step(self, turn: AssistantTurn) -> StepResult:
        if not turn.tool_calls and not turn.parse_errors:
            return await self.answer(turn)
        messages, metrics = await execute_tool_calls(
            self.tool_map,
            turn,
            timeout_s=self.tool_timeout_s,
            max_output_chars=self.max_output_chars,
            max_calls=self.max_calls_per_turn,
        )
        return StepResult(messages, metrics=metrics)

    async def answer(self, turn: AssistantTurn) -> StepResult:
        """Score a turn without tool calls. Default: end the episode, no reward."""
        return StepResult([], done=True)

    async def close(self) -> None:
        return None
