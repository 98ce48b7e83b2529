"""Profile one training step with torch.profiler and write it as a Chrome trace.

`stage(name)` marks a span of the loop (``temper/generate``, ``temper/reward``,
``temper/train`` ...) as a `torch.profiler.record_function`; outside a profile
it costs a few microseconds. `profile_to(path)` records everything run inside
it and writes a Chrome trace JSON that opens in chrome://tracing or
https://ui.perfetto.dev.

Temper runs its torch work on one compute thread (`temper.compute`) while the
stage spans open on the event-loop thread. torch's profiler records only the
thread that started it unless asked for all threads, so `profile_to` turns on
``profile_all_threads`` where this torch has it. On an older torch the trace
still has the stage spans but not the compute thread's ops (`profile_to`
returns False then).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

STAGE_PREFIX = "temper/"


def stage(name: str) -> record_function:
    """A span named ``temper/<name>`` in any profile being recorded (else nearly free)."""
    return record_function(STAGE_PREFIX + name)


def _all_threads_config() -> Any | None:
    """An experimental config that records every thread's ops, or None if unsupported."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        return None


@contextmanager
def profile_to(path: Path) -> Iterator[bool]:
    """Record the body with torch.profiler; write a Chrome trace to ``path`` on exit.

    Yields whether ops of all threads are recorded (True on torch builds with
    ``profile_all_threads``). CPU ops are always recorded, CUDA kernels too when
    CUDA is available. Nothing is written if the body raises.
    """
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    config = _all_threads_config()
    kwargs = {"experimental_config": config} if config is not None else {}
    with profile(activities=activities, **kwargs) as prof:
        yield config is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


__all__ = ["STAGE_PREFIX", "profile_to", "stage"]
