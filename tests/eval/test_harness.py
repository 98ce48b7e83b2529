"""The eval harness's statistics over a rollout source with known outcomes."""

import asyncio

from temper.eval.harness import evaluate
from temper.records import Task, Trajectory


class KnownOutcomes:
    """A RolloutSource whose samples answer from a fixed script per task."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = script

    async def groups(self, tasks, params, seed=None):
        groups = []
        for i, task in enumerate(tasks):
            answers = self.script[task.id][: params.n] if params.temperature else ["1"]
            g = []
            for text in answers:
                t = Trajectory(task.id, i, [1], [5], [1], [0.0], [0], "stop")
                t.response_text = f"\\boxed{{{text}}}"
                t.correct = text == task.answer
                g.append(t)
            groups.append(g)
        return groups, {}


def test_maj_at_k_pass_at_k_and_intervals():
    tasks = [Task("a", "q", "1"), Task("b", "q", "2"), Task("c", "q", None)]
    script = {"a": ["1", "1", "3", "4"], "b": ["2", "5", "5", "2"], "c": ["7", "7", "7", "7"]}
    result = asyncio.run(evaluate(KnownOutcomes(script), tasks, k=4, temperature=1.0))
    # Greedy: every task answers "1": only task a is right.
    assert abs(result["accuracy"] - 1 / 3) < 1e-9
    lo, hi = result["accuracy_ci95"]
    assert 0.0 < lo < 1 / 3 < hi < 1.0
    # a: majority "1" (right); b: tie 2/5, "2" seen first (right); c has no answer.
    assert result["maj@4"] == 1.0
    assert abs(result["mean@4"] - (2 / 4 + 2 / 4 + 0) / 3) < 1e-9
    assert result["pass@4"] == 2 / 3
