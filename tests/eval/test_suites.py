"""`temper eval --suite`: bad names and missing data fail in one line; gsm8k and humaneval run."""

from __future__ import annotations

import asyncio
import json

import pytest

from scripted_engine import ScriptedEngine
from temper.builder.model import load_run_model
from temper.builder.suites import build_suite
from temper.cli.main import main
from temper.config import config_from_dict
from temper.eval.harness import evaluate
from temper.eval.suites import (
    GSM8K_DEFAULT,
    ContextFitRollouts,
    SuitePlan,
    check_suite,
    repo_root,
)
from temper.models import load_tokenizer, resolve_model_path
from temper.records import Task, Trajectory


def _error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_unknown_suite_and_missing_data_are_one_line_errors(capsys, tmp_path):
    err = _error_line(capsys, ["eval", "--suite", "mmlu"])
    assert err == (
        "temper: error: unknown eval suite 'mmlu'; choose one of builtin, gsm8k, humaneval, bfcl, miniwob, vision"
    )
    missing = tmp_path / "nope.jsonl"
    err = _error_line(capsys, ["eval", "--suite", "gsm8k", "--suite-path", str(missing)])
    assert (
        err == f"temper: error: eval suite gsm8k: {missing} does not exist (pass --suite-path FILE)"
    )
    err = _error_line(capsys, ["eval", "--suite", "bfcl", "--suite-path", str(tmp_path)])
    assert f"eval suite bfcl: {tmp_path} does not hold BFCL_v4_*.json" in err
    err = _error_line(capsys, ["eval", "--suite", "humaneval", "--suite-path", "x"])
    assert err == "temper: error: eval suite humaneval takes no --suite-path"


def test_gsm8k_default_path_is_the_shared_test_file():
    expected = repo_root() / GSM8K_DEFAULT
    if not expected.is_file():
        pytest.skip(f"{expected} is not in this checkout")
    assert check_suite("gsm8k", None) == SuitePlan("gsm8k", expected)


def test_gsm8k_suite_on_the_tiny_model(tmp_path, capsys):
    data = tmp_path / "gsm.jsonl"
    rows = [
        {"question": "Tom has 3 apples and buys 4 more. How many now?", "answer": "3+4=7\n#### 7"},
        {"question": "What is 12 minus 5?", "answer": "12-5=7\n#### 7"},
        {"question": "Double 21.", "answer": "#### 42"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "gsm.json"
    argv = ["eval", "--suite", "gsm8k", "--suite-path", str(data), f"--out={out}"]
    assert main([*argv, "--eval.k=2", "--eval.max_response_tokens=16"]) == 0
    result = json.loads(out.read_text())
    assert result["suite"] == "gsm8k" and result["n_tasks"] == 3
    assert set(result["by_category"]) == {"gsm8k"}
    assert {"accuracy", "pass@1", "pass@2", "mean@2", "maj@2", "mean@2_ci95"} <= set(result)
    assert result["n_prompt_too_long"] == 0
    assert "eval: 3 tasks" in capsys.readouterr().out


class _Known:
    """A RolloutSource that marks every task it is given correct."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def groups(self, tasks, params, seed=None):
        self.seen += [t.id for t in tasks]
        groups = []
        for i, task in enumerate(tasks):
            g = []
            for _ in range(params.n):
                t = Trajectory(
                    task.id, i, [1], [2], [1], [0.0], [0], "stop", category=task.category
                )
                t.correct = True
                g.append(t)
            groups.append(g)
        return groups, {}


def test_prompts_that_do_not_fit_count_as_wrong_in_order():
    inner = _Known()
    lengths = {"a": 10, "b": 99, "c": 50, "d": 100}
    source = ContextFitRollouts(inner, lambda t: lengths[t.id], max_context=100)
    tasks = [Task(i, "q", "1", category="x") for i in lengths]
    result = asyncio.run(evaluate(source, tasks, k=2, temperature=1.0))
    assert inner.seen == ["a", "b", "c"] * 2  # greedy, then sampled; never d
    assert source.too_long == {"d"}
    assert result["accuracy"] == 0.75 and result["pass@2"] == 0.75


def test_humaneval_suite_scores_a_correct_solution_in_the_sandbox():
    tokenizer = load_tokenizer(str(resolve_model_path("tiny")))
    cfg = config_from_dict({})
    plan = check_suite("humaneval", None)
    probe = build_suite(cfg, plan, ScriptedEngine(tokenizer, ["x"], 4096), load_run_model(cfg))
    task = probe.tasks[0]
    probe.close()
    assert len(probe.tasks) == 164 and task.category == "humaneval"
    for reply, expected in ((task.columns["reference"], 1.0), ("def nope(): pass", 0.0)):
        engine = ScriptedEngine(tokenizer, [f"```python\n{reply}\n```"], max_context=4096)
        suite = build_suite(cfg, plan, engine, load_run_model(cfg))
        try:
            result = asyncio.run(evaluate(suite.source, [task], k=1, max_new_tokens=1024))
        finally:
            suite.close()
        assert result["accuracy"] == expected


def test_vision_suite_on_the_tiny_vlm(tmp_path, capsys):
    out = tmp_path / "vision.json"
    argv = ["eval", "--suite", "vision", "--model.path=tiny_vlm", "--engine.type=hf"]
    assert main([*argv, f"--out={out}", "--eval.size=8", "--eval.k=2"]) == 0
    result = json.loads(out.read_text())
    assert result["suite"] == "vision" and result["n_tasks"] == 8
    assert set(result["by_category"]) <= {"count", "number", "redder", "same_colour"}
    assert 0.0 <= result["accuracy"] <= 1.0 and result["n_prompt_too_long"] == 0
    # A text model cannot see the pictures: one line, exit 2, before any generation.
    err = _error_line(capsys, ["eval", "--suite", "vision", "--eval.size=8"])
    assert err.startswith("temper: error: eval suite vision needs a vision-language model")
