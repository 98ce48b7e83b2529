"""Tool-call AST matching: each rule with hand-made calls, parsing, and the reward."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from temper.builder.rewards import build_reward
from temper.config import config_from_dict
from temper.records import Task
from temper.rewards.base import RewardInput
from temper.rewards.tool_call_ast import (
    ToolCallASTReward,
    ToolCallSyntaxError,
    check_tool_calls,
    extract_tool_calls,
    parse_expected,
)

FUNCS = [
    {
        "name": "geo.distance",
        "parameters": {
            "type": "dict",
            "properties": {
                "city": {"type": "string"},
                "km": {"type": "float"},
                "n": {"type": "integer"},
                "fast": {"type": "boolean"},
                "stops": {"type": "array", "items": {"type": "string"}},
                "box": {"type": "dict"},
            },
            "required": ["city"],
        },
    }
]


def check(text: str, args: dict, functions: list | None = FUNCS) -> tuple[float, str | None]:
    verdict = check_tool_calls(text, [{"geo.distance": args}], functions)
    return verdict.score, verdict.reason


def test_exact_call_in_python_and_hermes_syntax_scores_one():
    gt = {"city": ["Paris"], "n": [3]}
    assert check("[geo.distance(city='Paris', n=3)]", gt) == (1.0, None)
    hermes = (
        '<tool_call>{"name": "geo.distance", "arguments": {"city": "Paris", "n": 3}}</tool_call>'
    )
    assert check(hermes, gt) == (1.0, None)
    assert check("```python\ngeo.distance(n=3, city='Paris')\n```", gt) == (1.0, None)


def test_wrong_value_gives_the_reason():
    assert check("[geo.distance(city='Paris', n=3)]", {"city": ["Paris"], "n": [4]}) == (
        0.0,
        "geo.distance: wrong value for arg 'n': 3 not in [4]",
    )


def test_wrong_function_name():
    score, reason = check("[geo.dist(city='Paris')]", {"city": ["Paris"]})
    assert score == 0.0 and reason == "wrong function 'geo.dist', expected 'geo.distance'"


def test_missing_required_and_unknown_args():
    assert check("[geo.distance(n=3)]", {"city": ["Paris"], "n": [3]}) == (
        0.0,
        "geo.distance: missing required arg 'city'",
    )
    score, reason = check("[geo.distance(city='Paris', color='red')]", {"city": ["Paris"]})
    assert score == 0.0 and reason == "geo.distance: unknown arg 'color'"
    # Known to the schema but not to the expected call: also unknown.
    score, reason = check("[geo.distance(city='Paris', n=2)]", {"city": ["Paris"]})
    assert score == 0.0 and reason == "geo.distance: unknown arg 'n'"


def test_optional_args_marked_by_empty_string():
    gt = {"city": ["Paris"], "n": ["", 5]}
    assert check("[geo.distance(city='Paris')]", gt)[0] == 1.0
    assert check("[geo.distance(city='Paris', n=5)]", gt)[0] == 1.0
    assert check("[geo.distance(city='Paris', n=6)]", gt)[0] == 0.0
    # Without "" an expected arg must be given even if the schema calls it optional.
    assert check("[geo.distance(city='Paris')]", {"city": ["Paris"], "n": [5]}) == (
        0.0,
        "geo.distance: missing arg 'n'",
    )


def test_strings_compare_like_bfcl():
    gt = {"city": ["New York, NY"]}
    for ok in ("new york ny", "NEW-YORK/NY", "New_York.NY"):
        assert check(f"[geo.distance(city={ok!r})]", gt)[0] == 1.0, ok
    assert check("[geo.distance(city='Boston')]", gt)[0] == 0.0
    assert check('[geo.distance(city="it\'s")]', {"city": ['it"s']})[0] == 1.0


def test_types_int_for_float_but_never_bool_for_number():
    assert check("[geo.distance(city='x', km=5)]", {"city": ["x"], "km": [5.0]})[0] == 1.0
    assert check("[geo.distance(city='x', km=5.5)]", {"city": ["x"], "km": [5.0]})[0] == 0.0
    assert check("[geo.distance(city='x', n=True)]", {"city": ["x"], "n": [1]}) == (
        0.0,
        "geo.distance: wrong type for arg 'n': expected integer, got bool",
    )
    assert check("[geo.distance(city='x', n=3.0)]", {"city": ["x"], "n": [3]})[1] == (
        "geo.distance: wrong type for arg 'n': expected integer, got float"
    )
    assert check("[geo.distance(city='x', fast=1)]", {"city": ["x"], "fast": [True]})[0] == 0.0
    # BFCL writes a variable name as a string answer for a typed parameter.
    assert check("[geo.distance(city='x', n='count')]", {"city": ["x"], "n": ["count"]})[0] == 1.0


def test_lists_compare_element_wise_in_order():
    gt = {"city": ["x"], "stops": [["Lyon", "Nice"]]}
    assert check("[geo.distance(city='x', stops=['lyon', 'NICE'])]", gt)[0] == 1.0
    assert check("[geo.distance(city='x', stops=('Lyon', 'Nice'))]", gt)[0] == 1.0  # tuple
    assert check("[geo.distance(city='x', stops=['Nice', 'Lyon'])]", gt)[0] == 0.0
    assert check("[geo.distance(city='x', stops=['Lyon'])]", gt)[0] == 0.0


def test_dicts_match_key_by_key_with_their_own_allowed_values():
    gt = {"city": ["x"], "box": [{"w": [2, 3], "unit": ["", "cm"]}]}
    assert check("[geo.distance(city='x', box={'w': 3})]", gt)[0] == 1.0
    assert check("[geo.distance(city='x', box={'w': 2, 'unit': 'CM'})]", gt)[0] == 1.0
    score, reason = check("[geo.distance(city='x', box={'w': 2, 'h': 1})]", gt)
    assert score == 0.0 and "wrong value for arg 'box'" in reason
    assert reason.endswith("(unexpected key 'h')")
    assert check("[geo.distance(city='x', box={'unit': 'cm'})]", gt)[0] == 0.0  # w missing


def test_parallel_calls_match_in_any_order():
    gt = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}, {"g": {"y": ["a"]}}]
    # A greedy first-fit pairing would give f(x=1) to the first expected call and
    # strand the second; a one-to-one matching exists.
    assert check_tool_calls("[g(y='A'), f(x=1), f(x=2)]", gt).score == 1.0
    assert check_tool_calls("[f(x=2), f(x=2), g(y='a')]", gt).reason == (
        "expected call 1 matches no call: f: wrong value for arg 'x': 2 not in [1]"
    )
    assert check_tool_calls("[f(x=1), g(y='a')]", gt).reason == "expected 3 call(s), got 2"


def test_without_schema_required_args_come_from_ground_truth():
    gt = [{"f": {"a": [1], "b": ["", 2]}}]
    assert check_tool_calls("[f(a=1)]", gt).ok
    assert check_tool_calls("[f(b=2)]", gt).reason == "f: missing required arg 'a'"
    assert check_tool_calls("[f(a=True)]", gt).score == 0.0  # True is not 1


def test_malformed_output_is_a_zero_with_a_reason():
    cases = {
        "<tool_call>{not json}</tool_call>": "malformed tool call: tool call is not valid JSON",
        '<tool_call>{"name": "f", "arguments": {}}': "malformed tool call: tool call has no closing",
        "the answer is 4": "no tool call found",
        "[f(1, 2)]": "positional arguments",
        "[f(**kw)]": "**kwargs",
        "[f(a=1), 3]": "item 1 is not a function call",
    }
    for text, reason in cases.items():
        verdict = check_tool_calls(text, [{"f": {"a": [1]}}])
        assert verdict.score == 0.0 and reason in verdict.reason, (text, verdict.reason)


def test_python_syntax_is_never_evaluated(tmp_path: Path):
    marker = tmp_path / "pwned"
    text = f"[f(a=__import__('os').system('touch {marker}'))]"
    with pytest.raises(ToolCallSyntaxError, match="argument 'a' of 'f' is not a literal"):
        extract_tool_calls(text)
    assert check_tool_calls(text, [{"f": {"a": [0]}}]).score == 0.0
    assert not marker.exists()


def test_python_syntax_values():
    (call,) = extract_tool_calls("Sure: [a.b.c(x=-1.5, y=(1, [2, 3]), z={'k': None}, w=True)]")
    assert call.name == "a.b.c"
    assert call.arguments == {"x": -1.5, "y": [1, [2, 3]], "z": {"k": None}, "w": True}


def test_bad_ground_truth_raises_one_line():
    for bad, msg in (
        ({"f": {}}, "must be a list"),
        ([{"f": {}, "g": {}}], "exactly one function"),
        ([{"f": {"a": 1}}], "each arg needs a list"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_expected(bad)
    assert parse_expected(json.dumps([{"f": {"a": [1]}}])) == [("f", {"a": [1]})]


def _score(reward, task: Task, text: str):
    return asyncio.run(reward.score([RewardInput(task, "", text)]))[0]


def test_reward_component_from_config_scores_columns():
    cfg = config_from_dict(
        {
            "reward": {
                "filters": [],
                "components": [{"type": "tool_call_ast", "ground_truth_field": "gt"}],
            }
        }
    )
    reward = build_reward(cfg.reward)
    gt = json.dumps([{"f": {"a": [1]}}])
    task = Task("t", "q", columns={"gt": gt, "functions": FUNCS})
    good = _score(reward, task, '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert good.score == 1.0 and good.correct is True
    assert good.components == {"tool_call_ast": 1.0, "tool_call_ast/parses": 1.0}
    bad = _score(reward, task, "[f(a=2)]")
    assert bad.score == 0.0 and bad.correct is False
    assert bad.components["tool_call_ast/parses"] == 1.0
    unreadable = _score(reward, task, "no call")
    assert unreadable.components["tool_call_ast/parses"] == 0.0 and unreadable.error is None


def test_reward_reports_missing_ground_truth_as_error():
    result = _score(ToolCallASTReward(), Task("t9", "q"), "[f(a=1)]")
    assert result.score == 0.0 and "t9" in result.error and "'ground_truth'" in result.error


def test_reward_reports_a_bad_functions_column_as_error():
    task = Task("t8", "q", columns={"ground_truth": [{"f": {"a": [1]}}], "functions": "{}"})
    result = _score(ToolCallASTReward(), task, "[f(a=1)]")
    assert result.score == 0.0 and "'functions' is not a list of functions" in result.error
