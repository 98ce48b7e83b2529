"""The eval table keeps whole headers off a terminal and on a narrow one."""

import io

from rich.console import Console

from temper.eval.report import print_eval_table

RESULT = {
    "n_tasks": 8,
    "accuracy": 0.5,
    "mean_response_tokens": 7.625,
    "pass@1": 0.625,
    "pass@4": 0.75,
    "mean@4": 0.625,
    "maj@4": 0.625,
    "by_category": {"level1": {"accuracy": 1.0, "pass@1": 1.0}},
}
HEADERS = ["category", "accuracy", "mean_response_tokens", "pass@1", "pass@4", "mean@4", "maj@4"]


def test_piped_eval_table_has_whole_headers_on_one_line():
    out = io.StringIO()
    print_eval_table(RESULT, Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert lines[0] == "eval: 8 tasks"
    assert lines[1].split() == HEADERS
    assert lines[2].split() == ["all", "0.500", "7.625", "0.625", "0.750", "0.625", "0.625"]
    assert lines[3].split() == ["level1", "1.000", "-", "1.000", "-", "-", "-"]


def test_narrow_terminal_falls_back_to_plain_columns():
    out = io.StringIO()
    print_eval_table(RESULT, Console(file=out, width=40, force_terminal=True))
    assert out.getvalue().splitlines()[1].split() == HEADERS


def test_wide_terminal_gets_a_rich_table_with_whole_headers():
    out = io.StringIO()
    print_eval_table(RESULT, Console(file=out, width=200, force_terminal=True, color_system=None))
    text = out.getvalue()
    assert "┃" in text or "│" in text
    assert all(h in text for h in HEADERS)
