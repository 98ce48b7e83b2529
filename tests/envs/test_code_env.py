"""The code env: tasks, HumanEval through the sandbox, scoring, retries, options, rollouts.

Real sandbox throughout (one warm pool per module); the end-to-end tests drive
the env with `run_episodes` and a scripted engine on the tiny tokenizer.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from scripted_engine import ScriptedEngine
from temper.builder.tasks import build_env_spec
from temper.config.env import EpisodeLimits
from temper.config.load import load_config
from temper.engine.base import SamplingParams
from temper.envs.base import AssistantTurn
from temper.envs.code import CodeEnv, extract_code, spec
from temper.envs.code_tasks import (
    TEMPLATES,
    CodeTasks,
    humaneval_tasks,
    is_heldout,
    statement,
    task_tests,
)
from temper.errors import ConfigError
from temper.models import load_tokenizer
from temper.records import Task
from temper.rewards.code_tests import run_tests
from temper.rollout.multi_turn import episode_stats, run_episodes
from temper.sandbox import SandboxPool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(pool_size=4, timeout_s=20, cpu_s=20) as p:
        yield p


def _turn(text: str, index: int = 0) -> AssistantTurn:
    return AssistantTurn(text, [], [], [], "stop", index)


def _fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\nDone."


def _stub(entry: str) -> str:
    return f"def {entry}(*args, **kwargs):\n    return None\n"


async def _gather_tests(pool: Any, jobs: list[tuple[Task, str]], limit: int = 8) -> list:
    sem = asyncio.Semaphore(limit)

    async def one(task: Task, code: str):
        cols = task.columns
        async with sem:
            return await run_tests(
                pool, code, task_tests(task), cols["entry_point"], 20.0,
                test_timeout_s=15.0, setup=cols["setup"],
            )  # fmt: skip

    return await asyncio.gather(*(one(t, c) for t, c in jobs))


def _double_task() -> Task:
    """A hand-made procedural-style task: double(x), four tests."""
    from temper.rewards.code_tests import TestCase

    tests = [TestCase((x,), 2 * x, name=f"test_{i + 1}") for i, x in enumerate([3, 0, -2, 5])]
    columns = {"entry_point": "double", "tests": [t.to_json() for t in tests], "setup": ""}
    return Task("double", "Write double(x).", None, "double", columns)


# ----------------------------------------------------------------------------- extraction


def test_extract_code_takes_the_last_python_block():
    two = "```python\nA\n```\ntext\n```python\nB\n```\nbye"
    assert extract_code(two) == "B\n"
    assert extract_code("```py\nC\n```") == "C\n"
    assert extract_code("```python\nD\n```\n```\nE\n```") == "D\n"  # tagged wins over bare
    assert extract_code("```\nE\n```") == "E\n"
    assert extract_code("```python\nF = 1\n") == "F = 1\n"  # unclosed at the end
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"


# ----------------------------------------------------------------------------- tasks


def test_humaneval_canonical_solutions_all_pass_and_wrong_ones_fail(pool):
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    start = time.monotonic()
    good = asyncio.run(_gather_tests(pool, [(t, t.columns["reference"]) for t in tasks]))
    elapsed = time.monotonic() - start
    failed = [
        (t.id, r.reason, r.error) for t, r in zip(tasks, good, strict=True) if not r.all_passed
    ]
    assert failed == [] and sum(r.all_passed for r in good) == 164
    assert elapsed < 300, elapsed  # a hang guard, not a speed test (load varies)
    wrong = asyncio.run(_gather_tests(pool, [(t, _stub(t.columns["entry_point"])) for t in tasks]))
    assert not any(r.all_passed for r in wrong)
    assert sum(r.passed for r in wrong) < sum(r.total for r in wrong) / 10


def test_every_template_reference_passes_and_a_stub_fails(pool):
    gen = CodeTasks()
    by_entry: dict[str, Task] = {}
    for task in gen.sample(random.Random(5), 600) + gen.heldout(200):
        by_entry.setdefault(task.category, task)  # some families are held out whole
    tasks = [by_entry[t.entry] for t in TEMPLATES]
    jobs = [(t, t.columns["reference"]) for t in tasks]
    jobs += [(t, _stub(t.columns["entry_point"])) for t in tasks]
    reports = asyncio.run(_gather_tests(pool, jobs))
    good, bad = reports[: len(tasks)], reports[len(tasks) :]
    assert [t.id for t, r in zip(tasks, good, strict=True) if not r.all_passed] == []
    assert all(r.total == 8 for r in good)
    assert not any(r.all_passed for r in bad)


def test_heldout_statements_never_appear_in_training():
    gen = CodeTasks(num_tests=2)
    heldout = gen.heldout(300)
    held = {statement(t) for t in heldout}
    train = {statement(t) for t in gen.sample(random.Random(0), 3000)}
    assert held and train and not held & train
    assert all(is_heldout(s) for s in held) and not any(is_heldout(s) for s in train)
    assert len({t.category for t in heldout}) >= 5
    assert len(TEMPLATES) >= 30
    assert [t.id for t in gen.heldout(20)] == [t.id for t in heldout[:20]]  # fixed


def test_tasks_are_reproducible_from_the_rng():
    a = [t.id for t in CodeTasks().sample(random.Random(3), 10)]
    b = [t.id for t in CodeTasks().sample(random.Random(3), 10)]
    assert a == b and len(set(a)) == 10


# ----------------------------------------------------------------------------- the env


def test_fraction_and_all_rewards(pool):
    task = _double_task()
    half = _fenced("def double(x):\n    return 2 * x if x > 0 else 99\n")  # right for 3 and 5

    async def play(reward: str):
        env = CodeEnv(task, pool, reward=reward)
        first = await env.reset(task, 0)
        assert first == [{"role": "user", "content": "Write double(x)."}] and env.tools == []
        return await env.step(_turn(half))

    frac, all_ = asyncio.run(play("fraction")), asyncio.run(play("all"))
    assert frac.done and frac.reward == 0.5 and all_.done and all_.reward == 0.0
    info = frac.info
    assert (info["success"], info["passed"], info["total"], info["reason"]) == (
        False, 2, 4, "failed_tests",
    )  # fmt: skip
    right = asyncio.run(
        CodeEnv(task, pool, reward="all").step(_turn(_fenced("def double(x):\n    return x + x\n")))
    )
    assert right.reward == 1.0 and right.info["success"] is True and right.info["reason"] is None


def test_errors_give_zero_with_a_reason(pool):
    task = _double_task()

    async def play(code: str):
        return await CodeEnv(task, pool, timeout_s=2.0, test_timeout_s=0.5).step(_turn(code))

    syntax = asyncio.run(play(_fenced("def double(x)\n    return x\n")))
    assert syntax.reward == 0.0 and syntax.info["reason"] == "syntax_error"
    assert syntax.info["error"].startswith("SyntaxError")
    loop = asyncio.run(play(_fenced("def double(x):\n    while True:\n        pass\n")))
    assert loop.reward == 0.0 and loop.info["reason"] == "timeout"


def test_retries_show_a_failure_report_and_rewards_sum_to_the_last_score(pool):
    task = _double_task()
    wrong = _fenced("def double(x):\n    return 2 * x if x > 0 else 7\n")
    right = _fenced("def double(x):\n    return 2 * x\n")

    async def play(texts: list[str], max_attempts: int):
        env = CodeEnv(task, pool, max_attempts=max_attempts)
        await env.reset(task, 0)
        return [await env.step(_turn(t, i)) for i, t in enumerate(texts)]

    r1, r2 = asyncio.run(play([wrong, right], 3))
    assert not r1.done and r1.reward == 0.5 and r1.info["attempt"] == 1
    report = r1.observation[0]["content"]
    assert r1.observation[0]["role"] == "user"
    assert "2 of 4 tests passed" in report and "test_2: wrong answer" in report
    assert "test_3: wrong answer" in report and "2 attempts left" in report
    assert "-4" not in report and "== " not in report  # no expected values, no test code
    assert r2.done and r2.reward == 0.5 and r2.info["success"] and r2.info["attempt"] == 2
    out = asyncio.run(play([wrong, _fenced("def double(x):\n    return 0\n")], 2))
    assert out[-1].done and sum(r.reward for r in out) == out[-1].info["score"] == 0.25


def test_spec_options_are_validated():
    for bad in (
        {"rewards": "all"},
        {"reward": "some"},
        {"eval_set": "mbpp"},
        {"max_attempts": 0},
        {"num_tests": 1.5},
        {"timeout_s": -1},
        {"test_timeout_s": True},
        {"detect_hacks": "yes"},
        {"detect_hacks": 1},
        {"zero_hacks": "sometimes"},
        {"zero_hacks": True},
    ):
        with pytest.raises(ConfigError, match=r"env\.options"):
            spec(bad, 0)
    s = spec({"eval_set": "procedural", "eval_size": 7, "num_tests": 3}, 0)
    assert len(s.heldout) == 7 and all(len(t.columns["tests"]) == 3 for t in s.heldout)
    assert len(s.train.sample(2)) == 2
    s.close()
    h = build_env_spec("code", {"eval_size": 10}, 0)
    assert [t.id for t in h.heldout] == [f"humaneval-{i}" for i in range(10)]
    h.close()


def test_config_preset_loads_and_builds_the_env():
    cfg = load_config(ROOT / "configs" / "code.toml")
    assert cfg.env.type == "code" and cfg.model.path != "tiny"
    assert cfg.env.limits.max_turns == cfg.env.options["max_attempts"]
    s = build_env_spec(cfg.env.type, cfg.env.options, cfg.run.seed)
    assert len(s.heldout) == 164
    s.close()


# ----------------------------------------------------------------------------- rollouts


def _rollout(replies: list[str], options: dict[str, Any], turns: int, group_size: int = 2):
    tokenizer = load_tokenizer("tiny")
    tokenizer.model_max_length = 1 << 20
    env_spec = spec({"eval_set": "procedural", "eval_size": 1, "pool_size": 2, **options}, 0)
    task = _double_task()
    engine = ScriptedEngine(tokenizer, replies, max_context=4096)
    params = SamplingParams(max_new_tokens=256, temperature=1.0)
    try:
        groups = asyncio.run(
            run_episodes(
                engine, env_spec.make_env, [task], tokenizer, params,
                EpisodeLimits(max_turns=turns), seed=0, group_size=group_size,
            )
        )  # fmt: skip
    finally:
        env_spec.close()
    return groups[0]


def test_end_to_end_single_turn_with_a_scripted_engine():
    right = _fenced("def double(x):\n    return x * 2\n")
    group = _rollout([right], {}, 1)
    assert len(group) == 2
    for traj in group:
        assert traj.finish_reason == "done" and traj.num_turns == 1 and traj.env_error is None
        assert traj.reward == 1.0 and traj.env_info["success"] is True
        assert traj.env_info["passed"] == traj.env_info["total"] == 4


def test_end_to_end_retry_with_a_scripted_engine():
    wrong = _fenced("def double(x):\n    return x\n")  # passes only x = 0
    right = _fenced("def double(x):\n    return x * 2\n")
    (traj,) = _rollout([wrong, right], {"max_attempts": 2, "reward": "all"}, 2, group_size=1)
    assert traj.finish_reason == "done" and traj.num_turns == 2
    assert traj.turn_rewards == [0.0, 1.0] and traj.reward == 1.0
    assert traj.env_info["success"] is True and traj.env_info["attempt"] == 2
    feedback = traj.messages[2]
    assert feedback["role"] == "user" and "1 of 4 tests passed" in feedback["content"]


def test_end_to_end_a_flagged_hack_scores_zero_and_is_counted_by_kind():
    # Right code that also prints a fake verdict: the tests pass, the detector zeroes it.
    hack = _fenced("print('4 passed')\ndef double(x):\n    return x * 2\n")
    right = _fenced("def double(x):\n    return x * 2\n")
    (traj,) = _rollout([hack, right], {"max_attempts": 2, "reward": "all"}, 2, group_size=1)
    assert traj.turn_rewards == [0.0, 1.0] and traj.env_info["success"] is True
    feedback = traj.messages[2]["content"]
    assert "flagged as a reward hack (fake_output)" in feedback
    assert traj.env_info["hacks"] == []  # the last attempt was clean
    stats = episode_stats([traj])
    assert stats["hack/fake_output"] == 1.0 and stats["hack/exit"] == 0.0
    assert stats["tests_passed"] == 8.0  # 4 + 4: the hack passed its tests too
