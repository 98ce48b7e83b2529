"""The eval table keeps whole headers off a terminal and on a narrow one, and says at
which temperature each column was sampled."""

import io
import json

from rich.console import Console

from temper.eval.report import print_eval_table

RESULT = {
    "n_tasks": 8,
    "k": 4,
    "temperature": 1.0,
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
    assert lines[0] == (
        "eval: 8 tasks; accuracy, reward_mean: greedy (temperature 0); "
        "pass@j, mean@4, maj@4, reward_mean@4: 4 samples at temperature 1"
    )
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


def test_the_greedy_row_is_not_labelled_with_the_sampling_temperature():
    """The sampled rows' temperature is a setting, not a column beside greedy accuracy."""
    out = io.StringIO()
    result = {**RESULT, "temperature": 0.7, "time_s": 3.25}
    print_eval_table(result, Console(file=out, width=80))
    title, header, row = out.getvalue().splitlines()[:3]
    assert "temperature" not in header and "time_s" not in header
    assert header.split() == HEADERS and row.split()[1] == "0.500"  # accuracy, not 0.700
    assert "accuracy, reward_mean: greedy (temperature 0)" in title
    assert "4 samples at temperature 0.7" in title


def test_the_run_report_labels_greedy_and_sampled_evals(tmp_path):
    from temper.monitor.report import write_report

    (tmp_path / "eval").mkdir()
    for step in (0, 2):
        e = {**RESULT, "step": step, "temperature": 0.7, "time_s": 1.5}
        (tmp_path / "eval" / f"step_{step:06d}.json").write_text(json.dumps(e))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    page = write_report(tmp_path).read_text()
    table = page.split("<h2>Evaluation (held-out)</h2>")[1].split("<h2>")[0]
    assert "<th>temperature</th>" not in table and "<th>time_s</th>" not in table
    assert "accuracy, reward_mean: greedy (temperature 0)" in table
    assert "4 samples at temperature 0.7" in table
