"""Training progress: step, reward, accuracy, tokens/s, ETA.

On a terminal this is a live rich progress bar. Under a pipe, `nohup` or a batch
scheduler (stderr is not a terminal) a redrawn bar is useless - the log would get
one final frame, wrapped at 80 columns - so it prints one plain line per step
instead, or one per `every_s` seconds when that is set (argument, else the
TEMPER_PROGRESS_EVERY_S environment variable). Plain lines are never wrapped.
"""

from __future__ import annotations

import os
import time
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

from temper.errors import ConfigError

EVERY_ENV = "TEMPER_PROGRESS_EVERY_S"


def _every_from_env() -> float:
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0.0:  # also rejects NaN
        raise ConfigError(f"{EVERY_ENV}={raw!r} must be a number of seconds >= 0")
    return value


def _clock(seconds: float) -> str:
    # Rounded, not floored: a difference of two large monotonic readings may fall a
    # hair short (109.99999999999818 for 110 s), which must still read 0:01:50.
    s = round(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def stats_text(metrics: dict[str, Any]) -> str:
    return (
        f"reward {metrics.get('reward_mean', 0.0):.3f}  "
        f"acc {metrics.get('accuracy', 0.0):.3f}  "
        f"{metrics.get('gen_tokens_per_s', 0.0):.0f} tok/s"
    )


class PlainProgress:
    """One unwrapped line per step (or per `every_s` seconds) on `stream`."""

    def __init__(self, total: int, start: int, every_s: float, stream: Any) -> None:
        self.total, self.start, self.every_s, self.stream = total, start, every_s, stream
        self._began = time.monotonic()
        self._last_print: float | None = None
        #: (step, time) of the first update: later ETAs leave out what came before it
        #: (model load, the first eval), which would make every estimate too long.
        self._first: tuple[int, float] | None = None

    def line(self, step: int, metrics: dict[str, Any], now: float) -> str:
        if self._first is None:
            self._first = (step, now)
        elapsed = now - self._began
        first_step, first_time = self._first
        if step > first_step:
            per_step = (now - first_time) / (step - first_step)
        else:
            per_step = elapsed / max(1, step - self.start)
        eta = per_step * (self.total - step)
        return (
            f"step {step}/{self.total}  {stats_text(metrics)}  "
            f"elapsed {_clock(elapsed)}  eta {_clock(eta)}"
        )

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        now = time.monotonic()
        due = self._last_print is None or now - self._last_print >= self.every_s
        if due or step >= self.total:
            self._last_print = now
            self.write(self.line(step, metrics, now))

    def write(self, message: str) -> None:
        print(message, file=self.stream, flush=True)


class RunProgress:
    """Live bar on a terminal, plain lines otherwise; no output when `enabled` is False."""

    def __init__(
        self,
        total: int,
        start: int = 0,
        enabled: bool = True,
        every_s: float | None = None,
        console: Console | None = None,
    ) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._plain: PlainProgress | None = None
        if not self.console.is_terminal:
            every = _every_from_env() if every_s is None else every_s
            self._plain = PlainProgress(total, start, every, self.console.file)
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled or self._plain is not None,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if self._plain is not None:
            if self.enabled:
                self._plain.update(step, metrics)
            return
        self._progress.update(self._task, completed=step, stats=stats_text(metrics))

    def log(self, message: str) -> None:
        if not self.enabled:
            return
        if self._plain is not None:
            self._plain.write(message)
        else:  # not markup: "[health] ..." is text, not a style tag
            self._progress.console.print(message, markup=False, highlight=False)
