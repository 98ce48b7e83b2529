"""Math answer checking with `math-verify`, in worker processes with a hard timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temper.rewards.answers import normalize_gold_answer
from temper.rewards.base import RewardInput, RewardResult
from temper.rewards.process_pool import Outcome, ProcessPool


def verify_answer(gold: str, completion: str) -> bool:
    """True when the final answer in `completion` equals `gold`, by math-verify.

    `gold` is parsed as LaTeX or a plain expression (retried wrapped in `$...$`);
    the completion is parsed with math-verify's defaults (a `\\boxed{}` answer is
    preferred, then the last LaTeX or plain expression). Equality is symbolic and
    numeric, so "0.5" matches "1/2". Raises ValueError when `gold` cannot be parsed.
    Runs inside a worker process, where math-verify's own signal-based timeouts
    work (the worker's main thread).
    """
    from math_verify import parse, verify

    gold_parsed = parse(gold) or parse(f"${gold}$")
    if not gold_parsed:
        raise ValueError(f"cannot parse the reference answer {gold!r}")
    return bool(verify(gold_parsed, parse(completion)))


def warm_up_math_verify() -> None:
    """Import math-verify (and sympy) and run one check, so the first real item is fast."""
    verify_answer("1", "\\boxed{1}")


class MathVerifyReward:
    """Scores a completion 1.0 if its final answer equals `task.answer`, else 0.0.

    The reference answer may be plain (`"72"`, `"1/2"`), LaTeX, a `\\boxed{...}`
    text, or a whole GSM8K solution ending in `#### 72` (see
    `normalize_gold_answer`). Checks run in `workers` persistent worker
    processes (multiprocessing context `context`, "spawn" by default) that import
    math-verify once. An item that takes longer than `timeout_s` has its worker
    killed and restarted and gets `error="timeout ..."`. A failed item (timeout,
    crash, unparseable reference, missing answer) gets `failure_score`,
    `correct=None` and the reason in `error`; otherwise `correct` is True/False.

    `verify_fn(gold, completion) -> bool` replaces the check; it must be a
    module-level function (it is pickled by reference into the workers), and so
    must `warm_up`, which each new worker runs once before taking items. Call
    `close()` (or use `with` / `async with`) to stop the workers.
    """

    def __init__(
        self,
        *,
        name: str = "math_verify",
        workers: int = 2,
        timeout_s: float = 10.0,
        correct_score: float = 1.0,
        incorrect_score: float = 0.0,
        failure_score: float = 0.0,
        verify_fn: Callable[[str, str], bool] = verify_answer,
        warm_up: Callable[[], None] | None = warm_up_math_verify,
        context: str = "spawn",
    ) -> None:
        self.name = name
        self.correct_score = correct_score
        self.incorrect_score = incorrect_score
        self.failure_score = failure_score
        self.pool = ProcessPool(
            verify_fn, num_workers=workers, timeout_s=timeout_s, init=warm_up, context=context
        )

    def start(self, wait: bool = False) -> None:
        """Start the worker processes now rather than on the first `score`.

        With `wait=True`, return only once every worker has imported math-verify.
        """
        self.pool.start(wait=wait)

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        """Check every completion against its task's answer, in parallel across workers."""
        results: list[RewardResult | None] = [None] * len(inputs)
        jobs: list[tuple[str, str]] = []
        job_rows: list[int] = []
        for row, item in enumerate(inputs):
            answer = item.task.answer
            if answer is None or not str(answer).strip():
                results[row] = self._failure(f"task {item.task.id!r} has no reference answer")
                continue
            jobs.append((normalize_gold_answer(str(answer)), item.completion_text))
            job_rows.append(row)
        outcomes = await asyncio.to_thread(self.pool.map, jobs) if jobs else []
        for row, outcome in zip(job_rows, outcomes, strict=True):
            results[row] = self._result(outcome)
        return [r for r in results if r is not None]

    def _result(self, outcome: Outcome) -> RewardResult:
        if outcome.error is not None:
            return self._failure(outcome.error)
        correct = bool(outcome.value)
        value = self.correct_score if correct else self.incorrect_score
        return RewardResult(score=value, components={self.name: value}, correct=correct)

    def _failure(self, error: str) -> RewardResult:
        return RewardResult(
            score=self.failure_score, components={self.name: self.failure_score}, error=error
        )

    def close(self) -> None:
        """Stop and reap the worker processes."""
        self.pool.close()

    def __enter__(self) -> MathVerifyReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MathVerifyReward:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
