"""``orchestrator.backend = "ray"``: `RemoteBackend` over a `RayWorkerPool`.

The orchestrator sees the same `RolloutBackend` as with the process backend;
only the pool differs (Ray actors in a placement group instead of local
processes). See docs/scaling.md, "Ray".
"""

from __future__ import annotations

from temper.backends.base import Rollouts
from temper.backends.ray_pool import RayWorkerPool
from temper.backends.remote import RemoteBackend
from temper.backends.worker import BuildWorker
from temper.config import Config
from temper.ray_cluster import ray_settings, start_ray
from temper.weights.choose import trainer_transport


def start_ray_backend(
    cfg: Config, model_path: str, rollouts: Rollouts, build: BuildWorker
) -> RemoteBackend:
    """Start ``orchestrator.rollout_workers`` Ray actors for ``cfg``; wait until ready.

    Connects to Ray first unless this process already is (`start_ray`: a local
    cluster, or ``orchestrator.ray_address``). ``model_path`` must be readable
    on every node that runs an actor (a path inside the installed package, a
    shared filesystem or the image); each actor builds its parts with ``build``. As with the process backend, weights are
    published to a shared-memory ring on this machine; the pool ships each
    version to the actors through the object store. Actor pids are in
    ``pool.pids()`` (they may be on other machines).
    """
    start_ray(cfg)
    o = cfg.orchestrator
    _, placement, num_cpus = ray_settings(cfg)
    ring = trainer_transport("workers", cfg.run.name)
    pool = RayWorkerPool(
        cfg,
        model_path,
        o.rollout_workers,
        build,
        ring_root=str(ring.root),
        heartbeat_timeout_s=o.heartbeat_timeout_s,
        max_retries=o.max_retries,
        num_cpus=num_cpus,
        num_gpus=o.ray_num_gpus,
        placement=placement,
    )
    return RemoteBackend(pool, ring, rollouts).started()  # type: ignore[arg-type]
