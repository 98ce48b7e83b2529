"""Parsing browser actions from model text: every input is an Action or a one-line ActionError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from temper.envs.browser_actions import Action, ActionError, parse_action


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
    import json

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
