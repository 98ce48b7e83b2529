"""The live progress bar: step, reward, accuracy, tokens/s, ETA."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RunProgress:
    """A rich progress bar; disabled (no output) when `enabled` is False."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        stats = (
            f"reward {metrics.get('reward_mean', 0.0):.3f}  "
            f"acc {metrics.get('accuracy', 0.0):.3f}  "
            f"{metrics.get('gen_tokens_per_s', 0.0):.0f} tok/s"
        )
        self._progress.update(self._task, completed=step, stats=stats)

    def log(self, message: str) -> None:
        if self.enabled:
            self._progress.console.print(message)
