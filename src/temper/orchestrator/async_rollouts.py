"""Asynchronous rollouts: keep generating while the trainer trains, within a staleness bound.

`AsyncRollouts` runs on the orchestrator's event loop next to the training
loop. It starts one group (one task, ``group_size`` samples) at a time through
the run's `RolloutSource`, keeps many in flight, and hands the trainer
``prompts_per_step`` of the groups that have *finished* (oldest weights first,
so fewer of them expire), so one slow episode (a long tool call, a long
answer) never holds up a step.

Staleness. The engine's weight version after training step s is s. Group
number g (counting from the run's first async step f) is meant for step
``f + g // prompts_per_step`` and may start only once the version is at least
that step minus ``1 + max_staleness``: the producer runs at most
``max_staleness`` steps ahead of the trainer. Because groups finish out of
order, the bound is also enforced on what is consumed: at step s the oldest
token of every group handed over was sampled at version >= s - 1 -
max_staleness. A finished group that is too old is *expired*: dropped and
its task started again. At a weight update, groups still in flight that will
be too old for the next step are cancelled and restarted at once.

Interruption (``interrupt``) decides what a weight update does to the other
groups in flight: ``"continue"`` lets them go on with the new weights (each
token records the version that sampled it), ``"abort"`` cancels and restarts
them so every group is sampled by one version. Restarted groups keep their
task and seed; nothing is lost or counted twice.

What it does not do: keep groups across a resume (in-flight and finished but
unconsumed groups are regenerated from new tasks after a restart), or bound
anything but staleness and the number of groups in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from temper.engine.base import SamplingParams
from temper.records import Task, Trajectory
from temper.rollout.sources import Groups, RolloutSource

Interrupt = Literal["continue", "abort"]


@dataclass(eq=False)
class _Job:
    """One group: its task and seed survive restarts."""

    task: Task
    seed: int
    slot: int  # the step this group was started for
    restarts: int = 0
    attempt: int = 0  # bumped at each launch; a superseded attempt's result is ignored
    start_version: int = -1
    handle: asyncio.Task[Any] | None = None


@dataclass
class _Finished:
    group: list[Trajectory]
    stats: dict[str, float]
    job: _Job
    #: The oldest weight version that sampled a token of the group (its staleness anchor).
    oldest: int


class BusyClock:
    """Wall time during which at least one group was in flight (the rollout side busy)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._since: float | None = None
        self._reported = 0.0

    def update(self, busy: bool) -> None:
        now = time.perf_counter()
        if busy and self._since is None:
            self._since = now
        elif not busy and self._since is not None:
            self.total += now - self._since
            self._since = None

    def lap(self) -> float:
        """Busy seconds since the previous lap."""
        now = time.perf_counter()
        total = self.total + (now - self._since if self._since is not None else 0.0)
        lap, self._reported = total - self._reported, total
        return lap


@dataclass
class AsyncStats:
    """Counters since the start of the run (`AsyncRollouts.metrics` reports them)."""

    started: int = 0
    finished: int = 0
    expired: int = 0
    aborted: int = 0
    consumed: int = 0
    staleness: Counter[int] = field(default_factory=Counter)


class AsyncRollouts:
    """Background group producer for asynchronous off-policy training.

    ``next_task()`` returns the next training task; ``version()`` the engine's
    current weight version. Call `start` once on the running loop, `take`
    once per step (in step order), `weights_updated` after every weight
    update, and `close` at the end.
    """

    def __init__(
        self,
        source: RolloutSource,
        next_task: Callable[[], Task],
        params: SamplingParams,
        *,
        prompts_per_step: int,
        max_staleness: int,
        interrupt: Interrupt,
        seed: int,
        version: Callable[[], int],
    ) -> None:
        if max_staleness < 0 or prompts_per_step < 1:
            raise ValueError("need max_staleness >= 0 and prompts_per_step >= 1")
        self.source, self.next_task, self.params = source, next_task, params
        self.prompts_per_step, self.max_staleness = prompts_per_step, max_staleness
        self.interrupt, self.seed, self.version = interrupt, seed, version
        self.stats = AsyncStats()
        self.busy = BusyClock()
        self._first_step = 1
        self._next_group = 0
        self._in_flight: set[_Job] = set()
        self._restart: list[_Job] = []
        self._done: list[_Finished] = []
        self._error: BaseException | None = None
        self._changed = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ public
    def start(self, first_step: int) -> None:
        """Begin producing groups for steps ``first_step, first_step + 1, ...``."""
        self._first_step = first_step
        self._filler = asyncio.get_running_loop().create_task(self._fill(), name="temper-async")

    async def take(self, step: int) -> tuple[Groups, dict[str, float]]:
        """``prompts_per_step`` finished groups fresh enough for ``step``, oldest first."""
        waited_from = time.perf_counter()
        oldest_allowed = step - 1 - self.max_staleness
        while True:
            if self._error is not None:
                raise self._error
            self._expire(oldest_allowed)
            if len(self._done) >= self.prompts_per_step:
                break
            self._changed.clear()
            await self._changed.wait()
        # Oldest first (stable, so finish order among equals): a finished group that
        # would be too old for the next step is trained now instead of thrown away.
        self._done.sort(key=lambda item: item.oldest)
        taken, self._done = self._done[: self.prompts_per_step], self._done[self.prompts_per_step :]
        self._changed.set()
        groups = []
        for gid, item in enumerate(taken):
            for t in item.group:
                t.group_id = gid
            groups.append(item.group)
            self.stats.staleness[step - 1 - item.oldest] += 1
        self.stats.consumed += len(taken)
        waited = time.perf_counter() - waited_from
        stats = {
            "time_generate_s": waited,
            "time_reward_s": 0.0,
            # What the rollout side spent generating (and scoring) while this step's
            # batch was made: the stage model's rollout time for an async step.
            "time_rollout_busy_s": self.busy.lap(),
            "reward_errors": sum(item.stats.get("reward_errors", 0.0) for item in taken),
        }
        return groups, stats

    def weights_updated(self, version: int) -> None:
        """Apply the interrupt policy after the engine moved to ``version``."""
        oldest_allowed = version - self.max_staleness  # what the next step accepts
        for job in list(self._in_flight):
            if self.interrupt == "abort" or job.start_version < oldest_allowed:
                self._cancel(job, expired=job.start_version < oldest_allowed)
        self._changed.set()

    def metrics(self) -> dict[str, float]:
        s = self.stats
        return {
            "async/in_flight": float(len(self._in_flight)),
            "async/ready": float(len(self._done)),
            "async/expired_total": float(s.expired),
            "async/aborted_total": float(s.aborted),
            "async/started_total": float(s.started),
        }

    async def close(self) -> None:
        """Cancel the producer and every group in flight, and wait for them to end."""
        self._closed = True
        handles = [j.handle for j in self._in_flight if j.handle is not None]
        if self._filler is not None:
            handles.append(self._filler)
        for h in handles:
            h.cancel()
        for h in handles:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await h
        self._in_flight.clear()

    # ------------------------------------------------------------------ producer
    async def _fill(self) -> None:
        while not self._closed:
            while self._restart:
                self._launch(self._restart.pop(0))
            while self._may_start_new():
                slot = self._first_step + self._next_group // self.prompts_per_step
                job = _Job(self.next_task(), self.seed + self._next_group, slot)
                self._next_group += 1
                self._launch(job)
            self._changed.clear()
            await self._changed.wait()

    def _may_start_new(self) -> bool:
        slot = self._first_step + self._next_group // self.prompts_per_step
        return self.version() >= slot - 1 - self.max_staleness

    def _launch(self, job: _Job) -> None:
        job.start_version = self.version()
        job.attempt += 1
        job.handle = asyncio.get_running_loop().create_task(self._run(job, job.attempt))
        self._in_flight.add(job)
        self.busy.update(True)
        self.stats.started += 1

    async def _run(self, job: _Job, attempt: int) -> None:
        try:
            groups, stats = await self.source.groups([job.task], self.params, seed=job.seed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the run fails as a synchronous one would
            self._error = exc
        else:
            if attempt == job.attempt:
                self.stats.finished += 1
                group = groups[0]
                self._done.append(_Finished(group, stats, job, _oldest_version(group, job)))
        finally:
            if attempt == job.attempt:
                self._in_flight.discard(job)
            self.busy.update(bool(self._in_flight))
            self._changed.set()

    def _cancel(self, job: _Job, expired: bool) -> None:
        if job.handle is not None:
            job.handle.cancel()
        self._in_flight.discard(job)
        self.busy.update(bool(self._in_flight))
        job.restarts += 1
        self._restart.append(job)
        if expired:
            self.stats.expired += 1
        else:
            self.stats.aborted += 1

    def _expire(self, oldest_allowed: int) -> None:
        """Restart finished groups whose oldest token is older than ``oldest_allowed``."""
        fresh = []
        for item in self._done:
            if item.oldest < oldest_allowed:
                item.job.restarts += 1
                self._restart.append(item.job)
                self.stats.expired += 1
            else:
                fresh.append(item)
        if len(fresh) != len(self._done):
            self._done = fresh
            self._changed.set()


def _oldest_version(group: list[Trajectory], job: _Job) -> int:
    """The oldest weight version that sampled a token of ``group``; the group's start
    version when it sampled nothing (an env that failed at reset)."""
    versions = [v for t in group for v, m in zip(t.versions, t.loss_mask, strict=True) if m]
    return min(versions, default=job.start_version)
