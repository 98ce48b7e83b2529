"""Reading run directories for the dashboard: safe names, JSONL tails, listings.

Everything here only reads. A run directory is being written while the
dashboard watches it, so a JSONL file is read as complete lines only: a line
the writer has not finished (no trailing newline yet) is left for the next
poll instead of being parsed half-way.
"""

from __future__ import annotations

import json
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.vision.store import ImageStore

# Files that make a folder under RUNS_DIR a run directory (see `orchestrator.run_dir`).
RUN_MARKERS = ("metrics.jsonl", "config.toml")
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl?$")


#: Level of an alert by its health-check action (`temper.monitor.health`).
_ACTION_LEVEL = {"stop": "error", "skip": "warning", "warn": "warning"}
#: Level of the other events the run loop writes, by kind.
_KIND_LEVEL = {
    "stopped_by_health_check": "error",
    "reward_errors": "warning",
    "reward_error": "warning",
    "episode_error": "warning",
    "resumed": "info",
    "time_budget_reached": "info",
    "profile": "info",
}
#: Levels that mark a run as failed.
FAILED_LEVELS = ("error", "critical")


def event_level(record: dict[str, Any]) -> str:
    """The record's own `level` (or `severity`), else one derived from its kind and action.

    Alerts carry the health check's action (stop: error; warn, skip: warning);
    a kind naming a failure or crash is an error; anything else is info.
    """
    own = record.get("level") or record.get("severity")
    if isinstance(own, str) and own:
        return own.lower()
    kind = str(record.get("kind") or "")
    if kind == "alert":
        return _ACTION_LEVEL.get(str(record.get("action")), "warning")
    if kind in _KIND_LEVEL:
        return _KIND_LEVEL[kind]
    if any(word in kind for word in ("fail", "crash", "exception")):
        return "error"
    return "info"


def with_levels(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Event records, each with its `level` filled in (copies; the cache is not changed)."""
    return [r if "level" in r else {**r, "level": event_level(r)} for r in records]


def run_status(run: Path, events: list[dict[str, Any]]) -> str:
    """failed (an error-level event), finished (report.html written at the end), or running.

    A process killed outright leaves neither: it shows as running, with a
    last update that stops moving (`updated`).
    """
    if any(event_level(e) in FAILED_LEVELS for e in events):
        return "failed"
    return "finished" if (run / "report.html").is_file() else "running"


class RunNameError(ValueError):
    """A run name that is not one plain directory name (HTTP 400)."""


class RunNotFoundError(LookupError):
    """A well-formed name with no run directory behind it (HTTP 404)."""


class ImageHashError(ValueError):
    """An image name that is not a SHA-256 in lowercase hex (HTTP 400)."""


class UnsafeFileError(ValueError):
    """A run file that is not a regular file inside its run directory, e.g. a symlink
    planted in ``images/`` pointing at /etc/passwd (HTTP 400)."""


#: Longest run name, in UTF-8 bytes: a folder name cannot be longer (NAME_MAX), and
#: a longer one would reach the file system only to fail there with a 500.
MAX_RUN_NAME_BYTES = 255


def _shown(text: str, limit: int = 60) -> str:
    """``text`` for an error message: quoted and cut, so a huge name gives a short line."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def check_image_hash(sha256: str) -> str:
    """Return `sha256` if it is 64 lowercase hex digits; raise ImageHashError otherwise.

    The image store names files by this hash alone, so a checked hash cannot
    name anything outside `<run>/images/`.
    """
    shown = repr(sha256[:80])
    if len(sha256) != 64:
        raise ImageHashError(
            f"image hash {shown} must be a SHA-256: 64 lowercase hex digits, "
            f"got {len(sha256)} characters"
        )
    bad = next((c for c in sha256 if c not in "0123456789abcdef"), None)
    if bad is not None:
        raise ImageHashError(
            f"image hash {shown} must be a SHA-256: 64 lowercase hex digits ({bad!r} is not one)"
        )
    return sha256


def check_run_name(name: str) -> str:
    """Return `name` if it is one plain folder name; raise RunNameError otherwise.

    Names come from URLs, so anything that could leave RUNS_DIR is refused
    before the file system is touched: separators (so absolute paths too),
    `.`/`..`, NUL and other control characters, hidden names and names longer
    than a folder name can be.
    """
    shown = _shown(name)
    if len(name.encode("utf-8", "surrogatepass")) > MAX_RUN_NAME_BYTES:
        raise RunNameError(f"run name {shown} is longer than {MAX_RUN_NAME_BYTES} bytes")
    if not name or name.strip() != name:
        raise RunNameError(f"run name {shown} is empty or has surrounding whitespace")
    if "/" in name or "\\" in name:
        raise RunNameError(f"run name {shown} must be a single directory name (no / or \\)")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise RunNameError(f"run name {shown} must not hold control characters (NUL, newline...)")
    if name.startswith("."):
        raise RunNameError(f"run name {shown} must not start with '.' ('..' would leave RUNS_DIR)")
    return name


@dataclass
class _Tail:
    """Parsed complete lines of one JSONL file and the byte offset read so far."""

    offset: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lines: int = 0


class JsonlTail:
    """Incremental reader of a growing JSONL file.

    Polls read only the bytes appended since the last read. If the file
    shrank (a resumed run truncates metrics past its checkpoint) everything is
    re-read and `generation` increases, so clients know to start over.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.generation = 0
        self._tail = _Tail()
        self._lock = threading.Lock()

    def read(self) -> tuple[list[dict[str, Any]], list[str], int]:
        """(all records so far, parse errors, generation)."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size < self._tail.offset:
                self._tail = _Tail()
                self.generation += 1
            if size > self._tail.offset:
                self._read_more()
            return self._tail.records, self._tail.errors, self.generation

    def _read_more(self) -> None:
        tail = self._tail
        with open(self.path, "rb") as f:
            f.seek(tail.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n")
        if end < 0:
            return  # no complete line yet
        for raw in chunk[: end + 1].splitlines():
            tail.lines += 1
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                tail.errors.append(f"{self.path.name} line {tail.lines}: not JSON ({exc})")
                continue
            if isinstance(record, dict):
                tail.records.append(record)
            else:
                tail.errors.append(f"{self.path.name} line {tail.lines}: not a JSON object")
        tail.offset += end + 1


class RunsRoot:
    """The folder of run directories the dashboard serves (`temper dash RUNS_DIR`)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self._tails: dict[Path, JsonlTail] = {}
        self._lock = threading.Lock()

    def run_path(self, name: str) -> Path:
        """The run directory for `name`; RunNameError / RunNotFoundError when there is none."""
        # One checked component under the root: the path cannot leave RUNS_DIR (a
        # symlinked run directory is followed: putting it there was the user's choice).
        path = self.root / check_run_name(name)
        if not path.is_dir() or not is_run_dir(path):
            raise RunNotFoundError(f"no run named {name!r} in {self.root}")
        return path

    def list_runs(self) -> list[dict[str, Any]]:
        """Summaries of every run directory directly under the root, by name."""
        if not self.root.is_dir():
            return []
        runs = []
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or not path.is_dir() or not is_run_dir(path):
                continue
            records, _, _ = self.tail(path / "metrics.jsonl").read()
            events, _, _ = self.tail(path / "events.jsonl").read()
            last = records[-1] if records else {}
            runs.append(
                {
                    "name": path.name,
                    "steps": len(records),
                    "last_step": last.get("step"),
                    "events": len(events),
                    "status": run_status(path, events),
                    "updated": _mtime(path / "metrics.jsonl"),
                }
            )
        return runs

    def tail(self, path: Path) -> JsonlTail:
        """The shared incremental reader of one JSONL file (one per file, reused by all polls)."""
        with self._lock:
            if path not in self._tails:
                self._tails[path] = JsonlTail(path)
            return self._tails[path]

    def records_since(self, name: str, file: str, since: int) -> dict[str, Any]:
        """Records of `file` from index `since` on, with `next` (pass it as `since` next time).

        `since` counts records, not bytes. `reset` is true when the file was
        truncated after the client's last read: the client should drop what it
        has and use the returned records from index 0.
        """
        path = self.run_path(name) / file
        records, errors, generation = self.tail(path).read()
        reset = since > len(records)
        start = 0 if reset else max(since, 0)
        return {
            "run": name,
            "since": start,
            "next": len(records),
            "reset": reset,
            "generation": generation,
            "records": records[start:],
            "errors": errors,
        }

    def summary(self, name: str) -> dict[str, Any]:
        """What a run holds: metric names, step count, trajectory steps, evals, events."""
        path = self.run_path(name)
        records, errors, _ = self.tail(path / "metrics.jsonl").read()
        events, _, _ = self.tail(path / "events.jsonl").read()
        keys = sorted(
            {k for r in records for k, v in r.items() if _is_number(v) or v is None} - {"step"}
        )
        return {
            "name": name,
            "steps": len(records),
            "last_step": records[-1].get("step") if records else None,
            "metrics": keys,
            "events": len(events),
            # File names only: the page asks for this every poll, line counts are in steps().
            "trajectory_steps": [s for s, _ in _step_files(path / "trajectories", ".jsonl")],
            "eval_steps": [e["step"] for e in self.evals(name)],
            "errors": errors,
        }

    def steps(self, name: str) -> list[dict[str, Any]]:
        """Steps with saved trajectories: [{step, samples}], by step."""
        folder = self.run_path(name) / "trajectories"
        out = []
        for step, path in _step_files(folder, ".jsonl"):
            with open(path, "rb") as f:
                samples = sum(1 for line in f if line.strip())
            out.append({"step": step, "samples": samples})
        return out

    def trajectory_file(self, name: str, step: int) -> Path:
        """The trajectories file of one step; RunNotFoundError when that step has none."""
        folder = self.run_path(name) / "trajectories"
        for s, path in _step_files(folder, ".jsonl"):
            if s == step:
                return path
        raise RunNotFoundError(f"run {name!r} has no trajectories for step {step}")

    def image_file(self, name: str, sha256: str) -> Path:
        """The stored PNG of one image of the run (`temper.vision.ImageStore` layout);
        ImageHashError for a malformed hash, RunNotFoundError when the run lacks it."""
        run = self.run_path(name)
        path = ImageStore(run / "images").path(check_image_hash(sha256))
        if not path.is_file():
            raise RunNotFoundError(f"run {name!r} has no image {sha256}")
        return regular_file_inside(path, run)

    def evals(self, name: str) -> list[dict[str, Any]]:
        """The run's held-out evaluations (`eval/step_N.json`), by step."""
        folder = self.run_path(name) / "eval"
        out = []
        for step, path in _step_files(folder, ".json"):
            try:
                result = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # being written right now; the next poll gets it
            if isinstance(result, dict):
                out.append({**result, "step": result.get("step", step)})
        return out


def regular_file_inside(path: Path, folder: Path) -> Path:
    """``path`` with its symlinks resolved, if that is a regular file inside ``folder``;
    UnsafeFileError otherwise. Served files come from here: a symlink planted in a
    run must not hand out what it points at, nor a FIFO hang the request."""
    try:
        real = path.resolve()
        info = real.stat()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
        raise UnsafeFileError(f"{path.name} cannot be read") from None
    if not real.is_relative_to(folder.resolve()) or not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"{path.name} is not a regular file inside its run directory")
    return real


def is_run_dir(path: Path) -> bool:
    return any((path / marker).is_file() for marker in RUN_MARKERS)


def _step_files(folder: Path, suffix: str) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _STEP_FILE.match(path.name)
        if match and path.suffix == suffix and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
