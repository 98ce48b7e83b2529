"""`SandboxPool`: the `Sandbox` API served by pre-started (warm) sandboxes.

Each worker is a bubblewrap sandbox, configured exactly like a cold one, whose
only process (besides bwrap's init) is a small trusted Python server
(`_server.py`, stdlib only, nothing heavy imported). Ahead of each request it
forks a handler, which reads the request and forks the untrusted child; the
child applies the rlimits to itself and runs the command (exec) or the snippet
(in the forked interpreter: no Python start-up cost). So a warm call costs one
fork on its critical path instead of bwrap plus a new interpreter.

Trade-off (also in docs/sandbox.md): a worker serves up to ``pool_max_uses``
requests. Before a call returns, every process but the server is killed,
/tmp, /dev/shm and SysV IPC are emptied, and /sandbox is emptied by the host;
the server's memory never holds request data. What a reused worker does *not*
reset is kernel state tied to its namespaces that outlives processes (e.g.
kernel keyrings): with ``pool_max_uses=1`` every request gets a brand-new
sandbox and the pool only hides start-up latency. Untrusted code can kill or
stop the server (same uid); its clean-up report then never comes, the host
kills the whole worker before the call returns, and the pool starts a
replacement. A worker whose clean-up fails in any way is replaced the same way.

Without working bubblewrap the pool does not pre-start anything: calls take the
cold fallback of `Sandbox` (no fork server outside a pid namespace, where its
``kill(-1)`` clean-up would hit the host).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from temper.processes import fd_ready
from temper.sandbox import _server
from temper.sandbox.bwrap import (
    PATH,
    await_init,
    clear_dir,
    collect_files,
    kill_sandbox,
    launcher,
    make_scratch,
    pin_init,
    read_init_pid,
    remove_tree,
    sandbox_argv,
    write_files,
)
from temper.sandbox.config import WORKDIR, SandboxError, SandboxResult
from temper.sandbox.sandbox import Job, Sandbox, log

SERVER_SOURCE = Path(__file__).with_name("_server.py").read_text()
#: Seconds a new worker may take to report ready.
START_TIMEOUT_S = 30.0
#: Seconds beyond the request timeout before the host gives up on a worker.
ANSWER_GRACE_S = 5.0
#: Seconds a worker may take to clean up after a request.
CLEAN_TIMEOUT_S = 5.0


class _Worker:
    """One warm sandbox and its protocol pipes (host side)."""

    def __init__(self, build: Callable[[int], list[str]], scratch: str) -> None:
        """Start ``build(info_fd)``: the worker's command line, with bwrap's
        ``--info-fd`` (which tells the pid of the sandbox's init) set to ``info_fd``."""
        self.scratch = scratch
        self.uses = 0
        #: A ready frame was read since the last request (clean-up finished).
        self.ready = False
        #: A pidfd of the sandbox's init, once `pin` read its pid.
        self.init_fd: int | None = None
        self._buf = bytearray()
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        self._info_r, info_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                build(info_w),
                stdin=req_r,
                stdout=resp_w,
                stderr=subprocess.DEVNULL,
                env={"PATH": PATH},
                cwd="/",
                close_fds=True,
                start_new_session=True,
                pass_fds=(info_w,),
            )
        except BaseException:
            for fd in (self._req_w, self._resp_r, self._info_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, resp_w, info_w):
                os.close(fd)

    def pin(self) -> None:
        """Hold a pidfd of the sandbox's init (once): killing it kills the whole
        sandbox, and its exit means every process in it is gone. Reading the pid
        late is safe: an init that is already reaped has taken everything with it."""
        if self._info_r < 0:
            return
        try:
            self.init_fd = pin_init(read_init_pid(self._info_r, time.monotonic() + 5.0))
        finally:
            os.close(self._info_r)
            self._info_r = -1

    def send(self, obj: dict) -> None:
        _server.write_frame(self._req_w, obj)

    def read_frame(self, deadline: float) -> dict | None:
        """The next frame, or None on EOF, deadline or a malformed frame."""
        try:
            head = self._read(4, deadline)
            if head is None:
                return None
            size = int.from_bytes(head, "big")
            if size > _server.MAX_FRAME:
                return None
            body = self._read(size, deadline)
            return None if body is None else json.loads(body)
        except (ValueError, OSError):
            return None

    def _read(self, n: int, deadline: float) -> bytes | None:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not fd_ready(self._resp_r, remaining):
                return None
            chunk = os.read(self._resp_r, max(65536, n - len(self._buf)))
            if not chunk:
                return None
            self._buf += chunk
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def kill(self) -> None:
        """SIGKILL the whole sandbox and return once every process in it is gone
        (bwrap may exit before its init has finished killing them); idempotent."""
        self.pin()
        if self.proc.poll() is None:
            kill_sandbox(self.proc, init_fd=self.init_fd)
        self.proc.wait()
        if self.init_fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.init_fd, signal.SIGKILL)
            await_init(self.init_fd)
            self.init_fd = None
        for fd in (self._req_w, self._resp_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._req_w = self._resp_r = -1


def _shutdown(idle: list[_Worker], lock: threading.Lock) -> None:
    with lock:
        workers = list(idle)
        idle.clear()
    for w in workers:
        w.kill()
        remove_tree(w.scratch)


class SandboxPool(Sandbox):
    """`Sandbox` whose calls are served by ``pool_size`` pre-started workers.

    Same methods and results as `Sandbox`. Thread-safe: each call holds one
    worker; when more calls overlap than workers are ready, extra workers are
    started on demand (and retired afterwards when the pool is full). Call
    `close` (or use ``with``) to stop the workers; they also die with this
    process (bwrap --die-with-parent).
    """

    def __init__(self, config=None, **overrides) -> None:
        super().__init__(config, **overrides)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._idle, self._lock)
        if self.isolated:
            for _ in range(self.config.pool_size):
                self._idle.append(self._spawn_worker())

    def close(self) -> None:
        """Kill the idle workers and delete their scratch dirs; busy ones are
        retired when their call returns."""
        with self._lock:
            self._closed = True
        self._finalizer()
        super().close()

    # ------------------------------------------------------------ workers

    def _spawn_worker(self) -> _Worker:
        cfg = self.config
        assert self._bwrap is not None
        scratch = make_scratch(cfg)
        prefix, bwrap = launcher(cfg), self._bwrap

        def build(info_fd: int) -> list[str]:
            return [
                *prefix,
                *sandbox_argv(cfg, bwrap, scratch, info_fd),
                cfg.python,
                "-I",
                "-c",
                SERVER_SOURCE,
            ]

        try:
            return _Worker(build, scratch)
        except BaseException:
            remove_tree(scratch)
            raise

    def _acquire(self) -> _Worker:
        with self._lock:
            worker = self._idle.pop(0) if self._idle else None
        return worker if worker is not None else self._spawn_worker()

    def _wait_ready(self, worker: _Worker) -> bool:
        """Wait for the worker's ready frame: its start-up, or its clean-up after a
        request (every other process in it killed, /tmp, /dev/shm and SysV IPC
        emptied). False when it does not come in time (a stopped or dead server)."""
        if not worker.ready:
            timeout = START_TIMEOUT_S if worker.uses == 0 else CLEAN_TIMEOUT_S
            frame = worker.read_frame(time.monotonic() + timeout)
            worker.ready = bool(frame and frame.get("ready"))
            if worker.ready and worker.uses == 0:
                worker.pin()
        return worker.ready

    def _discard(self, worker: _Worker) -> None:
        """Kill the whole sandbox and delete its scratch dir (never raises)."""
        try:
            worker.kill()
        finally:
            remove_tree(worker.scratch)

    def _keep(self, worker: _Worker) -> bool:
        """Add ``worker`` to the idle list if the pool is open and not full."""
        with self._lock:  # close() sets _closed under this lock: no worker slips past it
            keep = not self._closed and len(self._idle) < self.config.pool_size
            if keep:
                self._idle.append(worker)
        return keep

    def _release(self, worker: _Worker, reusable: bool) -> None:
        if reusable and worker.uses < self.config.pool_max_uses and self._keep(worker):
            return
        self._discard(worker)
        # Top the pool up; a new worker starts in the background (Popen only).
        while not self._closed:
            with self._lock:
                if len(self._idle) >= self.config.pool_size:
                    break
            try:
                fresh = self._spawn_worker()
            except (OSError, RuntimeError) as e:
                log.warning("could not start a warm sandbox worker: %s", e)
                break  # the next call starts one on demand
            if not self._keep(fresh):
                self._discard(fresh)
                break

    # ------------------------------------------------------------ one call

    def _execute(self, job: Job) -> SandboxResult:
        if not self.isolated:
            return super()._execute(job)
        if self._closed:
            raise SandboxError("SandboxPool is closed")
        for _ in range(3):
            worker = self._acquire()
            if self._wait_ready(worker):
                break
            # A worker that failed to start: nothing of this request ran yet,
            # so another worker may take it.
            self._discard(worker)
        else:
            raise SandboxError("sandbox workers failed to become ready three times")
        reusable = False
        try:
            result, reusable = self._serve(worker, job)
        finally:
            # Whatever happened, the worker is kept (clean) or killed and its
            # scratch dir deleted before this call returns.
            self._release(worker, reusable)
        return result

    def _serve(self, worker: _Worker, job: Job) -> tuple[SandboxResult, bool]:
        """Run ``job`` on a ready worker. Returns the result and whether the worker
        may serve again: only when, before returning, its server cleaned up (no
        process of the call is left) and its scratch dir was emptied."""
        cfg = self.config
        write_files(cfg, worker.scratch, job.files)
        request = {
            "kind": "python" if job.code is not None else "exec",
            "code": job.code,
            "argv": job.argv,
            "stdin": _server.b64(job.stdin),
            "cap": cfg.max_output_bytes,
            "timeout": cfg.timeout_s,
            "limits": cfg.limits(),
            "cwd": WORKDIR,
        }
        worker.ready = False
        worker.uses += 1
        start = time.monotonic()
        try:
            worker.send(request)
            resp = worker.read_frame(start + cfg.timeout_s + ANSWER_GRACE_S)
        except OSError:
            resp = None
        elapsed = time.monotonic() - start
        # Nothing the call started may outlive it: wait for the server's
        # clean-up, or kill the whole sandbox (a stopped or killed server).
        clean = resp is not None and self._wait_ready(worker)
        if not clean:
            worker.kill()
        # Files are read only now that nothing untrusted runs.
        files, missing = collect_files(worker.scratch, job.collect, cfg.max_file_bytes)
        clean = clean and clear_dir(worker.scratch)
        extra = {"files": files, "missing_files": missing, "isolated": True}
        if resp is None or "error" in resp:
            reason = resp["error"] if resp else "sandbox worker died or did not answer"
            result = SandboxResult(
                stdout="",
                stderr="",
                exit_code=None,
                timed_out=resp is None and elapsed >= cfg.timeout_s,
                duration_s=elapsed,
                error=reason,
                **extra,
            )
            return result, clean
        result = SandboxResult.from_output(
            _server.unb64(resp["stdout"]),
            _server.unb64(resp["stderr"]),
            resp["exit_code"],
            resp["timed_out"],
            resp["duration"],
            resp["stdout_truncated"],
            resp["stderr_truncated"],
            **extra,
        )
        return result, clean
