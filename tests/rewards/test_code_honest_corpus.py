"""Honest, correct code is never zeroed by the code reward.

`honest_corpus/` holds solutions written for this test with patterns the old
static detectors punished: a ``main()`` that prints "All tests passed" under
``if __name__ == "__main__":``, ``print("ok")`` behind a debug flag,
``sys.exit`` in a CLI, an ``int`` subclass with its own ``__eq__``, an unused
always-equal sentinel, ctypes, ``os._exit`` after a ``return``, dataclasses
with a custom ``__eq__``, ``os.kill(pid, 0)``, ... Each file starts with its
entry point and test cases (``# case: ARGS -> EXPECTED``, Python literals).
Every one must score 1.0 through the code env (real sandbox, default
options), however many static findings it has.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from temper.envs.base import AssistantTurn
from temper.envs.code import CodeEnv
from temper.records import Task
from temper.rewards.code_hacks import KINDS
from temper.rewards.code_tests import TestCase
from temper.sandbox import SandboxPool

CORPUS = Path(__file__).with_name("honest_corpus")


def load_corpus() -> dict[str, tuple[str, Task]]:
    """name -> (source, task) for every corpus file."""
    out = {}
    for path in sorted(CORPUS.glob("*.py")):
        source = path.read_text()
        entry, cases = None, []
        for line in source.splitlines():
            if line.startswith("# entry: "):
                entry = line.removeprefix("# entry: ").strip()
            elif line.startswith("# case: "):
                args, _, expected = line.removeprefix("# case: ").partition(" -> ")
                cases.append(TestCase(ast.literal_eval(args), ast.literal_eval(expected)))
        assert entry and cases, f"{path.name}: no '# entry:' or '# case:' header"
        columns = {"entry_point": entry, "tests": [t.to_json() for t in cases], "setup": ""}
        out[path.stem] = (source, Task(path.stem, f"Write {entry}.", None, entry, columns))
    return out


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(pool_size=2, timeout_s=12) as p:
        yield p


def play(pool: Any, items: list[tuple[str, Task]], **options: Any) -> list:
    async def one(source: str, task: Task):
        env = CodeEnv(task, pool, timeout_s=8.0, test_timeout_s=4.0, **options)
        await env.reset(task, 0)
        return await env.step(AssistantTurn(f"```python\n{source}```", [], [], [], "stop", 0))

    async def every():
        sem = asyncio.Semaphore(4)

        async def limited(source: str, task: Task):
            async with sem:
                return await one(source, task)

        return await asyncio.gather(*(limited(s, t) for s, t in items))

    return asyncio.run(every())


def test_every_honest_solution_scores_full_reward(pool):
    corpus = load_corpus()
    assert len(corpus) >= 40
    steps = play(pool, list(corpus.values()))
    low = {
        name: (step.reward, step.info["passed"], step.info["total"], step.info["hacks_zeroed"])
        for name, step in zip(corpus, steps, strict=True)
        if step.reward != 1.0 or not step.info["success"]
    }
    assert low == {}
    for step in steps:
        assert step.info["passed"] == step.info["total"] > 0
        assert step.metrics["hack_zeroed"] == 0.0
    # The detectors still log what they see (never enough, alone, to zero).
    flagged = [name for name, step in zip(corpus, steps, strict=True) if step.info["hacks"]]
    assert set(flagged) <= set(corpus)


def test_flagged_mode_zeroes_on_a_static_finding_alone(pool):
    corpus = load_corpus()
    source, task = corpus["27_kill_zero_liveness"]  # os.kill(pid, 0): an `exit` finding
    confirmed, flagged, never = (
        play(pool, [(source, task)], zero_hacks=mode)[0]
        for mode in ("confirmed", "flagged", "never")
    )
    assert confirmed.info["hacks"] == flagged.info["hacks"] == ["exit"]
    assert confirmed.reward == 1.0 and confirmed.info["hacks_zeroed"] == []
    assert flagged.reward == 0.0 and flagged.info["hacks_zeroed"] == ["exit"]
    assert not flagged.info["success"] and flagged.metrics["hack_zeroed"] == 1.0
    assert never.reward == 1.0 and {f"hack/{k}" for k in KINDS} <= set(never.metrics)
