"""Gold-answer extraction helpers."""

from temper.rewards import (
    extract_boxed,
    extract_gsm8k_answer,
    find_last_boxed,
    normalize_gold_answer,
)


def test_extract_gsm8k_answer():
    assert extract_gsm8k_answer("She sells 9 eggs.\n#### 72") == "72"
    assert extract_gsm8k_answer("#### 1,450,000") == "1450000"
    assert extract_gsm8k_answer("#### -3") == "-3"
    assert extract_gsm8k_answer("no marker 72") is None
    assert extract_gsm8k_answer("####   ") is None


def test_extract_boxed_nested_and_last():
    assert extract_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{1} then \\boxed{ 2 }") == "2"
    assert extract_boxed("\\boxed{1} then \\boxed{unclosed") == "1"
    assert extract_boxed("nothing") is None
    text = "x \\boxed{a{b}c} y"
    assert find_last_boxed(text) == ("a{b}c", 2, 15)


def test_normalize_gold_answer():
    assert normalize_gold_answer("Work...\n#### 18") == "18"
    assert normalize_gold_answer("The answer is $\\boxed{\\sqrt{2}}$") == "\\sqrt{2}"
    assert normalize_gold_answer("  1/2 ") == "1/2"
