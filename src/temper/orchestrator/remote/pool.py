"""`WorkerPool`: keeps `n` rollout worker processes alive and routes requests to them.

One supervisor thread reads every worker's pipe and watches its process
sentinel and heartbeats. Requests are sent to the least-loaded worker that is
ready and holds the pool's current weight version.

Fault tolerance:

- **Dead worker** (EOF on its pipe or its process exited: SIGKILL, OOM, a
  crash): results it sent before dying are kept; its other in-flight requests
  go back to the front of the queue with ``retries + 1`` and a new process takes
  its slot (it loads the ring's newest weights before it is ready).
- **Hung worker**: no message for ``heartbeat_timeout_s`` once ready (or for
  ``start_timeout_s`` while starting): SIGKILLed, then handled as dead.
- A request retried more than ``max_retries`` times fails with `WorkerError`
  naming its label (the task id). A worker that fails to build more than
  ``max_retries`` times in a row, or that reports a build error at the first
  start, fails the pool.
- **Exactly once**: a result is accepted only from the worker the request is
  currently assigned to, and only once; anything else is counted and dropped.

What it does not do: retry requests that *raised* inside a worker (a bad
prompt, a reward bug): those fail as they would in one process.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from temper.errors import TemperError
from temper.orchestrator.remote.process import WorkerProcess, WorkerSpec

Done = Callable[[Any, BaseException | None], None]


class WorkerError(TemperError):
    """Rollout workers failed beyond what `orchestrator.max_retries` allows."""


@dataclass(eq=False)
class _Request:
    rid: int
    label: str
    body: Any
    done: Done
    retries: int = 0
    worker: WorkerProcess | None = None


@dataclass
class PoolStats:
    """Counters since the pool started (`WorkerPool.metrics` reports them)."""

    restarts: int = 0
    retries: int = 0
    hung: int = 0
    stale_results: int = 0
    failed_starts: dict[int, int] = field(default_factory=dict)


class WorkerPool:
    """`n` supervised worker processes built from ``spec`` (see the module doc).

    `start` blocks until every worker is ready; `submit` / `cancel` / `set_version`
    may be called from any thread; `close` stops everything and reaps it.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        n: int,
        *,
        heartbeat_timeout_s: float,
        max_retries: int,
        pid_dir: Path | None = None,
        start_timeout_s: float | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.spec, self.n = spec, n
        self.heartbeat_timeout_s, self.max_retries = heartbeat_timeout_s, max_retries
        # Loading torch and a model on a busy machine can stall a process for a long
        # while before its heartbeat thread runs: starting workers get more time.
        self.start_timeout_s = start_timeout_s or max(3 * heartbeat_timeout_s, 120.0)
        self.pid_dir = pid_dir
        self.log = log or (lambda line: print(f"temper: {line}", file=sys.stderr, flush=True))
        self.stats = PoolStats()
        self.target_version = spec.start_version
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Condition()
        self._workers: list[WorkerProcess] = []
        self._requests: dict[int, _Request] = {}
        self._pending: deque[_Request] = deque()
        self._next_rid = 1
        self._rr = 0
        self._error: WorkerError | None = None
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="temper-pool")

    # ------------------------------------------------------------ public

    def start(self) -> dict[str, Any]:
        """Spawn the workers and wait until all are ready; returns the first one's info."""
        with self._lock:
            self._workers = [self._spawn(i, 0) for i in range(self.n)]
        self._thread.start()
        with self._lock:
            while not all(w.ready for w in self._workers):
                self._raise_if_failed()
                self._lock.wait(0.5)
            return dict(self._workers[0].info)

    def pids(self) -> list[int]:
        """The current worker processes' ids."""
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
            req = _Request(rid, label, body, done)
            self._requests[rid] = req
            self._pending.append(req)
            self._dispatch()
        return rid

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
                req.worker.send(("cancel", rid, None))

    def set_version(self, version: int) -> None:
        """Make every worker hold weights ``version`` (already in the ring, or the start
        weights when nothing was published); blocks until all have it. Workers that
        restart meanwhile load it when they come up."""
        with self._lock:
            self.target_version = version
            for w in self._workers:
                self._sync_version(w)
            while not all(w.ready and w.version == version for w in self._workers):
                self._raise_if_failed()
                self._lock.wait(0.5)
            self._dispatch()

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

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the supervisor, ask workers to close, SIGKILL any still alive after
        ``timeout_s``; fail requests still pending. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            workers = list(self._workers)
            orphans = list(self._requests.values())
            self._requests.clear()
            self._pending.clear()
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for w in workers:
            if not w.ready:
                w.kill()  # still building: it would not read "close" for a while
            elif not w.dead:
                w.stop()
        deadline = time.monotonic() + timeout_s
        for w in workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            w.kill()
        for req in orphans:
            req.done(None, WorkerError(f"rollout request for task {req.label!r}: pool closed"))
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------ internals (hold the lock)

    def _spawn(self, index: int, generation: int) -> WorkerProcess:
        spec = replace(self.spec, start_version=self.target_version)
        return WorkerProcess(self._ctx, index, generation, spec, self.pid_dir)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _sync_version(self, w: WorkerProcess) -> None:
        if w.ready and not w.dead and w.version != self.target_version:
            w.send(("load_weights", -self.target_version - 1, self.target_version))

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
            w.send(("groups", req.rid, req.body))

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

    # ------------------------------------------------------------ supervisor thread

    def _supervise(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # a bug here must fail the run, not hang it
            traceback.print_exc()
            with self._lock:
                self._fail(WorkerError(f"rollout worker supervisor crashed: {exc!r}"))

    def _watch(self) -> None:
        tick = min(0.5, self.heartbeat_timeout_s / 10)
        while True:
            with self._lock:
                if self._closing:
                    return
                live = [w for w in self._workers if not w.dead]
            watch: dict[Any, WorkerProcess] = {w.conn: w for w in live}
            watch.update({w.process.sentinel: w for w in live})
            for ready in wait([*watch, self._wake_r], timeout=tick):
                if ready == self._wake_r:
                    os.read(self._wake_r, 64)
                    continue
                w = watch[ready]
                self._drain(w)
                if ready != w.conn or not w.process.is_alive():
                    self._died(w, None, hung=False)
            self._check_heartbeats()

    def _drain(self, w: WorkerProcess) -> None:
        """Handle every message waiting on ``w``'s pipe (results sent before a death count)."""
        try:
            while not w.dead and w.conn.poll():
                msg = w.conn.recv()
                with self._lock:
                    self._on_message(w, msg)
        except (EOFError, OSError):
            self._died(w, None, hung=False)

    def _on_message(self, w: WorkerProcess, msg: tuple[str, int, Any]) -> None:
        kind, rid, body = msg
        w.last_seen = time.monotonic()
        if kind == "ready":
            w.ready, w.info, w.version = True, body, body["version"]
            self.stats.failed_starts.pop(w.index, None)
            self._sync_version(w)
            self._dispatch()
            self._lock.notify_all()
        elif kind == "failed":
            w.start_error = str(body)  # the exit that follows is handled in _died
        elif rid < 0:  # a load_weights reply
            if kind == "error":
                self._fail(WorkerError(f"{w} could not load weights: {body}"))
                return
            w.version = int(body)
            self._dispatch()
            self._lock.notify_all()
        elif kind in ("result", "error"):
            req = self._requests.get(rid)
            w.in_flight.discard(rid)
            if req is None or req.worker is not w:
                self.stats.stale_results += 1  # cancelled, or superseded by a retry
                return
            del self._requests[rid]
            self._dispatch()
            if kind == "result":
                req.done(body, None)
            else:
                req.done(None, body)

    def _start_failed(self, w: WorkerProcess, why: str) -> None:
        n = self.stats.failed_starts.get(w.index, 0) + 1
        self.stats.failed_starts[w.index] = n
        # A build error at the first start (a bad config or model) would only repeat.
        if (w.generation == 0 and w.start_error is not None) or n > self.max_retries:
            self._fail(WorkerError(f"rollout {w} failed to start ({n}x): {why}"))

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [
                w
                for w in self._workers
                if not w.dead
                and now - w.last_seen
                > (self.heartbeat_timeout_s if w.ready else self.start_timeout_s)
            ]
        for w in late:
            self._died(w, f"no heartbeat for {now - w.last_seen:.1f}s", hung=True)

    def _died(self, w: WorkerProcess, why: str | None, hung: bool) -> None:
        """Kill and replace ``w``; requeue its requests or fail those out of retries.

        ``why`` None: it exited; the reason is read once it is reaped."""
        with self._lock:
            if w.dead or self._closing:
                return
            w.dead = True
            w.kill()  # SIGKILL + reap (a hung one is still running)
            why = why or w.exit_reason()
            self.stats.hung += hung
            if not w.ready and self._error is None:
                self._start_failed(w, w.start_error or why)
            if self._error is not None:
                return
            requeue = [self._requests[rid] for rid in sorted(w.in_flight) if rid in self._requests]
            w.in_flight.clear()
            for req in reversed(requeue):
                req.worker = None
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

    def _out_of_retries(self, req: _Request, w: WorkerProcess, why: str) -> WorkerError:
        return WorkerError(
            f"rollout request for task {req.label!r} failed: its worker died "
            f"{req.retries} time(s), more than orchestrator.max_retries = {self.max_retries} "
            f"(last: {w}, {why})"
        )
