"""`RemoteBackend`: rollouts made by worker processes (or Ray actors).

With ``orchestrator.backend = "process"`` or ``"ray"`` the orchestrator builds no
local engine. It holds one `RemoteBackend` (a `RolloutBackend`):

- its rollout source, `PoolRolloutSource` (``async groups(tasks, params, seed)``):
  each task's group is its own request to the pool, so groups spread over the
  workers and a dead worker costs only its own groups (they are retried
  elsewhere);
- its weight transport, a shared-memory ring: the loop publishes a version there
  and ``load_weights`` returns once every worker has loaded it; ``version``,
  ``max_context``, ``metrics`` (worker restarts and retries), ``close``. The
  workers own their caches, so there is no memory to release here.

Seeds: group i of a call with ``seed`` samples as it would locally (single-turn:
the same per-task seed, so a group does not depend on which worker made it or
how often it was retried). Env episodes get the per-request seed
``seed * 100003 + i`` (the local source spaces episodes differently, so the
samples differ from a local run's, but are as reproducible).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from temper.backends.base import Rollouts
from temper.backends.pool import WorkerPool
from temper.backends.process import WorkerSpec
from temper.backends.worker import BuildWorker
from temper.config import Config
from temper.engine.base import EngineAbilities, SamplingParams
from temper.errors import ConfigError
from temper.records import Task, Trajectory
from temper.rollout.sources import Groups
from temper.weights.choose import trainer_transport
from temper.weights.shm_ring import SharedMemoryRingTransport

#: Per-task seed spacing, as in `temper.rollout.single_turn.rollout_groups`.
_TASK_SEED_STRIDE = 100003
_LIVE: weakref.WeakSet[RemoteBackend] = weakref.WeakSet()


class PoolRolloutSource:
    """The rollout source over a worker pool: each task's group is one request."""

    def __init__(self, pool: WorkerPool, episodes: bool) -> None:
        self.pool, self.episodes = pool, episodes

    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[Groups, dict[str, float]]:
        """One group per task, each made by some worker; stats summed over requests
        (``time_generate_s`` is this call's wall time, generation and scoring)."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        futures: list[asyncio.Future[Any]] = []
        rids: list[int] = []
        try:
            for i, task in enumerate(tasks):
                fut = loop.create_future()
                futures.append(fut)
                rids.append(
                    self.pool.submit(
                        task.id, self._request(task, params, seed, i), _resolver(loop, fut)
                    )
                )
            replies = await asyncio.gather(*futures)
        finally:  # an error or a cancellation (async abort): drop the rest
            for rid, fut in zip(rids, futures, strict=False):
                if not fut.done():
                    self.pool.cancel(rid)
        groups: Groups = []
        for gid, reply in enumerate(replies):
            group = [Trajectory(**d) for d in reply["groups"][0]]
            for t in group:
                t.group_id = gid
            groups.append(group)
        wall = time.perf_counter() - t0
        stats = {
            "time_generate_s": wall,
            "time_reward_s": max(
                (r["stats"].get("time_reward_s", 0.0) for r in replies), default=0.0
            ),
            "reward_errors": sum(r["stats"].get("reward_errors", 0.0) for r in replies),
        }
        return groups, stats

    def _request(self, task: Task, params: SamplingParams, seed: int | None, i: int) -> tuple:
        if seed is None:
            return ([task], params, None)
        if self.episodes:
            return ([task], params, seed * _TASK_SEED_STRIDE + i)
        # Single-turn: the seed the local source would give task i (see the module doc).
        return ([task], replace(params, seed=seed * _TASK_SEED_STRIDE + i), None)


class RemoteBackend:
    """`RolloutBackend` over a pool of rollout workers; weights through a shm ring."""

    abilities = EngineAbilities(weight_updates=True, metrics=True)

    def __init__(
        self, pool: WorkerPool, ring: SharedMemoryRingTransport, rollouts: Rollouts
    ) -> None:
        self.pool, self.weights, self.rollouts = pool, ring, rollouts
        self._version = pool.target_version
        self.max_context = 0
        self._closed = False

    @classmethod
    def start(
        cls,
        cfg: Config,
        model_path: str,
        rollouts: Rollouts,
        build: BuildWorker,
        run_dir: Path | None = None,
    ) -> RemoteBackend:
        """Spawn ``orchestrator.rollout_workers`` worker processes for ``cfg``; wait until ready.

        ``model_path`` is what the workers build their engine from (the base model
        or the checkpoint being resumed), with ``build``. ``rollouts`` holds the
        run's tasks; its source is replaced by the pool's. Worker pid files go to
        ``run_dir/workers``.
        """
        o = cfg.orchestrator
        ring = trainer_transport("workers", cfg.run.name)
        spec = WorkerSpec(cfg, model_path, str(ring.root), 0, o.heartbeat_timeout_s / 5, build)
        pool = WorkerPool(
            spec,
            o.rollout_workers,
            heartbeat_timeout_s=o.heartbeat_timeout_s,
            max_retries=o.max_retries,
            pid_dir=run_dir / "workers" if run_dir is not None else None,
        )
        return cls(pool, ring, rollouts).started()

    def started(self) -> RemoteBackend:
        """Start the pool and wait until every worker is ready (shut down on failure)."""
        self.rollouts.source = PoolRolloutSource(self.pool, self.rollouts.env_spec is not None)
        _LIVE.add(self)
        try:
            self.max_context = int(self.pool.start()["max_context"])
        except BaseException:
            self._shutdown()
            raise
        return self

    @staticmethod
    def live() -> list[RemoteBackend]:
        """Every started, not yet closed instance in this process (tests use it)."""
        return [r for r in _LIVE if not r._closed]

    @property
    def version(self) -> int:
        """The weight version every worker holds."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        """Set on resume: the workers were built from that checkpoint; only the number moves."""
        self.pool.set_version(int(value))
        self._version = int(value)

    def load_weights(self, version: int) -> None:
        """Every worker loads ``version`` from the ring; returns once all hold it."""
        self.pool.set_version(version)
        self._version = version

    def set_worker_threads(self, threads: int) -> list[int]:
        """Every worker's torch threads (`orchestrator.placement = "auto"`); returns
        each worker's count as it reported it."""
        return self.pool.set_worker_threads(threads)

    def release_memory(self) -> bool:
        return False  # the workers' caches are theirs; nothing to free here

    def sleep(self) -> None:
        raise ConfigError("rollout workers do not sleep")

    def wake_up(self) -> None:
        raise ConfigError("rollout workers do not sleep")

    def metrics(self) -> dict[str, float]:
        """``workers/restarts_total``, ``workers/retries_total``, ``workers/hung_total``,
        ``workers/in_flight``."""
        return self.pool.metrics()

    async def close(self) -> None:
        """Stop the workers (graceful, then SIGKILL), remove the ring, close env and reward."""
        await asyncio.to_thread(self._shutdown)
        self.rollouts.close()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.pool.close()
        finally:
            self.weights.destroy()


def _resolver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any]) -> Any:
    """A pool callback that completes ``fut`` on its loop (thread-safe, at most once)."""

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def done(result: Any, error: BaseException | None) -> None:
        # A closed loop raises RuntimeError: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    return done


@atexit.register
def _close_all() -> None:
    """Never leave workers running: close any pool its owner forgot to close."""
    for backend in list(_LIVE):
        backend._shutdown()
