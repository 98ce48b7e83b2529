"""Building blocks shared by the cold path and the warm pool.

- `sandbox_argv`: the bubblewrap command line (what is visible inside, and how).
- `launcher`: the prefix that starts bwrap as the sandbox uid when we are root.
- `probe`: does bwrap actually start here (cached per binary and uid)?
- scratch dirs: create, fill with input files, collect output files without
  following links planted by the sandboxed code, empty, remove.

Nothing here starts untrusted code by itself.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import PurePosixPath

from temper.processes import fd_ready, pid_alive
from temper.sandbox._server import empty_dir
from temper.sandbox.config import WORKDIR, SandboxConfig

log = logging.getLogger("temper.sandbox")

#: Top-level system dirs bound read-only (or re-created as the same symlink).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The only parts of /etc that are visible (copied once, world-readable entries
#: only): what the dynamic loader, user/group names, time zones, TLS roots and
#: `alternatives` symlinks need.
ETC_ENTRIES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "localtime",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "mime.types",
)
PATH = "/usr/local/bin:/usr/bin:/bin"


_etc_lock = threading.Lock()
_etc_dir: str | None = None


def public_etc() -> str:
    """A host dir holding copies of the `ETC_ENTRIES` of /etc that any user may
    read, made once per process (removed at exit) and bound as the sandbox's
    /etc: one mount instead of one per entry, and nothing else of /etc. Made on
    /dev/shm when possible: creating hundreds of symlinks (`alternatives`) on a
    disk can take a second."""
    global _etc_dir
    with _etc_lock:
        if _etc_dir is None or not os.path.isdir(_etc_dir):
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
            path = tempfile.mkdtemp(prefix=f"temper-sandbox-etc-{os.getpid()}-", dir=shm)
            for name in ETC_ENTRIES:
                _copy_public(os.path.join("/etc", name), os.path.join(path, name))
            os.chmod(path, 0o755)
            atexit.register(shutil.rmtree, path, True)
            _etc_dir = path
        return _etc_dir


def _copy_public(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst``: symlinks as symlinks, and only files and dirs that
    are world-readable (so e.g. /etc/ssl/private stays out)."""
    try:
        st = os.lstat(src)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IROTH:
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o644)
    elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IROTH and st.st_mode & stat.S_IXOTH:
        os.mkdir(dst, 0o755)
        for name in os.listdir(src):
            _copy_public(os.path.join(src, name), os.path.join(dst, name))


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def sandbox_argv(
    cfg: SandboxConfig, bwrap: str, scratch: str, info_fd: int | None = None
) -> list[str]:
    """The bwrap arguments (up to and including ``--``) for a sandbox whose
    writable working dir /sandbox is the host dir ``scratch``. With ``info_fd``,
    bwrap writes ``{"child-pid": N, ...}`` there (the sandbox's pid-1 init, as the
    host sees it) before the command starts."""
    argv = [
        bwrap,
        *(["--info-fd", str(info_fd)] if info_fd is not None else []),
        # --unshare-all, but with a user namespace required (not just tried),
        # which --disable-userns needs.
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(cfg.uid),
        "--gid",
        str(cfg.gid),
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    env = {"PATH": PATH, "HOME": WORKDIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp", **cfg.env}
    for key, value in env.items():
        argv += ["--setenv", key, value]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    argv += ["--ro-bind", public_etc(), "/etc"]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(cfg.python)))
    extra = list(cfg.ro_binds)
    if not _under(os.path.realpath(cfg.python), SYSTEM_DIRS):
        extra.append(prefix)
    size = str(cfg.tmpfs_mb << 20)
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        size,
        "--tmpfs",
        "/dev/shm",
        "--size",
        size,
        "--tmpfs",
        "/tmp",
    ]
    # After the tmpfs mounts, so that a folder under /tmp (a script's) is not hidden.
    for path in extra:
        argv += ["--ro-bind", path, path]
    argv += [
        "--bind",
        scratch,
        WORKDIR,
        "--chdir",
        WORKDIR,
        # bwrap's root and /dev are writable tmpfs until remounted.
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--",
    ]
    return argv


def launcher(cfg: SandboxConfig) -> list[str]:
    """Prefix that drops from root to the sandbox uid before bwrap starts.

    As root, bwrap would map the sandbox uid to host uid 0, which owns most host
    files; started as ``cfg.uid`` its user namespace maps to that unprivileged
    uid instead. `setpriv` (util-linux) keeps Popen on its fast vfork path
    (Popen's own ``user=`` forces a full fork of a possibly large process).
    Not root: no prefix, the sandbox maps to our own uid.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("running as root needs util-linux's setpriv to drop to the sandbox uid")
    return [setpriv, f"--reuid={cfg.uid}", f"--regid={cfg.gid}", "--clear-groups", "--"]


def prlimit_argv(cfg: SandboxConfig) -> list[str]:
    """``prlimit ... --`` applying the config's rlimits to the command after it."""
    lim = cfg.limits()
    return [
        shutil.which("prlimit") or "prlimit",
        f"--cpu={lim['cpu']}:{lim['cpu'] + 1}",
        f"--as={lim['as']}",
        f"--fsize={lim['fsize']}",
        f"--nproc={lim['nproc']}",
        f"--nofile={lim['nofile']}",
        "--core=0",
        "--msgqueue=0",
        "--",
    ]


def kill_sandbox(proc: subprocess.Popen, grace_s: float = 2.0, init_fd: int | None = None) -> None:
    """SIGKILL a running sandbox and wait for its bwrap to exit.

    Kills the sandbox's pid-1 init (the outer bwrap's child), which takes every
    process in the pid namespace with it; the outer bwrap then reaps it and
    exits on its own. SIGKILLing the outer bwrap instead would leave the init
    as an orphan zombie for the host's pid 1 to reap, and such zombies still
    count against the uid's process limit. Falls back to the whole process
    group when there is no init yet or the outer bwrap does not exit in time.
    ``init_fd``: a pidfd of the init (`pin_init`), when the caller holds one.
    """
    signalled = False
    if init_fd is not None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(init_fd, signal.SIGKILL)
            signalled = True
    for kid in [] if signalled else _children(proc.pid):
        try:
            fd = os.pidfd_open(kid)
        except OSError:
            continue
        try:
            # Re-check after pinning the process: a reaped and reused pid is
            # not bwrap's child any more.
            if kid in _children(proc.pid):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                signalled = True
        except OSError:
            pass
        finally:
            os.close(fd)
    try:
        proc.wait(timeout=grace_s if signalled else 0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_init_pid(fd: int, deadline: float) -> int | None:
    """The init's pid from bwrap's ``--info-fd`` pipe (read to EOF, until
    ``deadline``); None when bwrap wrote none (it failed to start)."""
    data = b""
    while len(data) < 4096:
        left = deadline - time.monotonic()
        if left <= 0 or not fd_ready(fd, left):
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        pid = json.loads(data)["child-pid"]
    except (ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def pin_init(pid: int | None) -> int | None:
    """A pidfd for the sandbox's init ``pid``, or None when it is already gone.
    Checks that the pid (if reaped and reused meanwhile) is not in our own pid
    namespace, so the pidfd is the init's."""
    if pid is None:
        return None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    try:
        if os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid"):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def await_init(pid_fd: int | None, timeout_s: float = 5.0) -> None:
    """Wait until the sandbox's init has exited, which the kernel allows only once
    every other process of its pid namespace is gone; SIGKILL it (and so all of
    them) if it takes longer than ``timeout_s``. Closes ``pid_fd``."""
    if pid_fd is None:
        return
    try:
        if not fd_ready(pid_fd, timeout_s):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pid_fd, signal.SIGKILL)
            fd_ready(pid_fd, timeout_s)
    finally:
        os.close(pid_fd)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


_probe_lock = threading.Lock()
_probe_cache: dict[tuple[str, int, str, str], str | None] = {}


def probe(cfg: SandboxConfig) -> tuple[str | None, str | None]:
    """(bwrap path, None) when a sandbox starts here, else (None, the reason).

    Runs one real sandbox (``true`` under prlimit) the first time per binary, uid,
    interpreter and scratch root, so a missing binary, disabled user namespaces or an
    untraversable scratch root are found before any user code runs.
    """
    path = shutil.which(cfg.bwrap)
    if path is None:
        return None, f"bubblewrap binary {cfg.bwrap!r} not found"
    key = (path, cfg.uid, cfg.python, cfg.scratch_root or "")
    with _probe_lock:
        if key not in _probe_cache:
            _probe_cache[key] = _try_start(cfg, path)
        reason = _probe_cache[key]
    return (None, reason) if reason else (path, None)


def _try_start(cfg: SandboxConfig, path: str) -> str | None:
    if shutil.which("prlimit") is None:
        return "util-linux prlimit not found"
    scratch = make_scratch(cfg)
    try:
        argv = [*launcher(cfg), *sandbox_argv(cfg, path, scratch), *prlimit_argv(cfg), "true"]
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            return f"bubblewrap failed to start: {done.stderr.decode(errors='replace').strip()}"
        if not os.access(cfg.python, os.X_OK):
            return f"interpreter {cfg.python} not executable"
        return None
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap failed to start: {e}"
    finally:
        remove_tree(scratch)


# ---------------------------------------------------------------- scratch dirs


def make_scratch(cfg: SandboxConfig) -> str:
    """A fresh host dir (mode 0700) owned by the sandbox uid, named after this process
    (``temper-sandbox-<pid>-...``) so that `reclaim_orphans` knows whose it is."""
    path = tempfile.mkdtemp(prefix=f"temper-sandbox-{os.getpid()}-", dir=cfg.scratch_root)
    if os.geteuid() == 0:
        os.chown(path, cfg.uid, cfg.gid)
    return path


_reclaimed: set[str] = set()
_ORPHAN = re.compile(r"temper-sandbox-(?:etc-)?(\d+)-")


def reclaim_orphans(cfg: SandboxConfig) -> int:
    """Kill the sandboxes, and delete the scratch and /etc dirs, of processes that no
    longer run (a server killed with SIGKILL never ran its clean-up, and one killed
    while it was starting a sandbox can leave that bwrap behind); once per process and
    scratch root. Returns how many were removed. A live process's are never touched."""
    roots = [cfg.scratch_root or tempfile.gettempdir(), "/dev/shm"]
    removed = 0 if _reclaimed else _kill_orphaned_sandboxes()
    for root in roots:
        if root in _reclaimed or not os.path.isdir(root):
            continue
        _reclaimed.add(root)
        for name in os.listdir(root):
            match = _ORPHAN.match(name)
            if match is None or pid_alive(int(match.group(1))):
                continue
            removed += remove_tree(os.path.join(root, name))
    return removed


def _kill_orphaned_sandboxes() -> int:
    """SIGKILL each bwrap adopted by init whose owner (the pid in its scratch or /etc
    dir's name) is dead; its sandbox dies with it (--die-with-parent)."""
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
            if "(bwrap)" not in stat or stat.rsplit(")", 1)[1].split()[1] != "1":
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace")
        except OSError:
            continue
        owners = {int(m) for m in re.findall(r"temper-sandbox-(?:etc-)?(\d+)-", argv)}
        if owners and not any(pid_alive(pid) for pid in owners):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def _parts(rel: str) -> list[str]:
    """The components of a relative path inside the scratch dir; ValueError for
    absolute paths, '..', or empty names."""
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or ".." in p.parts:
        raise ValueError(f"sandbox file path {rel!r} must be relative, without '..'")
    return list(p.parts)


def check_paths(paths) -> None:
    """Raise ValueError for any path that is absolute, has '..', or is empty."""
    for rel in paths:
        _parts(rel)


def write_files(cfg: SandboxConfig, scratch: str, files: dict[str, str | bytes]) -> None:
    """Write input files (relative paths; parents created), owned by the sandbox
    uid so the code may change or delete them. Called only while no sandboxed
    process runs, on a dir the host itself created or emptied."""
    chown = os.geteuid() == 0
    for rel, content in files.items():
        parts = _parts(rel)
        target = os.path.join(scratch, *parts)
        for i in range(1, len(parts)):
            d = os.path.join(scratch, *parts[:i])
            if not os.path.isdir(d):
                os.mkdir(d)
                if chown:
                    os.chown(d, cfg.uid, cfg.gid)
        data = content.encode() if isinstance(content, str) else content
        with open(target, "wb") as f:
            f.write(data)
        if chown:
            os.chown(target, cfg.uid, cfg.gid)


def collect_files(
    scratch: str, paths: list[str], max_bytes: int
) -> tuple[dict[str, bytes], list[str]]:
    """Read the requested files out of a scratch dir the sandboxed code wrote.

    Each path component is opened with O_NOFOLLOW relative to its parent, so a
    symlink the code planted (say ``out.txt -> /etc/shadow``) is refused rather
    than read with the host's privileges. Only regular files up to ``max_bytes``
    come back; the rest are listed as missing.
    """
    files: dict[str, bytes] = {}
    missing: list[str] = []
    for rel in paths:
        try:
            data = _read_inside(scratch, _parts(rel), max_bytes)
        except (OSError, ValueError):
            data = None
        if data is None:
            missing.append(rel)
        else:
            files[rel] = data
    return files, missing


def _read_inside(root: str, parts: list[str], max_bytes: int) -> bytes | None:
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        # O_NONBLOCK: opening a FIFO the code left must not hang us.
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        data = f.read(max_bytes + 1)
    return data if len(data) <= max_bytes else None


def clear_dir(path: str) -> bool:
    """Empty the scratch dir ``path`` (links are removed, never followed) and give it
    back its mode 0700 (the code may have changed it); True when that worked.
    Never raises (see `_server.empty_dir`)."""
    if not empty_dir(path):
        return False
    try:
        os.chmod(path, 0o700)
    except OSError:
        return False
    return True


def remove_tree(path: str) -> bool:
    """Delete a scratch dir, whatever the code left in it; True when it is gone.

    Never raises: clean-up must not mask a result or take down the caller. A
    dir that cannot be removed is logged (it should not happen: the host owns
    the dir, or is root)."""
    if empty_dir(path):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            reason = str(e)
    else:
        reason = "its contents could not be removed"
    if not os.path.lexists(path):
        return True
    log.warning("could not remove sandbox scratch dir %s: %s", path, reason)
    return False
