"""The warm-pool worker that runs *inside* a sandbox, plus helpers the host shares.

Standard library only: this file's source is handed to the sandbox's interpreter
with ``python -I -c`` (the interpreter inside may differ from the host's, so it
keeps to Python >= 3.8). The host imports the same helpers (`pump`,
`apply_limits`, the frame codec, `exit_code_of`) so the cold and warm paths cap
output and apply limits with one piece of code.

Process layout inside one warm sandbox (its own pid namespace)::

    pid 1  bwrap init (reaps orphans)
    └─ server   this loop; trusted, non-dumpable; never holds request data
       └─ handler (one per request, forked before the request is read)
          └─ child (untrusted: rlimits applied, own session, cwd /sandbox)

The server forks a fresh handler for every request *before* the request
arrives, and the handler reads it, so the server's memory (which every later
handler and child inherits) never contains an earlier request's code, input or
output. After the handler exits the server
SIGKILLs every other process in the namespace (`kill(-1)` spares only pid 1 and
the caller), removes what was left in /tmp, /dev/shm and SysV IPC, and then
sends ``{"ready": true}``. The host writes and collects files in /sandbox only
after a ready frame (or after killing the worker), when no untrusted process
exists.

Protocol on the worker's stdin/stdout: frames of a 4-byte big-endian length
followed by UTF-8 JSON. Byte strings travel base64-encoded.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import itertools
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time

#: Seconds to keep draining pipes after the main process exited (its leftover
#: background processes are killed first, so their pipe ends close).
EXIT_GRACE_S = 0.2
#: Seconds to keep draining after a timeout kill.
KILL_GRACE_S = 1.0
#: Largest protocol frame either side accepts (sanity bound, not a feature).
MAX_FRAME = 1 << 30
_HEADER = struct.Struct(">I")


# ---------------------------------------------------------------- limits


def apply_limits(limits: dict) -> None:
    """Set rlimits on the calling process (inherited by everything it starts).

    ``limits`` keys: cpu (seconds), as, fsize (bytes), nproc, nofile. The CPU
    hard limit is one second above the soft one, so a process that ignores
    SIGXCPU still gets SIGKILL. Core dumps and POSIX message queues are off.
    """
    pairs = {
        resource.RLIMIT_CPU: (limits["cpu"], limits["cpu"] + 1),
        resource.RLIMIT_AS: (limits["as"], limits["as"]),
        resource.RLIMIT_FSIZE: (limits["fsize"], limits["fsize"]),
        resource.RLIMIT_NPROC: (limits["nproc"], limits["nproc"]),
        resource.RLIMIT_NOFILE: (limits["nofile"], limits["nofile"]),
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
    }
    for res, value in pairs.items():
        resource.setrlimit(res, value)


def exit_code_of(status: int) -> int:
    """A wait status as a shell-style exit code: the code, or 128+N for signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


# ---------------------------------------------------------------- output pump


def pump(
    out_fd: int,
    err_fd: int,
    in_fd: int | None,
    data: bytes,
    cap: int,
    deadline: float,
    pid_fd: int | None,
    on_exit,
    kill,
) -> tuple[bytes, bytes, bool, bool, bool]:
    """Feed ``data`` to ``in_fd`` and read ``out_fd``/``err_fd`` until both close.

    Keeps the first ``cap`` bytes of each stream and drains (discards) the rest,
    so a chatty process never blocks on a full pipe. ``pid_fd`` (a pidfd of the
    main process; readable when it exits) lets the pump notice the exit while
    leftover background processes still hold the pipes: it then calls
    ``on_exit()`` (kill the leftovers) and drains for at most EXIT_GRACE_S; it
    also keeps waiting for the exit after both pipes closed. At
    ``deadline`` (time.monotonic) it calls ``kill()`` and drains for at most
    KILL_GRACE_S. Closes all three fds. Returns (stdout, stderr,
    stdout_truncated, stderr_truncated, timed_out); timed_out means the deadline
    came before the main process exited.
    """
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    trunc = {out_fd: False, err_fd: False}
    poller = select.poll()
    for fd in (out_fd, err_fd):
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    reading = {out_fd, err_fd}
    pos = 0
    if in_fd is not None:
        if data:
            os.set_blocking(in_fd, False)
            poller.register(in_fd, select.POLLOUT)
        else:
            os.close(in_fd)
            in_fd = None
    if pid_fd is not None:
        poller.register(pid_fd, select.POLLIN)
    exited = timed_out = False
    stop_at = deadline
    # With a pidfd, also wait for the exit itself: a process may close its
    # stdout/stderr and run on.
    while reading or (pid_fd is not None and not exited):
        remaining = stop_at - time.monotonic()
        if remaining <= 0:
            if exited or timed_out:
                break  # grace is over: stop draining
            timed_out = True
            kill()
            stop_at = time.monotonic() + KILL_GRACE_S
            continue
        for fd, _ in poller.poll(max(1, int(remaining * 1000) + 1)):
            if fd == pid_fd:
                poller.unregister(fd)
                exited = True
                on_exit()
                stop_at = min(stop_at, time.monotonic() + EXIT_GRACE_S)
            elif fd == in_fd:
                try:
                    pos += os.write(in_fd, data[pos : pos + 65536])
                except (BrokenPipeError, BlockingIOError, OSError):
                    pos = len(data)  # the reader is gone: drop the rest of stdin
                if pos >= len(data):
                    poller.unregister(in_fd)
                    os.close(in_fd)
                    in_fd = None
            else:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    poller.unregister(fd)
                    reading.discard(fd)
                    continue
                room = cap - len(bufs[fd])
                if room > 0:
                    bufs[fd] += chunk[:room]
                if len(chunk) > room:
                    trunc[fd] = True
    for fd in (out_fd, err_fd, in_fd):
        if fd is not None:
            os.close(fd)
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), trunc[out_fd], trunc[err_fd], timed_out


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where the kernel or Python lacks them."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


# ---------------------------------------------------------------- frames


def write_frame(fd: int, obj: dict) -> None:
    """Write one length-prefixed JSON frame to a blocking fd."""
    body = json.dumps(obj).encode()
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly n bytes from a blocking fd; None on EOF."""
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_frame(fd: int) -> dict | None:
    """Read one frame from a blocking fd; None on EOF."""
    head = read_exact(fd, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


# ---------------------------------------------------------------- clean-up

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Names read from one directory at a time (bounds memory in huge directories).
_BATCH = 4096


def empty_dir(path: str) -> bool:
    """Remove everything inside the directory ``path``; True when it is then empty.

    Built for what untrusted code leaves behind: trees thousands of levels
    deep (no recursion, no path longer than one name: every step is relative
    to an open directory, and the walk climbs back through ``..``), entries
    without permission bits (restored, as their owner or as root, and
    retried), symlinks (removed, never followed), FIFOs and sockets
    (unlinked, never opened), names in any encoding, and directories with
    millions of entries (read in batches). Holds two descriptors at a time.
    Call it only while nothing else writes below ``path``. Never raises.
    """
    try:
        top = _open_dir(path, None)
    except OSError:
        return False
    try:
        _empty(top)
        return not os.listdir(top)
    except Exception:  # never raise: the caller falls back to discarding
        return False
    finally:
        os.close(top)


def _empty(top: int) -> None:
    """Delete the contents of the open directory ``top``, depth-first, iteratively."""
    fd = os.dup(top)
    saved = []  # per level above: (names still to do there, name of the dir we are in)
    names = _batch(fd)
    try:
        while True:
            if not names:
                names = _batch(fd)  # what the last batch did not cover
            if names:
                name = names.pop()
                child = _remove_or_open(fd, name)
                if child is not None:  # a non-empty directory: go down into it
                    saved.append((names, name))
                    os.close(fd)
                    fd, names = child, _batch(child)
                continue
            if not saved:
                return
            parent = _retry(fd, os.open, "..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            names, name = saved.pop()
            _retry(fd, os.rmdir, name, dir_fd=fd)
    finally:
        os.close(fd)


def _batch(fd: int) -> list:
    with os.scandir(fd) as it:
        return [entry.name for entry in itertools.islice(it, _BATCH)]


def _remove_or_open(fd: int, name: str):
    """Remove ``name`` (in the directory ``fd``) if it is not a non-empty directory;
    otherwise return an open descriptor of that directory."""
    try:
        mode = _retry(fd, os.stat, name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(mode):
        _retry(fd, os.unlink, name, dir_fd=fd)
        return None
    try:
        _retry(fd, os.rmdir, name, dir_fd=fd)
        return None
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    return _open_dir(name, fd)


def _retry(fd: int, op, *args, **kwargs):
    """``op(*args, **kwargs)``; on a permission error, give the directory ``fd`` its
    owner's rwx bits back and call it again (code may leave directories read-only)."""
    try:
        return op(*args, **kwargs)
    except PermissionError:
        os.fchmod(fd, 0o700)
        return op(*args, **kwargs)


def _open_dir(name: str, dir_fd):
    """Open a directory without following a symlink; restores its owner's bits
    when they were taken away (``name`` was seen as a directory, not a link)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


# ---------------------------------------------------------------- the worker


_libc = None


def _c():
    """libc through ctypes (loaded once; forks inherit it)."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _set_dumpable(flag: int) -> None:
    """prctl(PR_SET_DUMPABLE): a non-dumpable process cannot be ptraced, and its
    /proc/PID/{mem,fd,environ} cannot be opened, by other processes of its uid."""
    _c().prctl(4, flag, 0, 0, 0)


def _run_python(code: str) -> int:
    """Run ``code`` like ``python -c`` would, in this (forked) interpreter; return
    the exit code. A fresh ``__main__`` module: the server's globals stay out of
    reach of the snippet's namespace (though not out of the process's memory)."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    code_exit = 0
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code_exit = 0
        elif isinstance(e.code, int):
            code_exit = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            code_exit = 1
    except BaseException as e:
        # Drop this function's frame, as the interpreter would show a -c snippet.
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code_exit = 1
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code_exit


def _child(req: dict, fds: tuple[int, int, int]) -> None:
    """In the forked untrusted child: wire stdio, drop to limits, run. Never returns."""
    try:
        os.setsid()
        for target in range(3):
            os.dup2(fds[target], target)
        os.closerange(3, 1 << 16)
        _set_dumpable(1)  # a normal process again (the server is not)
        os.chdir(req["cwd"])
        apply_limits(req["limits"])
        if req["kind"] == "python":
            os._exit(_run_python(req["code"]))
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores these; exec keeps that
        os.execvp(req["argv"][0], req["argv"])
    except BaseException as e:
        try:
            os.write(2, f"sandbox: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(127)


def _handle(proto_in: int, proto_out: int) -> None:
    """The per-request handler: read one request, run it, write the response."""
    req = read_frame(proto_in)
    if req is None:
        os._exit(3)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(req, (in_r, out_w, err_w))
    for fd in (in_r, out_w, err_w):
        os.close(fd)

    def kill_group() -> None:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)

    pid_fd = open_pidfd(pid)
    out, err, out_t, err_t, timed_out = pump(
        out_r,
        err_r,
        in_w,
        unb64(req.get("stdin", "")),
        req["cap"],
        start + req["timeout"],
        pid_fd,
        kill_group,
        kill_group,
    )
    if timed_out:
        kill_group()
    _, status = os.waitpid(pid, 0)
    resp = {
        "exit_code": None if timed_out else exit_code_of(status),
        "timed_out": timed_out,
        "duration": time.monotonic() - start,
        "stdout": b64(out),
        "stderr": b64(err),
        "stdout_truncated": out_t,
        "stderr_truncated": err_t,
    }
    write_frame(proto_out, resp)
    os._exit(0)


def _others() -> list[int]:
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]


def _clean_namespace() -> bool:
    """Kill every process but pid 1 and ourselves; empty /tmp, /dev/shm and SysV IPC.
    Returns False when something could not be cleaned (the worker then retires)."""
    for _ in range(200):
        if not _others():
            break
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # in a pid namespace: all but init and us
        time.sleep(0.005)
    else:
        return False
    for top in ("/tmp", "/dev/shm"):
        if not empty_dir(top):
            return False
    return _clean_sysv_ipc()


def _clean_sysv_ipc() -> bool:
    """SysV IPC objects outlive their creators: remove them (IPC_RMID)."""
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                ids = [int(line.split()[1]) for line in f.readlines()[1:]]
        except OSError:
            continue
        for ident in ids:
            libc = _c()
            if kind == "shm":
                rc = libc.shmctl(ident, 0, None)
            elif kind == "sem":
                rc = libc.semctl(ident, 0, 0)
            else:
                rc = libc.msgctl(ident, 0, None)
            if rc != 0:
                return False
    return True


def serve() -> None:
    """The worker loop (runs inside the sandbox)."""
    proto_in, proto_out = os.dup(0), os.dup(1)  # non-inheritable copies
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _set_dumpable(0)
    write_frame(proto_out, {"ready": True})
    while True:
        # Fork the next handler ahead of its request (the fork is off the
        # request's critical path); it reads the request itself, so the request
        # never enters this process's memory.
        pid = os.fork()
        if pid == 0:
            _handle(proto_in, proto_out)
        _, status = os.waitpid(pid, 0)
        if not _clean_namespace():
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
            return  # EOF on proto_in: the host is gone or retired us
        if status != 0:
            write_frame(proto_out, {"error": f"request handler died ({exit_code_of(status)})"})
        write_frame(proto_out, {"ready": True})


if __name__ == "__main__":
    serve()
