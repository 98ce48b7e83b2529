"""Small process facts shared by the parts that clean up after dead runs."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fd_ready(fd: int, timeout_s: float, *, write: bool = False) -> bool:
    """Whether ``fd`` becomes readable (or writable) within ``timeout_s``.

    poll, not select: select refuses descriptors numbered 1024 or more, which a
    process holding hundreds of sockets (a gateway serving 800 agent episodes) has.
    """
    import select

    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000.0))
