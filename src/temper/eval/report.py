"""Print eval results as a table.

On a terminal wide enough for it, a rich table. Otherwise (a pipe, a log file, a
narrow terminal) plain aligned columns that are never squeezed: rich fits a table
to the console width (80 columns off a terminal) by folding its headers, which
cut `mean@4_ci95` into pieces in every batch log.

The columns are the metrics only: settings (the sampling ``temperature``, ``k``,
``time_s``) go in the title, which says which rows are greedy (temperature 0)
and which sampled, and a note says when correctness is the default rule.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from temper.eval.harness import CORRECT_RULES, SETTINGS


def eval_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The header and the rows (`all`, then each category) as text."""
    metric_keys = [k for k, v in result.items() if isinstance(v, float) and k not in SETTINGS]
    rows = [["all", *(f"{result[k]:.3f}" for k in metric_keys)]]
    for cat, vals in result.get("by_category", {}).items():
        rows.append([cat, *(f"{vals[k]:.3f}" if k in vals else "-" for k in metric_keys)])
    return ["category", *metric_keys], rows


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    """Aligned columns, as wide as their widest cell: first left, the rest right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    return "\n".join(fmt(r) for r in [header, *rows])


def eval_title(result: dict[str, Any]) -> str:
    """``eval: N tasks``, and at what temperature each kind of column was sampled."""
    parts = [f"eval: {result.get('n_tasks')} tasks"]
    if "accuracy" in result:
        parts.append("accuracy, reward_mean: greedy (temperature 0)")
    k, temperature = result.get("k"), result.get("temperature")
    if k is not None and temperature is not None and f"mean@{k}" in result:
        parts.append(f"pass@j, mean@{k}, maj@{k}, reward_mean@{k}: {k} samples at "
                     f"temperature {temperature:g}")  # fmt: skip
    return "; ".join(parts)


def correct_note(result: dict[str, Any]) -> str | None:
    """The line saying correctness is the default rule (no reward declares one), or None."""
    if result.get("correct_rule") == CORRECT_RULES["default"]:
        return f"note: correct means {CORRECT_RULES['default']}"
    return None


def print_eval_table(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    header, rows = eval_rows(result)
    title = eval_title(result)
    text = plain_table(header, rows)
    # A rich table adds borders and padding: about 3 columns per cell.
    rich_width = max(len(line) for line in text.splitlines()) + 3 * len(header) + 1
    if console.is_terminal and rich_width <= console.width:
        table = Table(title=title)
        table.add_column("category", no_wrap=True)
        for k in header[1:]:
            table.add_column(k, justify="right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:
        print(title, file=console.file)
        print(text, file=console.file, flush=True)
    too_long = result.get("n_prompt_too_long")
    if too_long:
        msg = f"note: {too_long} prompt(s) did not fit the model's context and count as wrong"
        print(msg, file=console.file)
    note = correct_note(result)
    if note:
        print(note, file=console.file)
