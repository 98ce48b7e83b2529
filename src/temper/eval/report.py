"""Print eval results as a table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_eval_table(result: dict[str, Any]) -> None:
    metric_keys = [k for k, v in result.items() if isinstance(v, float)]
    table = Table(title=f"eval: {result.get('n_tasks')} tasks")
    table.add_column("category")
    for k in metric_keys:
        table.add_column(k, justify="right")
    table.add_row("all", *(f"{result[k]:.3f}" for k in metric_keys))
    for cat, vals in result.get("by_category", {}).items():
        table.add_row(cat, *(f"{vals[k]:.3f}" if k in vals else "-" for k in metric_keys))
    Console().print(table)
    too_long = result.get("n_prompt_too_long")
    if too_long:
        print(f"note: {too_long} prompt(s) did not fit the model's context and count as wrong")
