"""Metric sinks. `JsonlSink` (one JSON object per line) is always on."""

from __future__ import annotations

import json
import math
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
    """Drop records with `step > step` (used when resuming from a checkpoint)."""
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
