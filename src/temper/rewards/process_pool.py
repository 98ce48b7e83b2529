"""A small pool of persistent worker processes with a hard timeout per item.

Each worker is a separate process ("spawn" by default, safe when the parent has
threads) that runs one picklable, module-level function over the argument tuples
it is sent, one at a time. If an item runs past its timeout the worker is killed
(SIGKILL), reaped and replaced, and that item gets an `Outcome` whose `error`
starts with "timeout". A worker that dies mid-item is replaced the same way. The
timeout is enforced from the parent, so it works from any thread, unlike
`signal.alarm`.

`map` is synchronous and thread-safe; call it through `asyncio.to_thread` from
async code.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

#: How long map() waits between checks for idle workers freed by other threads.
_POLL_S = 0.05
#: map() raises after this many fresh workers in a row fail to start.
_MAX_FAILED_STARTS = 3


@dataclass
class Outcome:
    """The result of one item: `value` on success, else `error` (one line)."""

    value: Any = None
    error: str | None = None


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _worker_main(conn: Connection, fn: Callable[..., Any], init: Callable[[], None] | None) -> None:
    """Worker loop: run `init` once, say "ready", then answer each argument tuple."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if init is not None:
        init()
    conn.send(("ready", None))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        if args is None:
            return
        try:
            reply = ("ok", fn(*args))
        except Exception as exc:
            reply = ("error", _one_line(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send(("error", f"cannot send result back: {_one_line(exc)}"))


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[..., Any], init: Callable[[], None] | None) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, fn, init), daemon=True)
        self.proc.start()
        child_conn.close()
        self.ready = False

    def stop(self, grace_s: float) -> None:
        """Ask the worker to exit, kill it if it does not within `grace_s`, and reap it."""
        if grace_s > 0 and self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(grace_s)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


@dataclass
class _Job:
    index: int
    worker: _Worker
    deadline: float


def _stop_all(workers: list[_Worker]) -> None:
    for worker in list(workers):
        worker.stop(grace_s=1.0)
    workers.clear()


class ProcessPool:
    """`num_workers` persistent processes running `fn(*args)` with a per-item timeout.

    `init`, if given, runs once in each new worker before it takes work (for
    example to import heavy modules); the time a fresh worker takes to start, up
    to `start_timeout_s`, does not count against an item's `timeout_s`. Workers are
    started on first use or by `start()`; a worker is handed its first item only
    after it reports that `init` is done. `close()` stops and reaps them all; the
    pool is also closed when garbage-collected and at interpreter exit.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        start_timeout_s: float = 60.0,
        init: Callable[[], None] | None = None,
        context: str = "spawn",
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.fn = fn
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._init = init
        self._ctx = multiprocessing.get_context(context)
        self._cond = threading.Condition()
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []
        self._closed = False
        #: How many workers were killed and replaced (timeouts and crashes).
        self.restarts = 0
        self._failed_starts_in_a_row = 0
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    # -- lifecycle -------------------------------------------------------------

    def start(self, wait: bool = False) -> None:
        """Start the workers now instead of on the first `map`.

        With `wait=True`, block until every worker has finished `init`; raise
        RuntimeError if one fails to.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("ProcessPool is closed")
            while len(self._workers) < self.num_workers:
                self._add_worker()
            fresh = [w for w in self._idle if not w.ready] if wait else []
            for worker in fresh:
                self._idle.remove(worker)
        failures = []
        for worker in fresh:
            error = self._ensure_ready(worker)
            if error is None:
                self._release(worker)
            else:
                self._replace(worker)
                failures.append(error)
        if failures:
            raise RuntimeError(f"worker process failed to start: {failures[0]}")

    def close(self) -> None:
        """Stop every worker and wait for it to exit (no zombies left behind)."""
        with self._cond:
            self._closed = True
            self._idle.clear()
            self._cond.notify_all()
        self._finalizer()

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        with self._cond:
            return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def _add_worker(self) -> _Worker:
        worker = _Worker(self._ctx, self.fn, self._init)
        self._workers.append(worker)
        self._idle.append(worker)
        self._cond.notify()
        return worker

    def _acquire(self, block: bool) -> _Worker | None:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("ProcessPool is closed")
                if self._idle:
                    ready = [w for w in self._idle if w.ready]
                    worker = ready[-1] if ready else self._idle[-1]
                    self._idle.remove(worker)
                    return worker
                if len(self._workers) < self.num_workers:
                    self._add_worker()
                    continue
                if not block:
                    return None
                self._cond.wait()

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if worker in self._workers and not self._closed:
                self._idle.append(worker)
                self._cond.notify()

    def _replace(self, worker: _Worker) -> None:
        """Kill a stuck or dead worker, reap it, and start a fresh one in its place."""
        worker.stop(grace_s=0)
        with self._cond:
            if worker in self._workers:
                self._workers.remove(worker)
            self.restarts += 1
            if not self._closed:
                self._add_worker()

    # -- work --------------------------------------------------------------------

    def map(self, items: Sequence[tuple[Any, ...]]) -> list[Outcome]:
        """Run `fn(*args)` for each argument tuple, in parallel; one `Outcome` per item."""
        results: list[Outcome | None] = [None] * len(items)
        pending = deque(range(len(items)))
        running: dict[Connection, _Job] = {}
        failed_starts: dict[int, int] = {}
        while pending or running:
            self._dispatch(items, pending, running, results, failed_starts)
            if not running:
                continue
            wait_s = min(job.deadline for job in running.values()) - time.monotonic()
            if pending:
                wait_s = min(wait_s, _POLL_S)
            for conn in wait(list(running), timeout=max(wait_s, 0.0)):
                self._collect(running.pop(conn), results)
            self._expire(running, results)
        return [r if r is not None else Outcome(error="internal error: no result") for r in results]

    def _dispatch(
        self,
        items: Sequence[tuple[Any, ...]],
        pending: deque[int],
        running: dict[Connection, _Job],
        results: list[Outcome | None],
        failed_starts: dict[int, int],
    ) -> None:
        """Send pending items to idle workers; block for one only if nothing is running.

        While other items run, a worker that is still starting is passed over
        rather than waited for.
        An item whose worker turns out dead or never starts is retried once on a
        fresh worker before it is recorded as failed.
        """
        while pending:
            worker = self._acquire(block=not running)
            if worker is None:
                return
            if not worker.ready and running and not worker.conn.poll(0):
                self._release(worker)  # still starting: look again on the next round
                return
            index = pending.popleft()
            try:
                payload = ForkingPickler.dumps(items[index])
            except Exception as exc:
                self._release(worker)
                results[index] = Outcome(error=f"cannot send item: {_one_line(exc)}")
                continue
            error = self._ensure_ready(worker)
            if error is None:
                try:
                    worker.conn.send_bytes(payload)
                except OSError as exc:
                    error = f"worker died before taking the item ({exc})"
            if error is not None:
                self._replace(worker)
                self._check_start_failures(error)
                failed_starts[index] = failed_starts.get(index, 0) + 1
                if failed_starts[index] < 2:
                    pending.appendleft(index)
                else:
                    results[index] = Outcome(error=error)
                continue
            running[worker.conn] = _Job(index, worker, time.monotonic() + self.timeout_s)

    def _ensure_ready(self, worker: _Worker) -> str | None:
        """Wait for a fresh worker's "ready" message; return an error line if it never comes."""
        if worker.ready:
            return None
        try:
            if not worker.conn.poll(self.start_timeout_s):
                return f"timeout: worker did not start within {self.start_timeout_s:g}s"
            kind, _ = worker.conn.recv()
        except (EOFError, OSError):
            worker.proc.join(1.0)
            return f"worker crashed while starting (exit code {worker.proc.exitcode})"
        worker.ready = kind == "ready"
        if worker.ready:
            self._failed_starts_in_a_row = 0
            return None
        return f"worker sent {kind!r} before 'ready'"

    def _check_start_failures(self, error: str) -> None:
        """Stop with an exception when fresh workers keep failing to start."""
        self._failed_starts_in_a_row += 1
        if self._failed_starts_in_a_row >= _MAX_FAILED_STARTS:
            self._failed_starts_in_a_row = 0
            raise RuntimeError(
                f"{_MAX_FAILED_STARTS} worker processes in a row failed to start (last: {error}); "
                "check that the worker function and its module import cleanly in a fresh "
                "process and that the main script is guarded by `if __name__ == '__main__':`"
            )

    def _collect(self, job: _Job, results: list[Outcome | None]) -> None:
        try:
            kind, payload = job.worker.conn.recv()
        except (EOFError, OSError):
            job.worker.proc.join(1.0)
            code = job.worker.proc.exitcode
            self._replace(job.worker)
            results[job.index] = Outcome(error=f"worker crashed (exit code {code})")
            return
        self._release(job.worker)
        results[job.index] = Outcome(value=payload) if kind == "ok" else Outcome(error=payload)

    def _expire(self, running: dict[Connection, _Job], results: list[Outcome | None]) -> None:
        now = time.monotonic()
        for conn, job in list(running.items()):
            if now >= job.deadline:
                del running[conn]
                self._replace(job.worker)
                results[job.index] = Outcome(
                    error=f"timeout after {self.timeout_s:g}s (worker killed and restarted)"
                )

    # -- context manager -----------------------------------------------------------

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
