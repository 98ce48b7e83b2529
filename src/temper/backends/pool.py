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
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from temper.backends.process import WorkerProcess, WorkerSpec
from temper.backends.routing import Request, SupervisedPool, WorkerError


class WorkerPool(SupervisedPool):
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
        super().__init__(
            n,
            heartbeat_timeout_s=heartbeat_timeout_s,
            max_retries=max_retries,
            start_version=spec.start_version,
            start_timeout_s=start_timeout_s,
            log=log,
        )
        self.spec, self.pid_dir = spec, pid_dir
        self._ctx = multiprocessing.get_context("spawn")
        self._wake_r, self._wake_w = os.pipe()

    # ------------------------------------------------------------ public

    def _shut_down(self, workers: list[WorkerProcess], timeout_s: float) -> None:
        """Wake and join the supervisor, ask workers to close, SIGKILL any still alive
        after ``timeout_s``."""
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
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------ internals (hold the lock)

    def _spawn(self, index: int, generation: int) -> WorkerProcess:
        spec = replace(self.spec, start_version=self.target_version)
        return WorkerProcess(self._ctx, index, generation, spec, self.pid_dir)

    def _sync_version(self, w: WorkerProcess) -> None:
        if w.ready and not w.dead and w.version != self.target_version:
            w.send(("load_weights", -self.target_version - 1, self.target_version))

    def _send_threads(self, w: WorkerProcess, threads: int) -> None:
        w.send(("threads", 0, threads))

    def _cancel_sent(self, w: WorkerProcess, req: Request) -> None:
        w.send(("cancel", req.rid, None))

    def _send(self, w: WorkerProcess, req: Request) -> None:
        w.send(("groups", req.rid, req.body))

    # ------------------------------------------------------------ supervisor thread

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
            self._on_worker_ready(w)
            self._dispatch()
            self._lock.notify_all()
        elif kind == "threads":
            self._on_threads(w, body)
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
                self._start_failed(w, w.start_error or why, w.start_error is not None)
            if self._error is not None:
                return
            self._retry_and_replace(w, why, hung)
