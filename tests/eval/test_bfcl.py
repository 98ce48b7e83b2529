"""BFCL on the real data: every ground truth scores 1.0, perturbed ones 0.0, and the suite runs.

The data comes from the bfcl-eval wheel on PyPI, downloaded and unpacked once
into the user cache (`ensure_bfcl_data`); later runs reuse it.
"""

from __future__ import annotations

import asyncio
import json
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from scripted_engine import ScriptedEngine
from temper.builder.model import load_run_model
from temper.builder.suites import build_suite
from temper.cli.main import main
from temper.config import config_from_dict
from temper.envs.base import AssistantTurn
from temper.errors import DataError
from temper.eval.bfcl import (
    CATEGORIES,
    BFCLEnv,
    bfcl_tools,
    ensure_bfcl_data,
    gold_calls,
    has_bfcl_data,
    load_bfcl_tasks,
    render_calls,
    unpack_wheel,
)
from temper.eval.harness import evaluate
from temper.eval.suites import SuitePlan
from temper.models import load_tokenizer, resolve_model_path
from temper.records import Task
from temper.rewards.tool_call_ast import check_tool_calls


@pytest.fixture(scope="session")
def bfcl_dir() -> Path:
    return ensure_bfcl_data()


@pytest.fixture(scope="session")
def bfcl_tasks(bfcl_dir: Path) -> list[Task]:
    return load_bfcl_tasks(bfcl_dir)


def _score(task: Task, text: str):
    return check_tool_calls(text, task.columns["ground_truth"], task.columns["functions"])


def test_data_has_the_four_categories_interleaved(bfcl_tasks):
    counts = Counter(t.category for t in bfcl_tasks)
    assert counts == {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200}
    assert [t.category for t in bfcl_tasks[:4]] == list(CATEGORIES)
    assert len({t.id for t in bfcl_tasks}) == 1000


@pytest.mark.parametrize(
    ("style", "omit_optional", "pick"),
    [("python", False, 0), ("python", True, -1), ("hermes", False, -1), ("hermes", True, 0)],
)
def test_every_ground_truth_scores_one(bfcl_tasks, style, omit_optional, pick):
    failures = []
    for task in bfcl_tasks:
        verdict = _score(task, render_calls(gold_calls(task, omit_optional, pick), style))
        if not verdict.ok:
            failures.append(f"{task.id}: {verdict.reason}")
    assert not failures, failures[:5]


def _perturb(value: Any, allowed: list[Any]) -> Any:
    """A value of the same kind that is none of `allowed`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return max(a for a in allowed if isinstance(a, int | float)) + 1001
    if isinstance(value, str):
        return value + " zzz"
    if isinstance(value, list):
        return [*value, value[0] if value else "zzz"]
    if isinstance(value, dict):
        return {**value, "zzz_unexpected": 1}
    return "zzz"


def test_a_perturbed_value_scores_zero(bfcl_tasks):
    perturbed = 0
    for task in bfcl_tasks:
        calls = gold_calls(task)
        name, args = calls[0]
        if not args:
            continue
        arg = next(iter(args))
        allowed = task.columns["ground_truth"][0][name][arg]
        calls[0] = (name, {**args, arg: _perturb(args[arg], allowed)})
        verdict = _score(task, render_calls(calls))
        assert verdict.score == 0.0, (task.id, arg)
        assert f"arg {arg!r}" in verdict.reason, verdict.reason
        perturbed += 1
    assert perturbed == 1000


def test_dropping_or_adding_a_parallel_call_scores_zero(bfcl_tasks):
    for task in [t for t in bfcl_tasks if t.category.startswith("parallel")][:50]:
        calls = gold_calls(task)
        assert _score(task, render_calls(calls[:-1])).reason.startswith("expected ")
        assert _score(task, render_calls([*calls, calls[0]])).score == 0.0
        assert _score(task, render_calls(calls[::-1])).ok  # any order


def test_tools_use_json_schema_type_names(bfcl_tasks):
    words: set[str] = set()

    def collect(schema: Any) -> None:
        if isinstance(schema, dict):
            if isinstance(schema.get("type"), str):
                words.add(schema["type"])
            for v in schema.values():
                collect(v)
        elif isinstance(schema, list):
            for v in schema:
                collect(v)

    for task in bfcl_tasks:
        collect([tool["function"]["parameters"] for tool in task.columns["tools"]])
    assert words <= {"object", "string", "integer", "number", "boolean", "array"}
    (tool,) = bfcl_tools([{"name": "f", "parameters": {"type": "dict", "properties": {}}}])
    assert tool == {
        "type": "function",
        "function": {
            "name": "f",
            "description": "",
            "parameters": {"type": "object", "properties": {}},
        },
    }


def test_unpack_keeps_only_the_data(tmp_path: Path):
    wheel = tmp_path / "bfcl_eval-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("bfcl_eval/__init__.py", "raise SystemExit")
        zf.writestr("bfcl_eval/data/BFCL_v4_simple_python.json", "{}")
        zf.writestr("bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json", "{}")
        zf.writestr("bfcl_eval/data/multi_turn_func_doc/x.json", "{}")
        zf.writestr("bfcl_eval-0.dist-info/METADATA", "Name: bfcl-eval")
    unpack_wheel(wheel, tmp_path / "out")
    files = sorted(
        str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file()
    )
    assert files == [
        "BFCL_v4_simple_python.json",
        "METADATA",
        "possible_answer/BFCL_v4_simple_python.json",
    ]
    assert not has_bfcl_data(tmp_path / "out")  # three categories are missing


def test_env_scores_one_turn_and_says_why(bfcl_tasks):
    task = next(t for t in bfcl_tasks if t.category == "parallel")
    env = BFCLEnv(task)
    assert env.tools == task.columns["tools"]
    assert asyncio.run(env.reset(task)) == task.messages()
    good = render_calls(gold_calls(task), "hermes")
    result = asyncio.run(env.step(AssistantTurn(good, [])))
    assert (result.reward, result.done, result.info["success"]) == (1.0, True, True)
    result = asyncio.run(env.step(AssistantTurn("I cannot help.", [])))
    assert result.reward == 0.0 and result.info["success"] is False
    assert result.info["reason"].startswith("no tool call found")


def _suite_eval(task: Task, reply: str, max_context: int, bfcl_dir: Path) -> dict:
    tokenizer = load_tokenizer(str(resolve_model_path("tiny")))
    engine = ScriptedEngine(tokenizer, [reply], max_context=max_context)
    cfg = config_from_dict({})
    suite = build_suite(cfg, SuitePlan("bfcl", bfcl_dir), engine, load_run_model(cfg))
    result = asyncio.run(evaluate(suite.source, [task], k=2, max_new_tokens=400))
    result["too_long"] = sorted(suite.source.too_long)
    return result


def test_suite_rollouts_score_hermes_calls_through_the_template(bfcl_tasks, bfcl_dir):
    task = next(t for t in bfcl_tasks if t.category == "parallel_multiple")
    good = render_calls(gold_calls(task), "hermes")
    result = _suite_eval(task, good, 8192, bfcl_dir)
    assert result["accuracy"] == 1.0 and result["pass@2"] == 1.0
    assert result["by_category"]["parallel_multiple"]["n"] == 1
    wrong = render_calls(gold_calls(task)[:1], "hermes")
    assert _suite_eval(task, wrong, 8192, bfcl_dir)["accuracy"] == 0.0


def test_suite_counts_a_prompt_that_does_not_fit_as_wrong(bfcl_tasks, bfcl_dir):
    task = bfcl_tasks[0]
    result = _suite_eval(task, render_calls(gold_calls(task), "hermes"), 64, bfcl_dir)
    assert result["accuracy"] == 0.0 and result["mean@2"] == 0.0
    assert result["too_long"] == [task.id]


def test_eval_command_bfcl_suite_on_the_tiny_model(tmp_path, bfcl_dir, capsys):
    out = tmp_path / "bfcl.json"
    code = main(["eval", "--suite", "bfcl", "--eval.size=8", "--eval.k=1", f"--out={out}"])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["suite"] == "bfcl" and result["n_tasks"] == 8
    assert set(result["by_category"]) == set(CATEGORIES)
    assert all(v["n"] == 2 for v in result["by_category"].values())
    assert 0.0 <= result["accuracy"] <= 1.0 and "pass@1" in result and "mean@1_ci95" in result
    assert "eval: 8 tasks" in capsys.readouterr().out


def test_a_failed_download_is_one_clear_error(tmp_path: Path):
    with pytest.raises(DataError, match=r"cannot download bfcl-eval==0\.0\.0\.dev0 from PyPI"):
        ensure_bfcl_data("0.0.0.dev0", root=tmp_path)
    assert not (tmp_path / "bfcl" / "0.0.0.dev0").exists()
