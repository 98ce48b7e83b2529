"""The Ray side of ``orchestrator.backend = "ray"``: the rollout actor and the cluster.

- `RayRolloutActor`: the body of one rollout actor, a `RolloutWorker` built
  inside the actor process (`RayWorkerPool` wraps it with ``ray.remote``);
- `start_ray`: start a local cluster or join one (``orchestrator.ray_address``);
- `import_ray`: ``ray`` itself, or a one-line error saying how to install it.

Nothing here imports ``ray`` at module level: the core path (local and process
backends) never needs it installed.

Weights reach actors through the Ray object store, never the shared-memory
ring (actors may run on other machines), so the worker is built without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

from temper.errors import ConfigError
from temper.weights.placement import push_weights

#: Methods for liveness checks run in this concurrency group: its own thread and
#: event loop, so a long synchronous step in a request cannot make a live actor
#: look hung (as the process backend's heartbeat thread does).
HEALTH_GROUP = "health"
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


def ray_settings(cfg: Any) -> tuple[str | None, str, float]:
    """``(ray_address, ray_placement, ray_num_cpus)`` from ``cfg.orchestrator``.

    Read with defaults (None, "pack", 1.0) so this module works before and after
    the schema grows those keys.
    """
    o = cfg.orchestrator
    address = getattr(o, "ray_address", None) or None
    placement = str(getattr(o, "ray_placement", "pack")).lower()
    return address, placement, float(getattr(o, "ray_num_cpus", 1.0))


def start_ray(cfg: Any, **init_kwargs: Any) -> bool:
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
        src = str(Path(__file__).resolve().parents[3])  # .../src (holds temper/)
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


class RayRolloutActor:
    """One rollout engine and rollout source inside a Ray actor process.

    ``state`` (a state dict, resolved by Ray from the pool's object ref) holds the
    weights of ``version`` when any were published this run; None means the
    weights of ``model_path`` are ``version``. Every method is async, so many
    ``groups`` calls run at once on the actor's event loop (``max_concurrency``).
    It does not retry or time anything out: `RayWorkerPool` does.
    """

    def __init__(self, cfg: Any, model_path: str, version: int, state: Any | None) -> None:
        from temper.orchestrator.remote.worker import RolloutWorker

        restore_priority()
        _quiet_libraries()
        self.worker = RolloutWorker(cfg, model_path, None, version)
        if state is not None:
            push_weights(self.worker.engine, state, version)

    async def info(self) -> dict[str, Any]:
        return self.worker.info()

    async def ping(self) -> dict[str, Any]:
        """The worker's info; called in `HEALTH_GROUP` by the pool's supervisor."""
        return self.worker.info()

    async def groups(self, request_id: int, tasks: Any, params: Any, seed: int | None) -> Any:
        """`RolloutWorker.groups` as is (plain data; exceptions propagate)."""
        return await self.worker.groups(request_id, tasks, params, seed)

    async def load_state(self, state: Any | None, version: int) -> int:
        """Hold ``state`` as ``version`` (None: only the number moves); returns the version."""
        if state is None:
            self.worker.engine.version = int(version)
        else:
            # The object store's copy goes through an in-process transport into the
            # engine; loading blocks until the engine's compute thread has them, so
            # wait in a thread and requests already running keep being served.
            await asyncio.to_thread(push_weights, self.worker.engine, state, version)
        return self.worker.version

    async def set_threads(self, threads: int) -> int:
        """The worker's torch threads from its next operation on (placement = "auto")."""
        return await asyncio.to_thread(self.worker.set_threads, threads)

    async def close(self) -> None:
        await self.worker.close()


def _quiet_libraries() -> None:
    """As the CLI does: no per-load progress bars from transformers in the driver's log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
