"""The Ray side of ``orchestrator.backend = "ray"``: `RayRolloutActor`, the body of one
rollout actor, a `RolloutWorker` built inside the actor process (`RayWorkerPool`
wraps it with ``ray.remote``). Joining or starting the cluster is
`temper.ray_cluster`; nothing here imports ``ray`` itself.

Weights reach actors through the Ray object store, never the shared-memory
ring (actors may run on other machines), so the worker is built without one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temper.backends.worker import BuildWorker, RolloutWorker
from temper.config import Config
from temper.models.loader import quiet_transformers
from temper.ray_cluster import restore_priority
from temper.weights.choose import push_weights

#: Methods for liveness checks run in this concurrency group: its own thread and
#: event loop, so a long synchronous step in a request cannot make a live actor
#: look hung (as the process backend's heartbeat thread does).
HEALTH_GROUP = "health"


class RayRolloutActor:
    """One rollout engine and rollout source inside a Ray actor process.

    ``state`` (a state dict, resolved by Ray from the pool's object ref) holds the
    weights of ``version`` when any were published this run; None means the
    weights of ``model_path`` are ``version``. Every method is async, so many
    ``groups`` calls run at once on the actor's event loop (``max_concurrency``).
    It does not retry or time anything out: `RayWorkerPool` does.
    """

    def __init__(
        self, cfg: Config, model_path: str, version: int, state: Any | None, build: BuildWorker
    ) -> None:
        restore_priority()
        quiet_transformers()
        self.worker = RolloutWorker(cfg, model_path, None, version, build)
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
