"""BFCL (Berkeley Function Calling Leaderboard) AST categories as Temper tasks and an env.

The data ships inside the `bfcl-eval` wheel on PyPI. `ensure_bfcl_data`
downloads that wheel with pip (``--no-deps``: nothing is installed) and
unpacks only its ``bfcl_eval/data`` JSON files into a cache directory, once.
BFCL's own code is not used: calls are scored by
`temper.rewards.tool_call_ast`.

Four single-turn Python categories are supported: ``simple`` (one function,
one call), ``multiple`` (several functions, one call), ``parallel`` (one
function, several calls) and ``parallel_multiple``. Each task's prompt is the
BFCL question; its functions become OpenAI-format tools for the chat
template; its ``ground_truth`` and ``functions`` columns drive the checker.
Live, multi-turn, irrelevance and agentic categories are not supported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.errors import DataError
from temper.records import Task
from temper.rewards.tool_call_ast import (
    ToolCallSyntaxError,
    extract_tool_calls,
    match_calls,
    parse_expected,
)

#: The pinned bfcl-eval release: the eval's data must not change under a run.
BFCL_VERSION = "2026.3.23"
#: Category -> file stem (BFCL_v4_<stem>.json, and the same under possible_answer/).
CATEGORIES: dict[str, str] = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
}
_PREFIX = "BFCL_v4_"


def cache_root() -> Path:
    """``$TEMPER_CACHE_DIR``, else ``$XDG_CACHE_HOME/temper``, else ``~/.cache/temper``."""
    if os.environ.get("TEMPER_CACHE_DIR"):
        return Path(os.environ["TEMPER_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "temper"


def has_bfcl_data(path: Path) -> bool:
    """Whether `path` holds the question and possible-answer files of the four categories."""
    return all(
        (path / f"{_PREFIX}{stem}.json").is_file()
        and (path / "possible_answer" / f"{_PREFIX}{stem}.json").is_file()
        for stem in CATEGORIES.values()
    )


def _download_wheel(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", f"bfcl-eval=={version}", "--no-deps"]
    cmd += ["--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = sorted(dest.glob("bfcl_eval-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel was written"])[-1]
        raise DataError(f"cannot download bfcl-eval=={version} from PyPI: {last}")
    return wheels[0]


def unpack_wheel(wheel: Path, dest: Path) -> None:
    """Extract the wheel's ``bfcl_eval/data`` JSON files (and its METADATA) into `dest`."""
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            parts = member.split("/")
            if parts[0].endswith(".dist-info") and parts[-1] == "METADATA":
                target = dest / "METADATA"
            elif parts[:2] == ["bfcl_eval", "data"] and len(parts) in (3, 4):
                if len(parts) == 4 and parts[2] != "possible_answer":
                    continue
                if not parts[-1].endswith((".json", ".md")):
                    continue
                target = dest.joinpath(*parts[2:])
            else:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member))


def ensure_bfcl_data(version: str = BFCL_VERSION, root: Path | None = None) -> Path:
    """The directory holding BFCL's data files, downloading them on first use.

    Looks in ``<root or cache_root()>/bfcl/<version>/``; when the files are
    missing, downloads the bfcl-eval wheel with pip (no dependencies, nothing
    installed) and unpacks its data there (atomically: a half-done unpack is
    never used). Raises `DataError` when the download fails.
    """
    final = (root or cache_root()) / "bfcl" / version
    if has_bfcl_data(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".tmp-") as tmp:
        staging = Path(tmp) / "data"
        unpack_wheel(_download_wheel(version, Path(tmp)), staging)
        if not has_bfcl_data(staging):
            raise DataError(
                f"bfcl-eval=={version} does not hold the expected {_PREFIX}*.json files"
            )
        if final.exists() and not has_bfcl_data(final):  # an incomplete earlier copy
            shutil.rmtree(final)
        try:
            os.replace(staging, final)
        except OSError:
            if not has_bfcl_data(final):  # else another process unpacked it first
                raise
    return final


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"BFCL data file {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path} line {number} is not valid JSON: {exc.msg}") from None
    return rows


_TYPE_NAMES = {"dict": "object", "float": "number", "tuple": "array"}


def openai_schema(schema: Any) -> Any:
    """A BFCL parameter schema in JSON-schema words ("dict" -> "object", "float" ->
    "number", "tuple" -> "array"; "any" drops the type)."""
    if isinstance(schema, list):
        return [openai_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: openai_schema(v) for k, v in schema.items() if k != "type"}
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "any":
        out["type"] = _TYPE_NAMES.get(kind, kind)
    if "properties" in schema:  # property names are names, not schemas
        out["properties"] = {k: openai_schema(v) for k, v in schema["properties"].items()}
    return out


def bfcl_tools(functions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs as OpenAI-format tools for the chat template."""
    return [
        {
            "type": "function",
            "function": {
                "name": fn["name"],
                "description": fn.get("description", ""),
                "parameters": openai_schema(fn.get("parameters", {})),
            },
        }
        for fn in functions
    ]


def load_bfcl_tasks(data_dir: Path, categories: Sequence[str] = tuple(CATEGORIES)) -> list[Task]:
    """BFCL tasks of `categories`, interleaved (one of each category in turn).

    Interleaving keeps a prefix (``eval.size``) spread over every category.
    Columns: ``ground_truth`` (BFCL possible answers), ``functions`` (BFCL
    docs), ``tools`` (OpenAI format). Raises `DataError` for a missing file,
    an unknown category, or a question without its answer.
    """
    per_cat: list[list[Task]] = []
    for cat in categories:
        if cat not in CATEGORIES:
            raise DataError(f"unknown BFCL category {cat!r}; choose from {', '.join(CATEGORIES)}")
        name = f"{_PREFIX}{CATEGORIES[cat]}.json"
        answers = {
            r["id"]: r["ground_truth"] for r in _read_jsonl(data_dir / "possible_answer" / name)
        }
        tasks = []
        for row in _read_jsonl(data_dir / name):
            if row["id"] not in answers:
                raise DataError(f"{data_dir / name}: {row['id']} has no possible answer")
            columns = {
                "ground_truth": answers[row["id"]],
                "functions": row["function"],
                "tools": bfcl_tools(row["function"]),
            }
            tasks.append(Task(row["id"], row["question"][0], None, cat, columns))
        per_cat.append(tasks)
    longest = max((len(t) for t in per_cat), default=0)
    return [tasks[i] for i in range(longest) for tasks in per_cat if i < len(tasks)]


def gold_calls(
    task: Task, omit_optional: bool = False, pick: int = 0
) -> list[tuple[str, dict[str, Any]]]:
    """Calls that should score 1.0: the task's ground truth with concrete values.

    Each argument takes its allowed value number `pick` (0: the first, -1: the
    last; nested dicts always take their first). Arguments whose allowed values
    include ``""`` are left out when `omit_optional` is set (unless the schema
    requires them), and always when the function's schema does not know them.
    """
    params = {fn["name"]: fn.get("parameters", {}) for fn in task.columns["functions"]}
    calls = []
    for name, allowed in parse_expected(task.columns["ground_truth"]):
        schema = params.get(name, {})
        props, required = schema.get("properties", {}), schema.get("required", [])
        args = {}
        for arg, alts in allowed.items():
            values = [a for a in alts if a != ""]
            optional = "" in alts and arg not in required
            if values and arg in props and not (omit_optional and optional):
                args[arg] = _first_value(values[pick])
        calls.append((name, args))
    return calls


def render_calls(calls: Sequence[tuple[str, dict[str, Any]]], style: str = "python") -> str:
    """Calls as model output: ``[f(a=1)]`` ("python") or ``<tool_call>`` JSON blocks ("hermes")."""
    if style == "hermes":
        return "\n".join(
            f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls
        )
    rendered = (f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls)
    return "[" + ", ".join(rendered) + "]"


def _first_value(allowed: Any) -> Any:
    """A concrete value from an allowed value: nested ``{key: [alts]}`` dicts resolved."""
    if isinstance(allowed, dict):
        out = {}
        for key, alts in allowed.items():
            values = [a for a in alts if a != ""] if isinstance(alts, list) else [alts]
            if values:
                out[key] = _first_value(values[0])
        return out
    if isinstance(allowed, list):
        return [_first_value(a) for a in allowed]
    return allowed


class BFCLEnv:
    """One BFCL question: the user turn with the task's tools; the first reply is scored.

    The reply's tool calls (Hermes blocks or Python call syntax) are matched
    against the ground truth; reward 1.0 or 0.0, ``info["success"]`` and
    ``info["reason"]`` (why it failed). The episode always ends after one turn;
    no tool is ever executed.
    """

    def __init__(self, task: Task) -> None:
        self.task = task

    @property
    def tools(self) -> list[dict[str, Any]]:
        return list(self.task.columns["tools"])

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        self.task = task
        return task.messages()

    async def step(self, turn: AssistantTurn) -> StepResult:
        expected = parse_expected(self.task.columns["ground_truth"])
        try:
            calls = extract_tool_calls(turn.text)
        except ToolCallSyntaxError as exc:
            return StepResult([], 0.0, True, {"success": False, "reason": str(exc)})
        verdict = match_calls(calls, expected, self.task.columns["functions"])
        return StepResult(
            [], verdict.score, True, {"success": verdict.ok, "reason": verdict.reason}
        )

    async def close(self) -> None:
        return None


def bfcl_spec(tasks: list[Task]) -> EnvSpec:
    """An `EnvSpec` whose held-out tasks are `tasks`, played in `BFCLEnv`s (eval only)."""
    return EnvSpec(make_env=BFCLEnv, train=None, heldout=tasks, name="bfcl")
