"""ProcessPool: parallel map, hard timeouts, crash recovery, clean shutdown.

Uses standard-library functions as the worker function so workers start fast.
"""

import operator
import os
import sys
import time

import pytest

from temper.rewards import ProcessPool


def _exists(pid: int) -> bool:
    """True while the process exists at all, zombies included."""
    return os.path.exists(f"/proc/{pid}")


def test_map_timeout_restart_and_close():
    pool = ProcessPool(time.sleep, num_workers=2, timeout_s=1.0)
    pool.start(wait=True)
    first_pids = pool.pids
    assert len(first_pids) == 2

    start = time.monotonic()
    out = pool.map([(0.6,), (0.6,)])  # both at once: about 0.6 s, not 1.2 s
    assert [o.error for o in out] == [None, None]
    assert time.monotonic() - start < 1.1

    out = pool.map([(30,), (0,), (0,)])
    assert out[0].error.startswith("timeout after 1s")
    assert out[1].error is None and out[2].error is None
    assert pool.restarts == 1
    killed = [pid for pid in first_pids if pid not in pool.pids]
    assert len(killed) == 1 and not _exists(killed[0])  # killed and reaped

    assert [o.error for o in pool.map([(0,), (0,)])] == [None, None]  # replacement works
    pids = pool.pids
    pool.close()
    assert not any(_exists(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.map([(0,)])


def test_values_errors_and_unpicklable_items():
    with ProcessPool(operator.truediv, num_workers=1, timeout_s=5.0) as pool:
        out = pool.map([(6, 3), (1, 0), (lambda: 1, 2)])
    assert out[0].value == 2.0 and out[0].error is None
    assert out[1].error == "ZeroDivisionError: division by zero"
    assert out[2].error.startswith("cannot send item")


def test_workers_that_cannot_start_fail_loudly():
    pool = ProcessPool(operator.add, num_workers=1, init=sys.exit)
    try:
        with pytest.raises(RuntimeError, match="failed to start"):
            pool.start(wait=True)
        with pytest.raises(RuntimeError, match="in a row failed to start"):
            pool.map([(1, 2)] * 3)
    finally:
        pool.close()
