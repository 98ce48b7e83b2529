"""Trainer ranks as Ray actors (``trainer.launcher = "ray"``), placed by Ray on its cluster.

`DistributedTrainer` normally spawns its ranks on this host. With Ray it asks
for ``world_size`` actors of ``trainer.ray_num_cpus`` CPUs and
``trainer.ray_num_gpus`` GPUs each, in one placement group (pack or spread,
``orchestrator.ray_placement``), so the ranks may sit on other machines
beside the rollout actors. Rank 0's actor serves the rendezvous store (on its
node's IP, at a port it holds from the start); every actor then joins the process group and
builds the same `ShardedPolicyTrainer` as a spawned rank, and serves the same
commands (`temper.trainer.dist_worker.HANDLERS`), one Ray call each.

Weights come back from rank 0 through Ray's object store (the whole state
dict, ``weight_sync_bucket_mb`` does not apply: the run's shared memory is not
reachable from another machine). An actor that dies fails the call with the
rank named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from typing import Any

from temper.errors import ConfigError
from temper.ray_cluster import import_ray
from temper.trainer.dist_worker import (
    HANDLERS,
    WorkerSpec,
    host_store,
    join_group,
    make_trainer,
)


class TrainerRankActor:
    """One trainer rank in a Ray actor (wrapped with ``ray.remote`` by `RayTrainerRanks`)."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.store: Any = None

    def address(self) -> str:
        """Serve the ranks' rendezvous store here (rank 0's actor) and say where:
        ``store://<this node's IP>:<the port it holds>`` (`host_store`)."""
        import ray

        self.store, init_method = host_store(ray.util.get_node_ip_address())
        return init_method

    def build(self, rank: int, spec: WorkerSpec, threads: int) -> tuple[str, Any]:
        try:
            join_group(rank, spec.world_size, spec.backend, spec.init_method, spec.timeout_s)
            # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU: it is device 0 here.
            self.trainer = make_trainer(rank, spec, local_rank=0, threads=threads)
        except Exception:
            return "error", traceback.format_exc()
        return "ok", None

    def call(self, command: str, arg: Any) -> tuple[str, Any]:
        try:
            return "ok", HANDLERS[command](self.trainer, arg)
        except Exception:
            return "error", traceback.format_exc()


class RayTrainerRanks:
    """The ``world_size`` rank actors and the calls to them, for `DistributedTrainer`."""

    def __init__(self, spec: WorkerSpec, cfg: Any) -> None:
        self.ray = import_ray()
        if not self.ray.is_initialized():
            raise ConfigError(
                "trainer.launcher = 'ray' needs a Ray cluster: set orchestrator.backend = "
                "'ray' (which starts or joins one) or call ray.init() first"
            )
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {
            "CPU": cfg.ray_num_cpus,
            **({"GPU": cfg.ray_num_gpus} if cfg.ray_num_gpus else {}),
        }
        self.pg = placement_group(
            [dict(bundle)] * spec.world_size, strategy=cfg.ray_placement.upper()
        )
        try:
            self.ray.get(self.pg.ready(), timeout=cfg.worker_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"Ray could not place {spec.world_size} trainer ranks of {bundle} each; the "
                f"cluster has {self.ray.cluster_resources()}"
            ) from None
        actor_cls = self.ray.remote(num_cpus=cfg.ray_num_cpus, num_gpus=cfg.ray_num_gpus)(
            TrainerRankActor
        )
        self.actors = [
            actor_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, i)
            ).remote()
            for i in range(spec.world_size)
        ]
        spec = dataclasses.replace(spec, init_method=self.ray.get(self.actors[0].address.remote()))
        threads = max(1, int(cfg.ray_num_cpus))
        refs = [a.build.remote(r, spec, threads) for r, a in enumerate(self.actors)]
        self.startup = self._get(refs, "startup")

    def request(self, command: str, arg: Any) -> list[tuple[str, Any]]:
        """Run ``command`` on every rank; each rank's ``(status, value)``, in rank order."""
        return self._get([a.call.remote(command, arg) for a in self.actors], command)

    def _get(self, refs: list[Any], command: str) -> list[tuple[str, Any]]:
        """Each rank's reply, in rank order; on the first rank whose actor is gone,
        ``("died", message)`` for it at once (the others may be stuck in a collective
        with it: `abort` them)."""
        replies: dict[int, tuple[str, Any]] = {}
        pending = list(refs)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            for ref in ready:
                rank = refs.index(ref)
                try:
                    replies[rank] = self.ray.get(ref)
                except self.ray.exceptions.RayActorError as exc:
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "gone"
                    message = f"trainer rank {rank} (a Ray actor) died during {command}: {first}"
                    return [("died", message)]
        return [replies[r] for r in range(len(refs))]

    def abort(self) -> None:
        """Stop every rank now (after one failed: the others may wait on it forever)."""
        self.close()

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if not self.ray.is_initialized():
            return
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(self.pg)
