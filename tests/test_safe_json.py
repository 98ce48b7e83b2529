"""`temper.safe_json.loads`: any input gives a value or a one-line JSONInputError."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from temper.safe_json import MAX_DEPTH, JSONInputError, check_value, loads


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000, "nested deeper than 64"),
        ("[" * 65 + "]" * 65, "nested deeper than 64"),
        ('{"a": ' * 70 + "1" + "}" * 70, "nested deeper than 64"),
        ("9" * 5000, "more than 4300 digits"),
        ("[NaN]", "NaN is not valid JSON"),
        ('{"x": -Infinity}', "-Infinity is not valid JSON"),
        ("1e999", "out of range"),
        ('{"a": ["\\ud800"]}', "a[0] holds a lone UTF-16 surrogate (\\ud800)"),
        ('{"\\udfff": 1}', "a key of the value holds a lone UTF-16 surrogate"),
        (b'"\xed\xa0\x80"', "not valid UTF-8 (byte 0xed at position 1)"),
        (b"\xff", "not valid UTF-8"),
        ("{", "not valid JSON (Expecting property name"),
        ("", "not valid JSON"),
    ],
)
def test_hostile_json_is_one_line_error(text, words):
    with pytest.raises(JSONInputError) as info:
        loads(text)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_what_is_fine_passes():
    assert loads('{"a": [1, 2.5, "\\ud83d\\ude00", null, true]}') == {
        "a": [1, 2.5, "\U0001f600", None, True]
    }
    assert loads(b"\xef\xbb\xbf[1]") == [1]  # a UTF-8 BOM is allowed
    assert loads("[" * 64 + "]" * 64) is not None
    assert loads("9" * 4000) == int("9" * 4000)


def test_check_value_can_allow_non_finite_floats():
    check_value({"x": float("inf")}, finite=False)
    with pytest.raises(JSONInputError, match="out of range"):
        check_value({"x": float("nan")})


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_values)
def test_property_round_trip_or_refusal(value):
    text = json.dumps(value, ensure_ascii=False)  # raw surrogates and NaN included
    try:
        got = loads(text.encode("utf-8", "surrogatepass"))
    except JSONInputError as exc:
        assert "\n" not in str(exc)
        assert "NaN" in text or "Infinity" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    else:
        assert json.dumps(got, sort_keys=True) == json.dumps(value, sort_keys=True)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=100) | st.text(max_size=100))
def test_property_any_input_gives_a_value_or_the_error(raw):
    try:
        check_value(loads(raw), MAX_DEPTH)
    except JSONInputError as exc:
        assert "\n" not in str(exc)
