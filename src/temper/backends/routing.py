"""`SupervisedPool`: the request bookkeeping that `WorkerPool` and `RayWorkerPool` share.

A pool keeps ``n`` worker slots and a table of requests. This base class owns
that table and the rules both pools follow: requests go to the least-loaded
worker that is ready and holds the pool's weight version; a worker that died
has its in-flight requests requeued (front of the queue, ``retries + 1``) or
failed once past ``max_retries``, and its slot gets a new worker; a worker
that fails to start too often (or with a build error at its first start)
fails the whole pool. The public life cycle (`start`, `submit`, `cancel`,
`set_version`, `close`) is here too. How requests reach a worker, how deaths
are noticed, how workers start, take weights, drop a request and stop is each
subclass's own business (`_send`, `_watch`, `_spawn`, `_stage_weights`,
`_sync_version`, `_cancel_sent`, `_shut_down`).

Methods named ``_...`` expect the caller to hold ``self._lock``.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temper.errors import TemperError

Done = Callable[[Any, BaseException | None], None]


class WorkerError(TemperError):
    """Rollout workers failed beyond what `orchestrator.max_retries` allows."""


@dataclass(eq=False)
class Request:
    rid: int
    label: str  # the task id, for error messages
    body: Any
    done: Done
    retries: int = 0
    worker: Any = None
    ref: Any = None  # the transport's handle on the call in flight, if it has one


@dataclass
class PoolStats:
    """Counters since the pool started (`SupervisedPool.metrics` reports them)."""

    restarts: int = 0
    retries: int = 0
    hung: int = 0
    stale_results: int = 0
    failed_starts: dict[int, int] = field(default_factory=dict)


class SupervisedPool:
    """Request table, routing and retry rules over ``n`` worker slots (see the module doc).

    Workers are objects with ``index``, ``generation``, ``pid``, ``ready``, ``dead``,
    ``version``, ``threads``, ``info`` and ``in_flight`` (a set of request ids).
    """

    #: Names the supervisor in the error raised when its own loop crashes.
    supervisor_name = "rollout worker supervisor"
    #: Name of the supervisor thread.
    thread_name = "temper-pool"

    def __init__(
        self,
        n: int,
        *,
        heartbeat_timeout_s: float,
        max_retries: int,
        start_version: int,
        start_timeout_s: float | None,
        log: Callable[[str], None] | None,
    ) -> None:
        self.n = n
        self.heartbeat_timeout_s, self.max_retries = heartbeat_timeout_s, max_retries
        # Starting means loading torch and a model (and, on Ray, waiting for resources),
        # which can stall for a long while: starting workers get more time than ready ones.
        self.start_timeout_s = start_timeout_s or max(3 * heartbeat_timeout_s, 120.0)
        self.log = log or (lambda line: print(f"temper: {line}", file=sys.stderr, flush=True))
        self.stats = PoolStats()
        self.target_version = start_version
        #: Torch threads every worker is told to use (`set_worker_threads`); None: as built.
        self.worker_threads: int | None = None
        self._lock = threading.Condition()
        self._workers: list[Any] = []
        self._requests: dict[int, Request] = {}
        self._pending: deque[Request] = deque()
        self._next_rid = 1
        self._rr = 0
        self._error: WorkerError | None = None
        self._closing = False
        #: What `_stage_weights` made of ``target_version`` (Ray: an object ref), for `_spawn`.
        self.staged_weights: Any = None
        self._thread = threading.Thread(target=self._supervise, daemon=True, name=self.thread_name)

    # ------------------------------------------------------------ subclass hooks

    def _send(self, w: Any, req: Request) -> None:
        """Send ``req`` to worker ``w`` (lock held)."""
        raise NotImplementedError

    def _spawn(self, index: int, generation: int) -> Any:
        """Start a worker for slot ``index`` (lock held)."""
        raise NotImplementedError

    def _watch(self) -> None:
        """The supervisor loop: collect results, notice deaths and hangs, until closing."""
        raise NotImplementedError

    def _sync_version(self, w: Any) -> None:
        """Have worker ``w`` load ``target_version`` if it is ready and behind (lock held)."""
        raise NotImplementedError

    def _cancel_sent(self, w: Any, req: Request) -> None:
        """Tell worker ``w`` to drop ``req``, which it was sent (lock held)."""
        raise NotImplementedError

    def _send_threads(self, w: Any, threads: int) -> None:
        """Tell worker ``w`` to use ``threads`` torch threads (lock held); its reply
        goes to `_on_threads`."""
        raise NotImplementedError

    def _stage_weights(self, version: int) -> Any:
        """Prepare weights ``version`` for the workers before `set_version` takes the lock."""
        return None

    def _shut_down(self, workers: list[Any], timeout_s: float) -> None:
        """Stop the supervisor thread and ``workers`` (lock not held; `close` is under way)."""
        raise NotImplementedError

    # ------------------------------------------------------------ public

    def start(self) -> dict[str, Any]:
        """Start the workers and wait until all are ready; returns the first one's info."""
        with self._lock:
            self._workers = [self._spawn(i, 0) for i in range(self.n)]
        self._thread.start()
        with self._lock:
            self._wait_until(lambda: all(w.ready for w in self._workers))
            return dict(self._workers[0].info)

    def cancel(self, rid: int) -> None:
        """Forget request ``rid`` (no-op once it finished); its worker drops it."""
        with self._lock:
            req = self._requests.pop(rid, None)
            if req is None:
                return
            if req.worker is None:
                self._pending.remove(req)
            else:
                req.worker.in_flight.discard(rid)
                self._cancel_sent(req.worker, req)

    def set_version(self, version: int) -> None:
        """Make every worker hold weights ``version`` (already published, or the start
        weights when nothing was); blocks until all have it. Workers that restart
        meanwhile load it when they come up."""
        staged = self._stage_weights(version)
        with self._lock:
            self._raise_if_failed()
            self.target_version = version
            self.staged_weights = staged
            for w in self._workers:
                self._sync_version(w)
            self._wait_until(lambda: all(w.ready and w.version == version for w in self._workers))
            self._dispatch()

    def set_worker_threads(self, threads: int) -> list[int]:
        """Have every worker (and every one that restarts later) use ``threads`` torch
        threads (`orchestrator.placement = "auto"`); blocks until each ready worker
        reports the count its compute thread now has, and returns those counts."""
        n = int(threads)
        with self._lock:
            self._raise_if_failed()
            self.worker_threads = n
            for w in self._workers:
                if w.ready and not w.dead:
                    self._send_threads(w, n)
            self._wait_until(lambda: all(w.threads == n for w in self._workers if w.ready))
            return [w.threads for w in self._workers]

    def _on_worker_ready(self, w: Any) -> None:
        """Bring a worker that just came up to the pool's weights and threads (lock held)."""
        w.threads = w.info.get("threads")
        if self.worker_threads is not None and w.threads != self.worker_threads:
            self._send_threads(w, self.worker_threads)
        self._sync_version(w)

    def _on_threads(self, w: Any, threads: int) -> None:
        """Worker ``w`` reports its torch threads (lock held)."""
        w.threads = int(threads)
        self._lock.notify_all()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the supervisor and the workers (killed after ``timeout_s``); fail
        requests still pending. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            workers = list(self._workers)
            orphans = list(self._requests.values())
            self._requests.clear()
            self._pending.clear()
        self._shut_down(workers, timeout_s)
        for req in orphans:
            req.done(None, WorkerError(f"rollout request for task {req.label!r}: pool closed"))

    def pids(self) -> list[int]:
        """The current workers' process ids."""
        with self._lock:
            return [w.pid for w in self._workers]

    def in_flight(self) -> dict[int, int]:
        """Requests in flight per worker pid."""
        with self._lock:
            return {w.pid: len(w.in_flight) for w in self._workers}

    def submit(self, label: str, body: Any, done: Done) -> int:
        """Queue a ``groups`` request; ``done(result, error)`` is called once, on the
        supervisor (or calling) thread. Returns the request id."""
        with self._lock:
            self._raise_if_failed()
            rid = self._next_rid
            self._next_rid += 1
            req = Request(rid, label, body, done)
            self._requests[rid] = req
            self._pending.append(req)
            self._dispatch()
        return rid

    def metrics(self) -> dict[str, float]:
        s = self.stats
        with self._lock:
            in_flight = sum(len(w.in_flight) for w in self._workers)
        return {
            "workers/restarts_total": float(s.restarts),
            "workers/retries_total": float(s.retries),
            "workers/hung_total": float(s.hung),
            "workers/in_flight": float(in_flight),
        }

    # ------------------------------------------------------------ internals (hold the lock)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Block (lock held, released while waiting) until ``ready()``; raise a pool error."""
        while not ready():
            self._raise_if_failed()
            self._lock.wait(0.5)

    def _dispatch(self) -> None:
        """Send pending requests to ready, up-to-date workers, least loaded first."""
        while self._pending:
            ok = [
                w
                for w in self._workers
                if w.ready and not w.dead and w.version == self.target_version
            ]
            if not ok:
                return
            self._rr += 1
            w = min(ok, key=lambda w: (len(w.in_flight), (w.index - self._rr) % self.n))
            req = self._pending.popleft()
            req.worker = w
            w.in_flight.add(req.rid)
            self._send(w, req)

    def _fail(self, error: WorkerError) -> None:
        """A fatal pool error: every request fails with it, later calls raise it."""
        self._error = error
        for req in list(self._requests.values()):
            req.done(None, error)
        self._requests.clear()
        self._pending.clear()
        for w in self._workers:
            w.in_flight.clear()
        self._lock.notify_all()

    def _supervise(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # a bug here must fail the run, not hang it
            traceback.print_exc()
            with self._lock:
                self._fail(WorkerError(f"{self.supervisor_name} crashed: {exc!r}"))

    def _start_failed(self, w: Any, why: str, build_error: bool) -> None:
        """Count a failed start of ``w``; fail the pool past ``max_retries``, or at once
        on a build error at the first start (a bad config or model would only repeat)."""
        n = self.stats.failed_starts.get(w.index, 0) + 1
        self.stats.failed_starts[w.index] = n
        if (w.generation == 0 and build_error) or n > self.max_retries:
            self._fail(WorkerError(f"rollout {w} failed to start ({n}x): {why}"))

    def _retry_and_replace(self, w: Any, why: str, hung: bool) -> None:
        """After ``w`` died: requeue its requests (or fail those out of retries), start a
        new worker in its slot. The caller has marked it dead and stopped it."""
        requeue = [self._requests[rid] for rid in sorted(w.in_flight) if rid in self._requests]
        w.in_flight.clear()
        for req in reversed(requeue):
            req.worker, req.ref = None, None
            req.retries += 1
            if req.retries > self.max_retries:
                del self._requests[req.rid]
                req.done(None, self._out_of_retries(req, w, why))
            else:
                self.stats.retries += 1
                self._pending.appendleft(req)
        self.log(
            f"rollout {w} {'hung' if hung else 'died'} ({why}); restarting it, "
            f"{len(requeue)} request(s) to retry"
        )
        self._workers[w.index] = self._spawn(w.index, w.generation + 1)
        self.stats.restarts += 1
        self._dispatch()
        self._lock.notify_all()

    def _out_of_retries(self, req: Request, w: Any, why: str) -> WorkerError:
        return WorkerError(
            f"rollout request for task {req.label!r} failed: its worker died "
            f"{req.retries} time(s), more than orchestrator.max_retries = {self.max_retries} "
            f"(last: {w}, {why})"
        )
