"""One OS thread for a process's heavy torch work: engine steps, trainer steps, loading.

Why: on CPU, torch parallelises ops with OpenMP, and every OS thread that runs
a parallel op gets its own OpenMP team (its own pool of helper threads). Once a
process holds more OpenMP threads than cores — e.g. an engine stepping on a
worker thread and a trainer stepping on the main thread, each with a team —
GNU OpenMP stops spin-waiting between parallel regions and puts helpers to sleep
after every op. On small models, where one op takes tens of microseconds, the
wake-ups then dominate: we measured matmuls taking about twice as long, and
`model.generate` running at half speed, in a process where a second thread had
run torch ops. Funnelling all such work through one thread keeps one team.

`run(fn, ...)` runs ``fn`` on the compute thread and waits (or runs it inline
when already there); `arun` is the same for coroutines. `set_threads(n)` sets
torch's intra-op thread count *of the compute thread* (the setting is per OS
thread). Nothing here stops other threads from running torch ops; they are
still correct, only slower.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
T = TypeVar("T")

THREAD_NAME = "temper-compute"
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_thread_id: int | None = None


def _name_os_thread() -> None:
    """Name the OS thread (and so the OpenMP helpers it spawns) for ps/top/py-spy."""
    global _thread_id
    _thread_id = threading.get_ident()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.prctl(15, THREAD_NAME.encode(), 0, 0, 0)  # 15 = PR_SET_NAME
    except OSError:  # not glibc: the name is cosmetic
        pass


def executor() -> ThreadPoolExecutor:
    """The process-wide single-thread executor (created on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                1, thread_name_prefix=THREAD_NAME, initializer=_name_os_thread
            )
        return _executor


def on_compute_thread() -> bool:
    return _thread_id is not None and threading.get_ident() == _thread_id


def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(*args, **kwargs)`` on the compute thread and return its result.

    Runs inline when called from the compute thread (so nested calls cannot
    deadlock). Blocks the calling thread, including an event loop: use `arun`
    from coroutines that should let the loop keep going.
    """
    if on_compute_thread():
        return fn(*args, **kwargs)
    return executor().submit(functools.partial(fn, *args, **kwargs)).result()


async def arun(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``fn(*args, **kwargs)`` run on the compute thread; the event loop stays free."""
    if on_compute_thread():
        return fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(fn, *args, **kwargs))


def set_threads(n: int) -> None:
    """Set torch's intra-op thread count on the compute thread (and the caller's)."""
    torch.set_num_threads(n)
    run(torch.set_num_threads, n)


def cores() -> int:
    """The CPUs this process may run on (its affinity mask: ``taskset``, cgroups)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, int(n or 1))


def get_threads() -> int:
    """Torch's intra-op thread count on the compute thread."""
    return run(torch.get_num_threads)
