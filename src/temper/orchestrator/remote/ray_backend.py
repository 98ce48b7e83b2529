"""``orchestrator.backend = "ray"``: `RemoteBackend` over a `RayWorkerPool`.

The orchestrator sees the same `RolloutBackend` as with the process backend;
only the pool differs (Ray actors in a placement group instead of local
processes). See docs/scaling.md, "Ray".
"""

from __future__ import annotations

from temper.config import Config
from temper.orchestrator.backend import Rollouts
from temper.orchestrator.remote.ray_actor import ray_settings, start_ray
from temper.orchestrator.remote.ray_pool import RayWorkerPool
from temper.orchestrator.remote.rollouts import RemoteBackend, _ring_root
from temper.weights.shm_ring import SharedMemoryRingTransport


def start_ray_backend(cfg: Config, model_path: str, rollouts: Rollouts) -> RemoteBackend:
    """Start ``orchestrator.rollout_workers`` Ray actors for ``cfg``; wait until ready.

    Connects to Ray first unless this process already is (`start_ray`: a local
    cluster, or ``orchestrator.ray_address``). ``model_path`` must be readable
    on every node that runs an actor (a path inside the installed package, a
    shared filesystem or the image). As with the process backend, weights are
    published to a shared-memory ring on this machine; the pool ships each
    version to the actors through the object store. Actor pids are in
    ``pool.pids()`` (they may be on other machines).
    """
    start_ray(cfg)
    o = cfg.orchestrator
    _, placement, num_cpus = ray_settings(cfg)
    ring = SharedMemoryRingTransport(_ring_root(cfg.run.name))
    pool = RayWorkerPool(
        cfg,
        model_path,
        o.rollout_workers,
        ring_root=str(ring.root),
        heartbeat_timeout_s=o.heartbeat_timeout_s,
        max_retries=o.max_retries,
        num_cpus=num_cpus,
        num_gpus=o.ray_num_gpus,
        placement=placement,
    )
    return RemoteBackend(pool, ring, rollouts).started()  # type: ignore[arg-type]
