"""Rollout workers as local processes: the worker's serving loop and the orchestrator's handle.

Messages are pickled tuples ``(kind, request_id, body)`` over one duplex
`multiprocessing` Pipe per worker.

orchestrator → worker:
  ``("groups", rid, (tasks, params, seed))``  start a group request (runs concurrently)
  ``("cancel", rid, None)``                   drop a request (its result is no longer wanted)
  ``("load_weights", rid, version)``          load ``version`` from the weight ring
  ``("ping", rid, None)``                     reply with the worker's info
  ``("close", 0, None)``                      finish: close the engine and exit

worker → orchestrator:
  ``("ready", 0, info)``        built and holding ``info["version"]``; serving
  ``("failed", 0, text)``       could not build (bad config, model, ring); exits
  ``("heartbeat", n, None)``    every ``heartbeat_s`` from its own thread
  ``("result", rid, body)``     a request's reply (`RolloutWorker` return value)
  ``("error", rid, exc)``       a request raised ``exc`` (re-raised by the orchestrator)

The heartbeat thread is neither the event loop nor the compute thread, so a
long engine or reward step does not stop it; a stopped (SIGSTOP) or dead
process does. A worker whose Pipe reaches EOF (the orchestrator died) exits at
once, so workers never outlive their run.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from temper.backends.worker import BuildWorker, RolloutWorker
from temper.config import Config
from temper.models.loader import quiet_transformers

Message = tuple[str, int, Any]


@dataclass
class WorkerSpec:
    """Everything a worker process needs to build itself (picklable: ``build`` is a
    module-level function, pickled by name)."""

    cfg: Config
    model_path: str
    ring_root: str | None
    start_version: int
    heartbeat_s: float
    build: BuildWorker


# ---------------------------------------------------------------- worker side


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Entry point of a worker process: build the worker, then serve until close or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the orchestrator's to handle
    lock = threading.Lock()

    def send(msg: Message) -> None:
        with lock:  # the heartbeat thread and the loop both send
            conn.send(msg)

    threading.Thread(target=_beat, args=(send, spec.heartbeat_s), daemon=True).start()
    try:
        quiet_transformers()
        worker = RolloutWorker(
            spec.cfg, spec.model_path, spec.ring_root, spec.start_version, spec.build
        )
    except BaseException as exc:  # report why, then exit: the orchestrator decides
        traceback.print_exc()
        _send_or_exit(send, ("failed", 0, f"{type(exc).__name__}: {exc}"))
        return
    asyncio.run(_serve(conn, send, worker))


def _beat(send: Callable[[Message], None], every: float) -> None:
    n = 0
    while True:
        time.sleep(every)
        n += 1
        _send_or_exit(send, ("heartbeat", n, None))


def _send_or_exit(send: Callable[[Message], None], msg: Message) -> None:
    try:
        send(msg)
    except (OSError, ValueError):  # the orchestrator is gone: nobody wants our work
        os._exit(0)


def _read(conn: Connection, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
    """Reader thread: hand each message to the loop; exit the process on EOF."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        loop.call_soon_threadsafe(inbox.put_nowait, msg)
        if msg[0] == "close":
            return  # the orchestrator closes its end next: that EOF is expected


async def _serve(conn: Connection, send: Callable[[Message], None], worker: Any) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    threading.Thread(target=_read, args=(conn, loop, inbox), daemon=True).start()
    _send_or_exit(send, ("ready", 0, worker.info()))
    running: dict[int, asyncio.Task[None]] = {}
    while True:
        kind, rid, body = await inbox.get()
        if kind == "close":
            break
        if kind == "groups":
            task = loop.create_task(_reply_async(send, rid, worker.groups(rid, *body)))
            running[rid] = task
            task.add_done_callback(lambda _t, rid=rid: running.pop(rid, None))
        elif kind == "cancel":
            if (task := running.pop(rid, None)) is not None:
                task.cancel()
        elif kind == "threads":  # placement = "auto"; waits for the engine's compute thread
            task = loop.create_task(_reply_threads(send, worker, body))
            running[-1] = task  # held so it is not collected; a newer one replaces it
        elif kind == "load_weights":
            _reply(send, rid, worker.load_weights, body)
        elif kind == "ping":
            _reply(send, rid, worker.ping)
    for task in list(running.values()):
        task.cancel()
    await worker.close()


async def _reply_threads(send: Callable[[Message], None], worker: Any, threads: int) -> None:
    _send_or_exit(send, ("threads", 0, await asyncio.to_thread(worker.set_threads, threads)))


async def _reply_async(send: Callable[[Message], None], rid: int, coro: Any) -> None:
    try:
        body = await coro
    except asyncio.CancelledError:
        return
    except Exception as exc:
        _send_or_exit(send, ("error", rid, _picklable(exc)))
    else:
        _send_or_exit(send, ("result", rid, body))


def _reply(send: Callable[[Message], None], rid: int, fn: Callable[..., Any], *args: Any) -> None:
    try:
        body = fn(*args)
    except Exception as exc:
        _send_or_exit(send, ("error", rid, _picklable(exc)))
    else:
        _send_or_exit(send, ("result", rid, body))


def _picklable(exc: Exception) -> Exception:
    """``exc`` itself when it survives pickling (so its type reaches the orchestrator)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        traceback.print_exception(exc)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- orchestrator side


class WorkerProcess:
    """The orchestrator's handle on one worker process (one slot, one generation).

    Sends go through a queue and a writer thread, so a stopped worker whose
    pipe is full blocks only that thread, never the supervisor. The process id
    is written to ``pid_dir/worker_{index}.pid`` (tests and operators find
    workers there). Not thread-safe except `send`; the pool serialises the rest.
    """

    def __init__(
        self, ctx: Any, index: int, generation: int, spec: WorkerSpec, pid_dir: Path | None
    ) -> None:
        self.index, self.generation = index, generation
        parent, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=worker_main, args=(child, spec), name=f"temper-rollout-{index}", daemon=False
        )
        self.process.start()
        child.close()  # keep only the worker's copy: its death gives us EOF
        self.conn: Connection = parent
        self.pid: int = self.process.pid or -1
        self.started_at = self.last_seen = time.monotonic()
        self.ready = False
        self.dead = False
        self.start_error: str | None = None  # the worker's "failed" message, if any
        self.version: int | None = None
        self.threads: int | None = None  # torch threads, as the worker last reported
        self.info: dict[str, Any] = {}
        self.in_flight: set[int] = set()
        self._outbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, daemon=True, name="temper-rw-send")
        self._writer.start()
        if pid_dir is not None:
            pid_dir.mkdir(parents=True, exist_ok=True)
            (pid_dir / f"worker_{index}.pid").write_text(f"{self.pid}\n")

    def __repr__(self) -> str:
        return f"worker {self.index} (pid {self.pid})"

    def send(self, msg: Message) -> None:
        self._outbox.put(msg)

    def _write(self) -> None:
        while (msg := self._outbox.get()) is not None:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # dead or closed: the supervisor notices
                return

    def exit_reason(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "its pipe closed"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too), reap, and drop the pipe."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.discard()

    def discard(self) -> None:
        self._outbox.put(None)
        self.conn.close()

    def stop(self) -> None:
        """Ask the worker to close (it finishes its engine and exits)."""
        self.send(("close", 0, None))
