"""Shared fixtures: one cold `Sandbox` and one warm `SandboxPool` per module,
with small limits so the hostile snippets finish fast. Real bubblewrap, no mocks:
without a working bwrap the isolation tests are skipped (the reason is shown)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from temper.sandbox import Sandbox, SandboxConfig, SandboxPool
from temper.sandbox.bwrap import probe

CONFIG = SandboxConfig(
    # Long enough for a snippet to start on a loaded 2-core machine, short
    # enough for the hostile ones that run into it.
    timeout_s=3.0,
    cpu_s=5,
    memory_mb=256,
    fsize_mb=1,
    tmpfs_mb=8,
    nproc=32,
    nofile=64,
    max_output_bytes=64 * 1024,
    pool_size=2,
    allow_fallback=False,
)


def bwrap_problem() -> str | None:
    return probe(CONFIG)[1]


@pytest.fixture(scope="module", params=["cold", "warm"])
def box(request):
    """The cold path and the warm pool, each test run once against both."""
    reason = bwrap_problem()
    if reason:
        pytest.skip(f"bubblewrap unusable here: {reason}")
    sandbox = Sandbox(CONFIG) if request.param == "cold" else SandboxPool(CONFIG)
    yield sandbox
    sandbox.close()


def marker() -> str:
    """A unique float for `sleep`, so its host-side command line can be found."""
    return f"{1000 + uuid.uuid4().int % 10**6 / 10**6:.6f}"


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def wait_gone(marker: str, within_s: float = 30.0) -> list[int]:
    """Poll until no host process carries ``marker``; returns the stragglers. The
    deadline is generous: on a loaded machine the kernel reaps in its own time, and a
    passing wait returns as soon as they are gone."""
    end = time.monotonic() + within_s
    while (left := host_pids_with(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left
