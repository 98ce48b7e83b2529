"""Metric sinks. `JsonlSink` (one JSON object per line) is always on.

`FanOutSink` sends each record to the JSONL file and to the optional sinks of
`log.sinks` (TensorBoard, W&B, MLflow: `temper.monitor.external_sinks`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Protocol


class MetricSink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as null so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class JsonlSink:
    """Appends records to a file, flushing each line (a crash loses nothing written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a")  # noqa: SIM115 - kept open for the run's lifetime

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_jsonl_after_step(path: Path, step: int) -> None:
    """Drop records with `step > step` (used when resuming from a checkpoint).

    A last line cut short (the run was killed while writing it) is dropped too;
    a bad line anywhere else still raises.
    """
    lines = (
        [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )
    if lines:
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines.pop()
    kept = [r for r in map(json.loads, lines) if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


def numeric_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's int/float/bool values as floats, minus ``step``.

    Strings, None, lists and nested dicts are left out: TensorBoard, W&B and
    MLflow only chart numbers. NaN and Inf are kept (all three store them).
    """
    return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, int | float)}


class FanOutSink:
    """Writes each record to a primary sink and to any number of extra sinks.

    The primary (the run's ``metrics.jsonl``) is the record of truth: its
    errors propagate. An extra sink (TensorBoard, W&B, MLflow) that raises is
    reported once on stderr and dropped, so a dashboard outage cannot stop a
    training run.
    """

    def __init__(self, primary: MetricSink, extras: list[MetricSink] | None = None) -> None:
        self.primary = primary
        self.extras = list(extras or [])

    def write(self, record: dict[str, Any]) -> None:
        self.primary.write(record)
        self.write_extras(record)

    def write_extras(self, record: dict[str, Any]) -> None:
        """Write to the extra sinks only (e.g. eval results, which are not step metrics)."""
        for sink in list(self.extras):
            try:
                sink.write(record)
            except Exception as err:
                self._drop(sink, err)

    def close(self) -> None:
        self.primary.close()
        for sink in self.extras:
            try:
                sink.close()
            except Exception as err:
                self._drop(sink, err)

    def _drop(self, sink: MetricSink, err: Exception) -> None:
        print(
            f"temper: warning: metric sink {type(sink).__name__} failed and is now off: {err}",
            file=sys.stderr,
        )
        if sink in self.extras:
            self.extras.remove(sink)
