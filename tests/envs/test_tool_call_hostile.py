"""Hostile model output in tool calls: the parser never raises, every malformed block is
an "error:" observation, and a rollout group survives it. Property-based with hypothesis."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scripted_engine import ScriptedEngine
from temper.engine.base import SamplingParams
from temper.envs import AssistantTurn, ToolEnv, execute_tool_calls, parse_tool_calls
from temper.models import load_tokenizer
from temper.models.tool_calls import MAX_CALL_CHARS, MAX_CALLS
from temper.records import Task
from temper.rewards.base import RewardInput
from temper.rewards.tool_call_ast import ToolCallASTReward, check_tool_calls, extract_tool_calls
from temper.rollout.multi_turn import run_episodes

DEEP = "[" * 1000
HUGE_INT = "9" * 5000


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def block(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


HOSTILE = {
    "deep_array": block(DEEP),
    "deep_closed_array": block("[" * 5000 + "]" * 5000),
    "deep_object": block('{"a":' * 3000 + "1" + "}" * 3000),
    "deep_args": block('{"name": "add", "arguments": {"a": ' + "[" * 2000 + "]" * 2000 + "}}"),
    "deep_args_string": block(json.dumps({"name": "add", "arguments": "[" * 2000})),
    "huge_int": block('{"name": "add", "arguments": {"a": ' + HUGE_INT + ', "b": 1}}'),
    "huge_int_in_string_args": block(
        json.dumps({"name": "add", "arguments": '{"a": ' + HUGE_INT + "}"})
    ),
    "lone_surrogate_name": block('{"name": "\\ud800", "arguments": {}}'),
    "lone_surrogate_arg": block('{"name": "add", "arguments": {"a": "\\udfff", "b": 1}}'),
    "lone_surrogate_key": block('{"name": "add", "arguments": {"\\ud800": 1}}'),
    "nan": block('{"name": "add", "arguments": {"a": NaN, "b": 1}}'),
    "infinity": block('{"name": "add", "arguments": {"a": -Infinity, "b": 1}}'),
    "float_overflow": block('{"name": "add", "arguments": {"a": 1e999, "b": 1}}'),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_block_is_a_parse_error_not_an_exception(name: str) -> None:
    calls, errors = parse_tool_calls("Let me think.\n" + HOSTILE[name])
    assert calls == []
    (error,) = errors
    assert error.kind in ("bad_json", "bad_format")
    assert "\n" not in error.message and len(error.message) < 300


def test_hostile_blocks_become_error_observations_beside_a_good_call() -> None:
    text = block('{"name": "add", "arguments": {"a": 2, "b": 3}}') + "".join(HOSTILE.values())
    calls, errors = parse_tool_calls(text)
    assert [c.name for c in calls] == ["add"] and len(errors) == len(HOSTILE)
    turn = AssistantTurn(text, [], calls, errors, "stop", 0)
    messages, metrics = asyncio.run(
        execute_tool_calls({"add": ToolEnv([add]).tool_map["add"]}, turn)
    )
    contents = [m["content"] for m in messages]
    assert contents[0] == "5"
    assert all(c.startswith("error: ") for c in contents[1:])
    assert metrics["tool_ok"] == 1.0 and metrics["tool_errors"] == float(len(HOSTILE))


def test_a_rollout_group_survives_hostile_tool_calls() -> None:
    """Each episode of the group writes one hostile call, then a plain answer: every
    episode ends normally with the parse error as its observation."""
    tokenizer = load_tokenizer("tiny")
    hostile = [HOSTILE["deep_array"], HOSTILE["huge_int"], HOSTILE["lone_surrogate_arg"]]

    first_turns = iter(hostile)

    def reply(prompt: str, index: int) -> str:
        return "done" if "error:" in prompt else next(first_turns)

    engine = ScriptedEngine(tokenizer, [reply], max_context=1 << 16, by="call")
    tokenizer.model_max_length = 1 << 20
    task = Task(id="t", prompt=[{"role": "user", "content": "add 2 and 3"}])
    params = SamplingParams(temperature=0.0, max_new_tokens=8000)

    async def go():
        return await run_episodes(
            engine, lambda t: ToolEnv([add]), [task], tokenizer, params, group_size=3
        )

    (group,) = asyncio.run(go())
    assert len(group) == 3
    for traj in group:
        assert traj.env_error is None and traj.finish_reason == "done"
        tool_msgs = [m["content"] for m in traj.messages if m["role"] == "tool"]
        assert len(tool_msgs) == 1 and tool_msgs[0].startswith("error: tool call is not valid JSON")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_tool_call_ast_reward_scores_hostile_output_zero(name: str) -> None:
    truth = [{"add": {"a": [2], "b": [3]}}]
    verdict = check_tool_calls(HOSTILE[name], truth)
    assert verdict.score == 0.0 and "malformed tool call" in verdict.reason
    task = Task(id="t", prompt="q", columns={"ground_truth": truth})
    (result,) = asyncio.run(ToolCallASTReward().score([RewardInput(task, "q", HOSTILE[name])]))
    assert result.score == 0.0 and result.components["parses"] == 0.0


@pytest.mark.parametrize(
    "cell",
    ["[" * 3000, '[{"add": {"a": [' + HUGE_INT + "]}}]", '[{"add": {"a": ["\\ud800"]}}]'],
)
def test_tool_call_ast_bad_ground_truth_json_is_a_task_error(cell: str) -> None:
    task = Task(id="t", prompt="q", columns={"ground_truth": cell, "functions": cell})
    (result,) = asyncio.run(ToolCallASTReward().score([RewardInput(task, "q", "[add(a=2)]")]))
    assert result.score == 0.0 and "bad ground truth" in result.error
    assert "\n" not in result.error


def test_python_call_syntax_with_hostile_literals_does_not_raise() -> None:
    for text in ["[f(a=" + DEEP + ")]", "[f(a=" + HUGE_INT + ")]", "(" * 500 + "f()" + ")" * 500]:
        verdict = check_tool_calls(text, [{"f": {"a": [1]}}])
        assert verdict.score == 0.0


# ----------------------------------------------------------------------- properties

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", "\\", "\\ud800",
     '"name"', '"arguments"', "NaN", "1e999", HUGE_INT[:50], "null", " ", "\n"]
)  # fmt: skip
_noise = st.lists(st.one_of(_fragments, st.text(max_size=5)), max_size=40).map("".join)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(_noise)
def test_property_parser_never_raises_on_noise(text: str) -> None:
    calls, errors = parse_tool_calls(text)
    assert len(calls) + len(errors) == text.count("<tool_call>")
    for call in calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        json.dumps(call.arguments)  # what the server and the trajectory file do with it
    for error in errors:
        assert error.kind in ("bad_json", "bad_format", "unclosed") and "\n" not in error.message
    extract_ok = True
    try:
        extract_tool_calls(text)
    except ValueError:
        extract_ok = False
    assert extract_ok or errors or not calls


@FAST
@given(st.text(min_size=1, max_size=12), st.dictionaries(st.text(max_size=8), _json_value))
def test_property_well_formed_calls_round_trip(name: str, arguments: dict) -> None:
    text = block(json.dumps({"name": name, "arguments": arguments}))
    calls, errors = parse_tool_calls(text)
    shown = json.dumps([name, arguments], ensure_ascii=False)
    # A name or argument holding the tags themselves cannot round-trip through Hermes text.
    assume("<tool_call>" not in shown and "</tool_call>" not in shown)
    has_surrogate = any(0xD800 <= ord(ch) <= 0xDFFF for ch in shown)
    if has_surrogate:  # hypothesis text can hold lone surrogates: refused, not raised
        assert errors and not calls
    else:
        assert errors == [] and calls[0].name == name and calls[0].arguments == arguments


LONG_TURNS = {  # each took 0.1 to 0.3 s, or gave 100,000 errors, before the caps
    "100k-open-tags": ("<tool_call>" * 100_000, (0, MAX_CALLS + 1, "too_many")),
    "10MB-of-braces-in-a-block": ("<tool_call>" + "{" * 10_000_000, (0, 1, "too_long")),
    "10MB-closed-block": (block("[" * 10_000_000), (0, 1, "too_long")),
    "1M-open-objects": ("<tool_call>" + '{\n"' * 1_000_000, (0, 1, "too_long")),
    "16k-newlines": ("<tool_call>\n```" + "\n" * 16_000, (0, 1, "unclosed")),
    "1000-calls": (
        "".join(block(json.dumps({"name": "add", "arguments": {"a": i}})) for i in range(1000)),
        (MAX_CALLS, 1, "too_many"),
    ),
}


@pytest.mark.parametrize("name", sorted(LONG_TURNS))
def test_long_turns_parse_in_bounded_time_and_errors(name: str) -> None:
    import time

    text, (n_calls, n_errors, last_kind) = LONG_TURNS[name]
    start = time.thread_time()  # this thread's CPU time: a loaded machine barely moves it
    calls, errors = parse_tool_calls(text)
    elapsed = time.thread_time() - start
    assert (len(calls), len(errors), errors[-1].kind) == (n_calls, n_errors, last_kind)
    assert all(len(e.message) < 200 and len(e.raw) <= MAX_CALL_CHARS for e in errors)
    assert elapsed < 0.1, f"{elapsed:.3f} s"
