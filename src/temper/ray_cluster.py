"""Ray itself: importing it (an extra), joining or starting a cluster, and the priority
of the processes it starts.

Both Ray users sit above this module: the Ray rollout backend
(`temper.backends.ray_backend`) and the Ray trainer ranks
(`temper.trainer.ray_ranks`). Nothing here imports ``ray`` at module level:
the core path (local and process backends) never needs it installed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from temper.config import Config
from temper.errors import ConfigError

#: Ray's setting for the niceness of its worker processes (default 15).
WORKER_NICENESS_ENV = "RAY_worker_niceness"
RAY_MISSING = "orchestrator.backend = 'ray' needs Ray: pip install 'temper-rl[ray]'"


def import_ray() -> Any:
    """The ``ray`` module; `ConfigError` with the install command when it is missing."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def ray_settings(cfg: Config) -> tuple[str | None, str, float]:
    """``(ray_address, ray_placement, ray_num_cpus)`` from ``cfg.orchestrator``."""
    o = cfg.orchestrator
    return o.ray_address or None, o.ray_placement.lower(), float(o.ray_num_cpus)


def start_ray(cfg: Config, **init_kwargs: Any) -> bool:
    """Connect this process to Ray unless it already is; True when this call did it.

    ``orchestrator.ray_address`` None starts a local cluster on this machine;
    ``"auto"`` joins the cluster this machine belongs to (inside a KubeRay pod or
    after ``ray start``); ``"ray://host:10001"`` joins through Ray Client.

    Actors import ``temper`` by name. A local cluster's workers inherit this
    process's environment, so the directory holding the ``temper`` package is
    put on ``PYTHONPATH`` first (an editable install works without it). A
    cluster's nodes must have the same ``temper-rl`` installed (the image does).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    address, _, _ = ray_settings(cfg)
    if address is None:
        src = str(Path(__file__).resolve().parents[1])  # .../src (holds temper/)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if src not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([src, *paths])
        # Ray starts its workers at nice 15 so its own daemons win the CPU. Our
        # actors are the rollout engines, the run's main work: at nice 15 beside
        # any normal-priority load (another job, a busy loop) they starve, and
        # an actor took over 120 s to import on 2 loaded cores. The raylet reads
        # this from the environment it is started with.
        os.environ.setdefault(WORKER_NICENESS_ENV, "0")
    init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("log_to_driver", True)
    ray.init(address=address, **init_kwargs)
    return True


def restore_priority() -> None:
    """Raise this process back to nice 0 when its cluster started it lower.

    A cluster we did not start (``ray start``, KubeRay) keeps Ray's default
    worker niceness of 15; undoing it needs CAP_SYS_NICE (root has it), and
    without it the actor runs at the cluster's niceness.
    """
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
