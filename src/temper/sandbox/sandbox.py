"""`Sandbox`: run untrusted commands and Python snippets, each in a new sandbox.

Every call starts a fresh bubblewrap sandbox (the "cold" path: ~6 ms of bwrap
on top of the command's own start-up) with a fresh scratch dir, applies the
rlimits inside it (``prlimit`` for commands; snippets set their own, see
`BOOT`), feeds stdin, caps stdout/stderr, enforces
the wall-clock timeout by killing the whole sandbox, and returns files the code
wrote. `SandboxPool` (pool.py) has the same API and serves calls from warm
workers.

Where bubblewrap is missing or cannot start, the command runs as a plain
subprocess with rlimits only (as the sandbox uid when we are root), after one
loud warning, unless ``allow_fallback=False``, which raises
`IsolationUnavailableError` instead. docs/sandbox.md lists exactly what is and
is not isolated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from temper.sandbox import _server
from temper.sandbox.bwrap import (
    PATH,
    await_init,
    check_paths,
    collect_files,
    kill_sandbox,
    launcher,
    make_scratch,
    pin_init,
    prlimit_argv,
    probe,
    read_init_pid,
    reclaim_orphans,
    remove_tree,
    sandbox_argv,
    write_files,
)
from temper.sandbox.config import (
    IsolationUnavailableError,
    SandboxConfig,
    SandboxError,
    SandboxResult,
)

log = logging.getLogger("temper.sandbox")

#: Longest `run_python` snippet passed on the command line (Linux caps one
#: argument at 128 KiB).
MAX_CODE_BYTES = 100_000

#: How a cold snippet starts: ``python -I -c BOOT LIMITS CODE``. Sets the rlimits
#: (LIMITS: cpu,as,fsize,nproc,nofile as in `SandboxConfig.limits`; no core
#: dumps, no POSIX message queues) before any snippet code runs, then runs CODE
#: as ``python -c`` would, in ``__main__`` with ``sys.argv == ['-c']``, showing
#: tracebacks without this wrapper's frame. Hard limits equal soft ones (CPU: one
#: second more, for SIGKILL), so the snippet cannot raise them.
BOOT = """\
def _boot():
    import resource as r, sys
    lim = [int(x) for x in sys.argv.pop(1).split(",")] + [0, 0]
    keys = ("CPU", "AS", "FSIZE", "NPROC", "NOFILE", "CORE", "MSGQUEUE")
    for key, value in zip(keys, lim):
        res = getattr(r, "RLIMIT_" + key)
        r.setrlimit(res, (value, value + (key == "CPU")))
    return sys.argv.pop(1)
try:
    exec(compile(globals().pop("_boot")(), "<string>", "exec"))
except SystemExit:
    raise
except BaseException as _e:
    _tb = None if isinstance(_e, SyntaxError) else _e.__traceback__.tb_next
    __import__("sys").excepthook(type(_e), _e.with_traceback(_tb), _tb)
    raise SystemExit(1)
"""

_warned = False


def _warn_fallback(reason: str) -> None:
    """Log the not-isolated warning, once per process."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "SANDBOX NOT ISOLATED: %s. Untrusted code will run as a plain subprocess "
            "with rlimits only: it can read the host's world-readable files and use the "
            "network. Install bubblewrap, or set allow_fallback=False to refuse instead.",
            reason,
        )


@dataclass
class Job:
    """One execution request: a command (``argv``) or a Python snippet (``code``)."""

    argv: list[str] | None = None
    code: str | None = None
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    stdin: bytes = b""
    collect: list[str] = field(default_factory=list)


def _job(
    argv: Sequence[str] | None,
    code: str | None,
    files: Mapping[str, str | bytes] | None,
    stdin: str | bytes | None,
    collect: Sequence[str] | None,
) -> Job:
    if argv is not None and (isinstance(argv, str) or not argv):
        raise ValueError("cmd must be a non-empty list of strings, e.g. ['sh', '-c', 'ls']")
    data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    check_paths([*(files or {}), *(collect or [])])  # before any sandbox is used
    return Job(
        argv=list(argv) if argv is not None else None,
        code=code,
        files=dict(files or {}),
        stdin=data,
        collect=list(collect or []),
    )


class Sandbox:
    """Runs each call in a brand-new sandbox. Thread-safe; calls may overlap.

    ``Sandbox(SandboxConfig(timeout_s=2))`` or ``Sandbox(timeout_s=2)``.
    Construction probes bubblewrap once (cached per process) and either
    decides on the fallback (with a warning) or raises
    `IsolationUnavailableError` when ``allow_fallback`` is False.
    """

    def __init__(self, config: SandboxConfig | None = None, **overrides) -> None:
        if config is None:
            config = SandboxConfig(**overrides)
        elif overrides:
            config = SandboxConfig.model_validate({**config.model_dump(), **overrides})
        self.config = config
        reclaim_orphans(config)  # what a killed process left behind
        self._bwrap, reason = probe(config)
        if self._bwrap is None:
            if not config.allow_fallback:
                raise IsolationUnavailableError(
                    f"sandbox isolation unavailable: {reason} "
                    "(allow_fallback=False refuses to run without bubblewrap)"
                )
            _warn_fallback(reason or "unknown reason")
        self.fallback_reason = reason
        self._executor: ThreadPoolExecutor | None = None

    @property
    def isolated(self) -> bool:
        """True when calls run under bubblewrap; False in the rlimits-only fallback."""
        return self._bwrap is not None

    # ------------------------------------------------------------ public API

    def run(
        self,
        cmd: Sequence[str],
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        collect: Sequence[str] | None = None,
    ) -> SandboxResult:
        """Run ``cmd`` (argv list, looked up on the sandbox's PATH) in /sandbox.

        ``files`` are written into /sandbox first (relative paths); ``collect``
        names relative paths to read back afterwards into ``result.files``.
        """
        return self._execute(_job(cmd, None, files, stdin, collect))

    def run_python(
        self,
        code: str,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        collect: Sequence[str] | None = None,
    ) -> SandboxResult:
        """Run a Python snippet as ``python -I -c code`` would (stdlib only)."""
        return self._execute(_job(None, code, files, stdin, collect))

    async def arun(
        self,
        cmd: Sequence[str],
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        collect: Sequence[str] | None = None,
    ) -> SandboxResult:
        """`run` without blocking the event loop (on a thread of this sandbox's
        executor, ``max_concurrency`` threads)."""
        return await self._in_thread(self.run, cmd, files, stdin, collect)

    async def arun_python(
        self,
        code: str,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        collect: Sequence[str] | None = None,
    ) -> SandboxResult:
        """`run_python` without blocking the event loop."""
        return await self._in_thread(self.run_python, code, files, stdin, collect)

    def close(self) -> None:
        """Stop the async executor's threads (in-flight calls finish first)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    async def _in_thread(self, fn, *args) -> SandboxResult:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self.config.max_concurrency, thread_name_prefix="temper-sandbox"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _argv(self, job: Job) -> list[str]:
        """The command, with the rlimits applied: ``prlimit ... -- cmd``; a
        snippet sets them itself (`BOOT`), which saves prlimit's exec."""
        if job.argv is not None:
            return [*prlimit_argv(self.config), *job.argv]
        assert job.code is not None
        if len(job.code.encode()) > MAX_CODE_BYTES:
            raise ValueError(
                f"run_python: snippet over {MAX_CODE_BYTES} bytes; use SandboxPool, or pass "
                "it in `files` and run ['python3', 'main.py']"
            )
        limits = ",".join(str(v) for v in self.config.limits().values())
        return [self.config.python, "-I", "-c", BOOT, limits, job.code]

    def _execute(self, job: Job) -> SandboxResult:
        """The cold path: a new sandbox (or fallback subprocess) for this job."""
        cfg = self.config
        argv = self._argv(job)
        scratch = make_scratch(cfg)
        try:
            write_files(cfg, scratch, job.files)
            try:
                prefix = launcher(cfg)
            except RuntimeError as e:
                raise SandboxError(str(e)) from None
            bwrap = self._bwrap
            if bwrap is not None:

                def build(info_fd: int | None) -> list[str]:
                    return [*prefix, *sandbox_argv(cfg, bwrap, scratch, info_fd), *argv]

                cwd, env = "/", {"PATH": PATH}
            else:

                def build(info_fd: int | None) -> list[str]:
                    return [*prefix, *argv]

                cwd = scratch
                env = {"PATH": PATH, "HOME": scratch, "LANG": "C.UTF-8", "TMPDIR": scratch}
                env.update(cfg.env)
            out, err, out_t, err_t, timed_out, code, duration = self._spawn(
                build, cwd, env, job.stdin
            )
            files, missing = collect_files(scratch, job.collect, cfg.max_file_bytes)
        finally:
            remove_tree(scratch)
        return SandboxResult.from_output(
            out,
            err,
            code,
            timed_out,
            duration,
            out_t,
            err_t,
            files=files,
            missing_files=missing,
            isolated=self.isolated,
        )

    def _spawn(
        self,
        build: Callable[[int | None], list[str]],
        cwd: str,
        env: dict[str, str],
        stdin: bytes,
    ) -> tuple[bytes, bytes, bool, bool, bool, int | None, float]:
        """Start ``build(info_fd)`` in its own session, pump its pipes, kill it at the
        deadline, and return once nothing it started is alive."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        info_r, info_w = os.pipe()
        isolated = self.isolated
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                build(info_w if isolated else None),
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                cwd=cwd,
                env=env,
                close_fds=True,
                start_new_session=True,  # one process group to kill: bwrap and its init
                # bwrap's --info-fd: how we learn its init's pid.
                pass_fds=(info_w,) if isolated else (),
            )
        except BaseException:
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w, info_r, info_w):
                os.close(fd)
            raise
        for fd in (in_r, out_w, err_w, info_w):
            os.close(fd)
        deadline = start + self.config.timeout_s
        try:
            init_fd = pin_init(read_init_pid(info_r, deadline)) if isolated else None
        finally:
            os.close(info_r)

        def kill() -> None:
            if isolated:
                kill_sandbox(proc, init_fd=init_fd)  # the whole pid namespace; reaps bwrap
            else:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)

        def on_exit() -> None:
            # Under bwrap the sandbox's leftovers died with its pid namespace.
            # The fallback has none: kill the main process's group while the
            # process is an unreaped zombie (so the group id is still ours).
            if not isolated:
                kill()

        pid_fd = _server.open_pidfd(proc.pid)
        try:
            out, err, out_t, err_t, timed_out = _server.pump(
                out_r,
                err_r,
                in_w,
                stdin,
                self.config.max_output_bytes,
                deadline,
                pid_fd,
                on_exit,
                kill,
            )
            # Without a pidfd the pump stops at EOF, but the process may have
            # closed its stdio and run on.
            if pid_fd is None and not timed_out and not _exited_by(proc, deadline):
                timed_out = True
                kill()
        finally:
            if pid_fd is not None:
                os.close(pid_fd)
        rc = proc.wait()
        duration = time.monotonic() - start
        # bwrap exits as soon as its command has: wait for the init too, whose
        # exit means every process of the sandbox is gone.
        await_init(init_fd)
        code = None if timed_out else (128 - rc if rc < 0 else rc)
        return out, err, out_t, err_t, timed_out, code, duration


def _exited_by(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until ``proc`` exits or ``deadline``; True if it exited."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False
