"""Parsing browser actions from model text: every input is an Action or a one-line ActionError."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from temper.envs.browser_actions import MAX_SCAN, MAX_TEXT, Action, ActionError, parse_action


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ('{"action": "click", "ref": 12}', Action("click", ref=12)),
        ('{"action": "click", "ref": "7"}', Action("click", ref=7)),
        ('I will click it.\n```json\n{"action": "click", "ref": -2}\n```', Action("click", ref=-2)),
        ('{"action": "click_xy", "x": 40, "y": 95.5}', Action("click_xy", x=40.0, y=95.5)),
        ('{"action": "type", "text": "hi"}', Action("type", text="hi")),
        ('{"action": "type", "ref": 3, "text": ""}', Action("type", ref=3, text="")),
        ('{"action": "key", "key": "Control+A"}', Action("key", key="Control+A")),
        ('{"action": "scroll", "dy": -100}', Action("scroll", dy=-100.0)),
        ('ok {"action": "done"} bye', Action("done")),
    ],
)
def test_well_formed_actions(text: str, action: Action) -> None:
    assert parse_action(text) == action


def test_boxed_click_is_opt_in() -> None:
    assert parse_action("so the answer is \\boxed{4}", boxed_click=True) == Action("click", ref=4)
    with pytest.raises(ActionError) as err:
        parse_action("so the answer is \\boxed{4}")
    assert err.value.kind == "bad_json"
    with pytest.raises(ActionError):
        parse_action("\\boxed{four}", boxed_click=True)
    # JSON wins over a box when both are there.
    both = '\\boxed{4} {"action": "click", "ref": 9}'
    assert parse_action(both, boxed_click=True) == Action("click", ref=9)


@given(st.text(max_size=300))
def test_any_text_is_an_action_or_one_line_error(text: str) -> None:
    try:
        action = parse_action(text, boxed_click=True)
    except ActionError as exc:
        assert exc.kind in {"no_json", "bad_json", "bad_action", "bad_args"}
        assert "\n" not in str(exc)
    else:
        assert action.kind in {"click", "click_xy", "type", "key", "scroll", "done"}


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=20,
    )
)
def test_any_json_value_under_action_is_handled(value: object) -> None:
    for key in ("action", "ref", "text", "x"):
        text = json.dumps({"action": "click", key: value}, allow_nan=True)
        try:
            parse_action(text)
        except ActionError as exc:
            assert "\n" not in str(exc)


def test_the_outer_object_is_the_action() -> None:
    with pytest.raises(ActionError) as err:
        parse_action('Here: {"action": "click", "ref": {"id": 3}} and more text')
    assert err.value.kind == "bad_args" and '"ref"' in str(err.value)


def test_the_last_well_formed_action_is_performed() -> None:
    click = '{{"action": "click", "ref": {}}}'.format
    assert parse_action(f"first {click(1)} then {click(2)}") == Action("click", ref=2)
    # A malformed last action does not hide a well-formed one before it.
    assert parse_action(f'{click(1)} {{"action": "click"}}') == Action("click", ref=1)
    fenced = f"```json\n{click(1)}\n```\nno, rather {click(2)}"
    assert parse_action(fenced) == Action("click", ref=2)
    # None well-formed: the error is the last object's.
    with pytest.raises(ActionError) as err:
        parse_action('{"action": "click"} {"action": "drag"}')
    assert err.value.kind == "bad_action" and "drag" in str(err.value)
    # A stray '{"' left open in the prose does not hide the action after it.
    assert parse_action(f'I wrote {{"act, oops. {click(3)}') == Action("click", ref=3)
    assert parse_action('{"action": "type", "text": "}{\\"{"}') == Action("type", text='}{"{')


def test_element_numbers_are_ascii_integers() -> None:
    for ref in ("--5", "²", "1" * 20):
        with pytest.raises(ActionError) as err:
            parse_action(f'{{"action": "click", "ref": "{ref}"}}')
        assert err.value.kind == "bad_args"
    with pytest.raises(ActionError):
        parse_action("\\boxed{--5}", boxed_click=True)
    assert parse_action("\\boxed{ 12 }", boxed_click=True) == Action("click", ref=12)


def _actions(n: int) -> str:
    return "\n".join(json.dumps({"action": "click", "ref": i}) for i in range(1, n + 1))


SLOW_BEFORE = [  # inputs that took seconds (or gigabytes) before the parser was linear
    pytest.param("```" + "\n" * 16_000, "no_json", id="fence-16k-newlines"),
    pytest.param("{" * 10_000_000, "bad_json", id="10MB-of-braces"),
    # Each unclosed box was scanned to the end of the text.
    pytest.param("\\boxed{" * 1_000_000, "bad_json", id="1M-unclosed-boxes"),
    # Every "{" opens an object and every quote misleads: the most passes.
    pytest.param('{\n"' * 3_000_000, "bad_json", id="3M-open-objects"),
    pytest.param(
        json.dumps({"action": "type", "text": "x" * MAX_TEXT}),
        Action("type", text="x" * MAX_TEXT),
        id="type-500-chars",
    ),
    pytest.param(_actions(1000), Action("click", ref=1000), id="1000-actions-the-last"),
]


@pytest.mark.parametrize(("text", "expected"), SLOW_BEFORE)
def test_pathological_turns_parse_in_linear_time(text: str, expected: object) -> None:
    # CPU time of this thread, not wall time: a loaded machine does not slow it much.
    start = time.thread_time()
    assert _parse(text) == expected
    elapsed = time.thread_time() - start
    assert elapsed < 0.1, f"{elapsed:.3f} s"  # the slowest case takes about 25 ms
    tracemalloc.start()  # a second run, as tracing slows the first one's clock
    try:
        _parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB"


def _parse(text: str) -> object:
    """The action, or the error's kind."""
    try:
        return parse_action(text, boxed_click=True)
    except ActionError as exc:
        return exc.kind


def test_only_the_end_of_a_long_turn_is_read() -> None:
    action = '{"action": "done"}'
    assert parse_action("x" * 10 * MAX_SCAN + action) == Action("done")
    with pytest.raises(ActionError) as err:  # the action is outside the window
        parse_action(action + "x" * MAX_SCAN)
    assert err.value.kind == "no_json"
