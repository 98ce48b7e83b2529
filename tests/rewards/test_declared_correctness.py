"""A reward declares what counts as correct: ``correct_above`` on a component, or a
python function's ``{"score": x, "correct": bool}``; without a declaration the
verdict is reward >= 1, and the eval says so."""

import asyncio
import io
from pathlib import Path

import pytest
from rich.console import Console

from scripted_engine import ScriptedEngine
from temper.builder.model import load_run_model
from temper.builder.rollouts import build_rollouts
from temper.builder.tasks import build_run_tasks
from temper.config import config_from_dict
from temper.eval.harness import CORRECT_RULES, evaluate
from temper.eval.report import print_eval_table
from temper.orchestrator.loop import _eval_line
from temper.records import Task
from temper.rewards import RewardInput, TRLRewardFunction
from temper.rewards.base import RewardResult
from temper.rewards.combine import CorrectAbove, WeightedSum

SHAPED = (
    "def reward(completions, answer, **kw):\n"
    "    return [(1.0 if '\\\\boxed{' + a + '}' in c else 0.0) - 0.001 * len(c)\n"
    "            for c, a in zip(completions, answer)]\n"
)


def _inputs(*texts: str) -> list[RewardInput]:
    return [RewardInput(Task(str(i), "q", "4"), "q", t) for i, t in enumerate(texts)]


def _score(reward, *texts: str) -> list[RewardResult]:
    return asyncio.run(reward.score(_inputs(*texts)))


def test_a_python_reward_declares_correctness_with_a_dict():
    def fn(completions, **kw):
        return [{"score": 0.9 - 0.01 * len(c), "correct": c == "4"} for c in completions]

    right, wrong = _score(TRLRewardFunction(fn), "4", "5")
    assert (right.correct, wrong.correct) == (True, False)
    assert right.score == pytest.approx(0.89) and right.error is None
    # A plain number declares nothing; a dict's None score does not apply.
    [plain] = _score(TRLRewardFunction(lambda completions: [1.0]), "4")
    assert plain.correct is None
    [na] = _score(TRLRewardFunction(lambda completions: [{"score": None}]), "4")
    assert na.not_applicable and na.correct is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"reward": 1.0}, "a dict with keys ['reward']"),
        ({"correct": True}, "a dict with no 'score'"),
        ({"score": 1.0, "correct": "yes"}, "'correct' = 'yes'; expected True, False or None"),
        ({"score": float("nan"), "correct": True}, "returned nan"),
    ],
)
def test_a_malformed_dict_is_an_error_on_that_completion(value, message):
    [result] = _score(TRLRewardFunction(lambda completions: [value]), "4")
    assert result.error is not None and message in result.error
    assert result.correct is None


def test_correct_above_replaces_the_components_verdict():
    def fn(completions, **kw):
        out = []
        for c in completions:
            if c == "boom":
                raise ValueError("cannot score this")
            out.append({"score": float(c), "correct": False})
        return out

    reward = WeightedSum([(CorrectAbove(TRLRewardFunction(fn, "shaped"), 0.5), 2.0)])
    above, at, below, failed = _score(reward, "0.9", "0.5", "0.1", "boom")
    assert (above.correct, at.correct, below.correct) == (True, False, False)  # strictly above
    assert above.score == pytest.approx(1.8)  # the threshold is on the unweighted score
    assert failed.error is not None and failed.correct is None
    assert "ValueError: cannot score this" in (failed.traceback or "")


def _shaped_eval(tmp_path: Path, **declared: float) -> dict:
    """Evaluate 4 held-out arithmetic tasks with the shaped reward; the scripted engine
    answers the first two right and the last two wrong."""
    (tmp_path / "shaped.py").write_text(SHAPED)
    function = f"{tmp_path / 'shaped.py'}:reward"
    component = {"type": "python", "function": function, **declared}
    cfg = config_from_dict({"reward": {"filters": [], "components": [component]}})
    run_tasks = build_run_tasks(cfg)
    tasks = run_tasks.heldout[:4]
    right = {t.prompt: t.answer for t in tasks[:2]}

    def reply(prompt: str, i: int) -> str:
        answer = next((a for q, a in right.items() if q in prompt), "-1")
        return f"The answer is \\boxed{{{answer}}}."

    model = load_run_model(cfg)
    rollouts = build_rollouts(cfg, ScriptedEngine(model.tokenizer, [reply]), model, run_tasks)
    try:
        return asyncio.run(evaluate(rollouts.source, tasks, k=2, max_new_tokens=32))
    finally:
        rollouts.close()


def test_a_shaped_reward_with_a_threshold_logs_real_held_out_correctness(tmp_path):
    result = _shaped_eval(tmp_path, correct_above=0.5)
    assert result["accuracy"] == 0.5 and result["mean@2"] == 0.5
    assert result["correct_rule"] == CORRECT_RULES["declared"]
    # Right answers score 1 - 0.001 * length (< 1), wrong ones below 0.
    assert 0.4 < result["reward_mean"] < 0.5
    assert list(result).index("reward_mean") == list(result).index("accuracy") + 1
    assert result["by_category"]["level1"]["reward_mean"] == pytest.approx(result["reward_mean"])
    out = io.StringIO()
    print_eval_table(result, Console(file=out, width=300))
    assert "note:" not in out.getvalue()


def test_without_a_declaration_the_default_rule_is_used_and_said(tmp_path):
    result = _shaped_eval(tmp_path)
    assert result["accuracy"] == 0.0  # no shaped score reaches 1
    assert result["correct_rule"] == CORRECT_RULES["default"]
    out = io.StringIO()
    print_eval_table(result, Console(file=out, width=300))
    note = out.getvalue().splitlines()[-1]
    assert note.startswith("note: correct means reward >= 1: no reward component declares")
    # The training console's eval line: accuracy beside the mean reward, and the rule.
    line = _eval_line(0, result)
    assert "accuracy 0.000  reward_mean 0.4" in line
    assert line.endswith("(correct: reward >= 1; no reward component declares correctness)")
