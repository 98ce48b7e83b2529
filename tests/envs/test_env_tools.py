"""Tools: schemas from Python functions, argument validation, the Hermes parser, execution."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Literal

import pytest

from temper.envs import (
    AssistantTurn,
    StepResult,
    Tool,
    ToolEnv,
    execute_tool_calls,
    parse_tool_calls,
    validate_arguments,
)
from temper.envs.tools import format_result, parse_docstring, type_schema
from temper.records import Task


def search(
    query: str,
    limit: int = 5,
    scale: float = 1.0,
    exact: bool = False,
    tags: list[str] | None = None,
    mode: Literal["fast", "deep"] = "fast",
    filters: dict[str, int] | None = None,
    matrix: list[list[float]] | None = None,
) -> str:
    """Search the corpus.

    Returns the best hits.

    Args:
        query (str): What to look for.
        limit: How many hits to return,
            at most 50.
        scale: Score multiplier.
        exact: Match the query exactly.
        tags: Only hits with these tags.
        mode: Search strategy.
        filters: Field -> minimum value.
        matrix: A nested list.

    Returns:
        The hits, one per line.
    """
    return query


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "late"


def blocking(seconds: float) -> str:
    """Block the calling thread."""
    time.sleep(seconds)
    return "done"


def boom(x: int) -> int:
    """Always fails."""
    raise ZeroDivisionError("division by zero")


def weird() -> object:
    """Returns something JSON cannot encode."""
    return {1, 2}


def test_schema_from_function() -> None:
    schema = Tool.from_function(search).schema
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the corpus.\n\nReturns the best hits."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["limit"] == {
        "type": "integer",
        "description": "How many hits to return, at most 50.",
        "default": 5,
    }
    assert props["scale"]["type"] == "number"
    assert props["exact"]["type"] == "boolean"
    assert props["tags"]["type"] == ["array", "null"]
    assert props["tags"]["items"] == {"type": "string"}
    assert props["mode"] == {
        "type": "string",
        "enum": ["fast", "deep"],
        "description": "Search strategy.",
        "default": "fast",
    }
    assert props["filters"]["additionalProperties"] == {"type": "integer"}
    assert props["matrix"]["items"] == {"type": "array", "items": {"type": "number"}}
    json.dumps(schema)  # the schema is plain JSON


def test_type_schema_edge_cases() -> None:
    assert type_schema(list) == {"type": "array"}
    assert type_schema(dict) == {"type": "object"}
    assert type_schema(Literal[1, 2] | None) == {
        "anyOf": [{"type": "integer", "enum": [1, 2]}, {"type": "null"}]
    }
    for bad in (tuple[int, int], int | str, dict[int, str], Literal["a", 1], set[int]):
        with pytest.raises(TypeError):
            type_schema(bad)


def test_unsupported_signatures_name_tool_and_argument() -> None:
    def no_hint(x):  # type: ignore[no-untyped-def]
        """Missing hint."""

    def var(*xs: int) -> None:
        """Varargs."""

    def bad_type(x: tuple[int]) -> None:
        """Tuple."""

    with pytest.raises(TypeError, match="tool 'no_hint' argument 'x': missing type hint"):
        Tool.from_function(no_hint)
    with pytest.raises(TypeError, match=r"\*args"):
        Tool.from_function(var)
    with pytest.raises(TypeError, match="tool 'bad_type' argument 'x': unsupported"):
        Tool.from_function(bad_type)
    renamed = Tool.from_function(add, name="plus", description="Adds.")
    assert (renamed.name, renamed.description) == ("plus", "Adds.")


def test_parse_docstring_sections() -> None:
    summary, args = parse_docstring(
        """Do it.

        Arguments:
            x: first
            y (int, optional): second,
                continued
        Raises:
            ValueError: not an argument
        """
    )
    assert summary == "Do it."
    assert args == {"x": "first", "y": "second, continued"}
    assert parse_docstring(None) == ("", {})


def test_validate_arguments() -> None:
    params = Tool.from_function(search).parameters
    assert validate_arguments(params, {"query": "q"}) == []
    assert validate_arguments(params, {"query": "q", "scale": 2, "tags": None}) == []  # int ok
    errors = validate_arguments(
        params,
        {
            "limit": True,
            "scale": "big",
            "tags": ["a", 3],
            "mode": "slow",
            "filters": {"x": 1.5},
            "extra": 1,
        },
    )
    assert errors == [
        "missing required argument 'query'",
        "unexpected argument 'extra'",
        "argument 'limit' must be integer, got boolean",
        "argument 'scale' must be number, got string",
        "argument 'tags'[1] must be string, got integer",
        'argument \'mode\' must be one of ["fast", "deep"], got "slow"',
        "argument 'filters'['x'] must be integer, got number",
    ]
    assert validate_arguments(params, {"query": "q", "limit": 3.0}) == [
        "argument 'limit' must be integer, got number"
    ]


def test_parse_single_parallel_and_malformed_calls() -> None:
    text = (
        "Let me compute.\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}\n</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
        '<tool_call>["add"]</tool_call>'
        '<tool_call>{"name": "add", "arguments": 7}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1'
    )
    calls, errors = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.index, c.id) for c in calls] == [
        ("add", {"a": 1, "b": 2}, 0, "call_0"),
        ("add", {"a": 3, "b": 4}, 1, "call_1"),
    ]
    assert [(e.kind, e.index) for e in errors] == [
        ("bad_json", 2),
        ("bad_format", 3),
        ("bad_format", 4),
        ("unclosed", 5),
    ]
    assert "not valid JSON" in errors[0].message
    assert "arguments" in errors[2].message
    assert parse_tool_calls("no calls here") == ([], [])
    # An unclosed block followed by another block: the first is unclosed, the second parses.
    calls, errors = parse_tool_calls('<tool_call>{"name"<tool_call>{"name": "x"}</tool_call>')
    assert [c.name for c in calls] == ["x"] and calls[0].arguments == {}
    assert [e.kind for e in errors] == ["unclosed"]


def turn_with(text: str) -> AssistantTurn:
    calls, errors = parse_tool_calls(text)
    return AssistantTurn(text, [], calls, errors)


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_execute_tool_calls_every_outcome() -> None:
    tools = {t.name: t for t in map(Tool.from_function, (add, slow, boom, weird, blocking))}
    text = "".join(
        [
            call("add", a=2, b=3),
            call("nope"),
            call("add", a=2),
            call("add", a="2", b=3, c=1),
            "<tool_call>{bad json}</tool_call>",
            call("boom", x=1),
            call("slow", seconds=5),
            call("weird"),
            call("blocking", seconds=0.0),
        ]
    )
    start = time.monotonic()
    messages, metrics = asyncio.run(
        execute_tool_calls(tools, turn_with(text), timeout_s=0.2, max_calls=None)
    )
    assert time.monotonic() - start < 2.0
    assert all(m["role"] == "tool" for m in messages)
    assert [m["tool_call_id"] for m in messages] == [f"call_{i}" for i in range(9)]
    contents = [m["content"] for m in messages]
    assert contents[0] == "5"
    assert (
        contents[1]
        == "error: unknown tool 'nope'; available tools: add, blocking, boom, slow, weird"
    )
    assert contents[2] == "error: invalid arguments for 'add': missing required argument 'b'"
    assert contents[3] == (
        "error: invalid arguments for 'add': unexpected argument 'c'; "
        "argument 'a' must be integer, got string"
    )
    assert contents[4].startswith("error: tool call is not valid JSON")
    assert contents[5] == "error: tool 'boom' raised ZeroDivisionError: division by zero"
    assert contents[6] == "error: tool 'slow' timed out after 0.2s"
    assert contents[7] == "{1, 2}"
    assert contents[8] == "done"
    assert messages[4]["name"] == "invalid"
    assert metrics == {
        "tool_calls": 9.0,
        "tool_ok": 3.0,
        "tool_errors": 6.0,
        "tool_error_unknown_tool": 1.0,
        "tool_error_invalid_args": 2.0,
        "tool_error_bad_json": 1.0,
        "tool_error_exception": 1.0,
        "tool_error_timeout": 1.0,
    }


def test_sync_tools_run_off_the_event_loop() -> None:
    tools = {"blocking": Tool.from_function(blocking)}
    text = call("blocking", seconds=0.3) * 3

    async def go() -> tuple[float, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        start = time.monotonic()
        await execute_tool_calls(tools, turn_with(text), timeout_s=5)
        tick.cancel()
        return time.monotonic() - start, ticks

    elapsed, ticks = asyncio.run(go())
    assert elapsed < 0.8  # three 0.3 s calls ran in parallel threads
    assert ticks >= 5  # the loop kept running meanwhile


def test_too_many_calls_and_truncated_output() -> None:
    def long(n: int) -> str:
        """A long string."""
        return "x" * n

    tools = {"long": Tool.from_function(long)}
    text = call("long", n=30) * 3
    messages, metrics = asyncio.run(
        execute_tool_calls(tools, turn_with(text), max_calls=2, max_output_chars=10)
    )
    assert messages[0]["content"] == "x" * 10 + "... [truncated 20 chars]"
    assert messages[2]["content"] == "error: too many tool calls (at most 2 per turn)"
    assert metrics["tool_error_too_many"] == 1.0
    assert format_result([1, "a"], None) == '[1, "a"]'


class CalcEnv(ToolEnv):
    def __init__(self) -> None:
        super().__init__([add], tool_timeout_s=1.0)

    async def answer(self, turn: AssistantTurn) -> StepResult:
        return StepResult([], reward=float("5" in turn.text), done=True)


def test_tool_env_steps() -> None:
    env = CalcEnv()
    assert [t["function"]["name"] for t in env.tools] == ["add"]

    async def go() -> tuple[list[dict], StepResult, StepResult]:
        first = await env.reset(Task("t", "What is 2 + 3?"), seed=0)
        mid = await env.step(turn_with(call("add", a=2, b=3)))
        end = await env.step(turn_with("It is 5."))
        await env.close()
        return first, mid, end

    first, mid, end = asyncio.run(go())
    assert first == [{"role": "user", "content": "What is 2 + 3?"}]
    assert not mid.done and mid.observation[0]["content"] == "5"
    assert mid.metrics["tool_ok"] == 1.0
    assert end.done and end.reward == 1.0 and end.observation == []
    with pytest.raises(ValueError, match="duplicate"):
        ToolEnv([add, Tool.from_function(add)])
