"""MathVerifyReward with the real math-verify package, in worker processes."""

import asyncio
import os
import threading
import time

import pytest

from temper.records import Task
from temper.rewards import MathVerifyReward, Reward, RewardInput
from temper.rewards.testing import faulty_verify


def item(answer: str | None, completion: str) -> RewardInput:
    return RewardInput(Task(id="t1", prompt="q", answer=answer), "q", completion)


@pytest.fixture(scope="module")
def reward():
    with MathVerifyReward() as r:
        r.start(wait=True)
        yield r


@pytest.fixture(scope="module")
def faulty():
    with MathVerifyReward(verify_fn=faulty_verify, timeout_s=2.0) as r:
        r.start(wait=True)
        yield r


def test_real_math_verify(reward):
    assert isinstance(reward, Reward)
    inputs = [
        item("72", "So she makes \\boxed{72} dollars."),
        item("1/2", "The probability is 0.5"),
        item("0.5", "$\\frac{1}{2}$"),
        item("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}"),
        item("Janet sells 9 eggs.\n#### 1,450,000", "The answer is \\boxed{1450000}."),
        item("72", "So she makes \\boxed{71} dollars."),
        item("1/2", "I do not know"),
        item(None, "\\boxed{1}"),
    ]
    out = asyncio.run(reward.score(inputs))
    assert [r.correct for r in out] == [True, True, True, True, True, False, False, None]
    assert [r.score for r in out] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert all(r.error is None for r in out[:7])
    assert out[7].error == "task 't1' has no reference answer"
    assert out[0].components == {"math_verify": 1.0}


def test_concurrent_calls_from_threads_with_their_own_loops(reward):
    results: dict[int, list] = {}

    def run(n: int) -> None:
        inputs = [item(str(n), f"\\boxed{{{n}}}"), item(str(n), "\\boxed{-1}")]
        results[n] = asyncio.run(reward.score(inputs))

    threads = [threading.Thread(target=run, args=(n,)) for n in (3, 4, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [3, 4, 5]
    assert all([r.correct for r in out] == [True, False] for out in results.values())


def test_timeout_kills_and_restarts_the_worker(faulty):
    pids = faulty.pool.pids
    restarts = faulty.pool.restarts
    start = time.monotonic()
    out = asyncio.run(
        faulty.score([item("7", "SLEEP 60 \\boxed{7}"), item("7", "\\boxed{7}"), item("7", "7")])
    )
    assert time.monotonic() - start < 10
    assert out[0].error.startswith("timeout after 2s")
    assert out[0].correct is None and out[0].score == 0.0
    assert [r.correct for r in out[1:]] == [True, True]
    assert faulty.pool.restarts == restarts + 1
    gone = [pid for pid in pids if pid not in faulty.pool.pids]
    assert len(gone) == 1 and not os.path.exists(f"/proc/{gone[0]}")
    # the replacement worker serves the next batch
    assert asyncio.run(faulty.score([item("2", "\\boxed{2}")]))[0].correct is True


def test_crash_and_exception_are_recorded(faulty):
    out = asyncio.run(
        faulty.score([item("1", "CRASH"), item("1", "RAISE"), item("1", "\\boxed{1}")])
    )
    assert out[0].error == "worker crashed (exit code 3)"
    assert out[1].error == "RuntimeError: injected failure"
    assert out[2].correct is True


def test_items_run_in_parallel(faulty):
    start = time.monotonic()
    out = asyncio.run(faulty.score([item("1", "SLEEP 0.8 \\boxed{1}")] * 2))
    assert [r.correct for r in out] == [True, True]
    assert time.monotonic() - start < 1.5


def test_close_leaves_no_processes():
    r = MathVerifyReward(workers=1, verify_fn=faulty_verify, warm_up=None)
    pids: list[int] = []

    async def use() -> list:
        async with r:
            out = await r.score([item("3", "\\boxed{3}")])
            pids.extend(r.pool.pids)
            return out

    assert asyncio.run(use())[0].correct is True
    assert len(pids) == 1 and not os.path.exists(f"/proc/{pids[0]}")
    assert r.pool.pids == []
