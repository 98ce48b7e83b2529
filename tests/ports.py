"""Ports for tests that hand a port on (to a server, to trainer ranks, to a client that
must find nothing listening there), race-free between `make test`'s lanes.

A port found free by binding port 0 and closing is free only until something else
binds it, and the kernel gives out exactly those ports (its ephemeral range,
/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default) to every other bind to
port 0 and every outgoing connection, in any lane. So a test takes its ports from its
lane's own block instead: below that range and above Ray's worker ports (10002-19999),
where only the same lane binds, and a lane runs one test at a time. Each process starts
at its own place in the block and moves on with every port, so a port that a finished
test's server may still hold (or that sits in TIME_WAIT) is not handed out again soon.
"""

import itertools
import os
import socket

BLOCK = 3000
#: ``TEMPER_TEST_LANE`` (Makefile) -> its block's first port. The in-process lane opens
#: no TCP socket at all (tests/conftest.py), so it has none.
LANE_BASE = {"main": 20000, "sockets": 23000, "vllm": 26000}


def lane() -> str:
    return os.environ.get("TEMPER_TEST_LANE") or "main"


_offsets = itertools.count(os.getpid() % BLOCK)


def free_port() -> int:
    """A port of this lane's block that nothing listens on or holds now."""
    base = LANE_BASE[lane()]
    for _ in range(BLOCK):
        port = base + next(_offsets) % BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # held, or in TIME_WAIT: the next one
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + BLOCK - 1} (lane {lane()!r})")


def dead_url(scheme: str = "http", path: str = "") -> str:
    """A URL where nothing listens (and, in this lane, nothing else will bind)."""
    return f"{scheme}://127.0.0.1:{free_port()}{path}"
