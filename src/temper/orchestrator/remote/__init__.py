"""Rollout workers in separate processes (``orchestrator.backend = "process"``).

- `worker.RolloutWorker`: engine + rollout source built from the run config,
  free of any transport (a Ray actor can wrap it as is);
- `process`: the worker process's serving loop and the orchestrator's handle
  (messages over a multiprocessing Pipe, heartbeats);
- `pool.WorkerPool`: supervision, dispatch, retries, restarts;
- `rollouts.RemoteBackend`: the `RolloutBackend` the orchestrator uses (its source
  is `rollouts.PoolRolloutSource`). See docs/workers.md.
"""

from temper.orchestrator.remote.pool import WorkerPool
from temper.orchestrator.remote.rollouts import RemoteBackend
from temper.orchestrator.remote.routing import WorkerError

__all__ = ["RemoteBackend", "WorkerError", "WorkerPool"]
