"""`RolloutWorker`: one rollout engine and its rollout source, built from a run config.

A worker holds what the local backend holds in the orchestrator process: an
engine and the run's rollout source, made by the ``build`` function the builder
hands the backend (`temper.builder.rollouts.build_worker_parts`) from the same
config and model path, so a group from a worker is made exactly as a local one
would be. The backends never import the builder: it sits above them.
Weights arrive through the weight ring (`temper.weights.choose`) that the
orchestrator publishes to; the worker only reads it.

It knows nothing of how requests reach it: `temper.backends.process` serves it
over a multiprocessing Pipe, and `temper.backends.ray_actor` calls the same
methods in a Ray actor. Results are plain data (trajectories as dicts) so any
transport can pickle or serialise them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from temper import compute
from temper.backends.base import Rollouts
from temper.config import Config
from temper.engine.base import Engine, SamplingParams
from temper.records import Task
from temper.rewards.base import TRAINER_STATE
from temper.weights.choose import ring_reader

#: ``(run config, weights path) -> (engine, rollouts)``: how a worker builds its parts.
BuildWorker = Callable[[Config, str], tuple[Engine, Rollouts]]


class RolloutWorker:
    """Builds its engine and rollout source (``build``); serves groups and weight loads.

    ``model_path`` is the checkpoint the orchestrator started from (the base
    model, or the resumed checkpoint). At start the worker loads the ring's
    newest version when the ring holds one; otherwise its weights are those
    of ``model_path`` and it takes ``start_version`` as their version number.
    Build it inside the process that will use it (it starts the engine's
    compute thread there). Its torch threads are ``orchestrator.worker_threads``,
    else ``run.threads``, else the cores divided by ``orchestrator.rollout_workers``.
    """

    def __init__(
        self,
        cfg: Config,
        model_path: str,
        ring_root: str | None,
        start_version: int,
        build: BuildWorker,
    ) -> None:
        # Workers share the machine's cores: torch teams bigger than a worker's share
        # spin against each other (2 cores, 2 workers x 2 threads: 20 s for a call
        # that took 0.4 s with 1 thread each).
        share = max(1, compute.cores() // cfg.orchestrator.rollout_workers)
        self.threads = cfg.orchestrator.worker_threads or cfg.run.threads or share
        compute.set_threads(self.threads)
        self.engine, self.rollouts = build(cfg, model_path)
        self.ring = ring_reader(ring_root) if ring_root else None
        latest = self.ring.latest_version() if self.ring is not None else None
        # What TRL reward functions see as trainer_state: the weight version is the
        # number of training steps completed, as the orchestrator's own count is.
        TRAINER_STATE.max_steps = cfg.orchestrator.steps
        if latest is not None:
            self.load_weights(latest)
        else:
            self.engine.version = int(start_version)
            TRAINER_STATE.global_step = int(start_version)

    @property
    def version(self) -> int:
        return int(self.engine.version)

    def info(self) -> dict[str, Any]:
        """What the orchestrator needs to know about this worker."""
        return {
            "pid": os.getpid(),
            "version": self.version,
            "max_context": int(self.engine.max_context),
            "threads": self.threads,
        }

    async def groups(
        self,
        request_id: int,
        tasks: list[Task],
        params: SamplingParams,
        seed: int | None = None,
    ) -> dict[str, Any]:
        """Groups for ``tasks`` from the run's rollout source, as plain data.

        Returns ``{"request_id", "groups": [[trajectory dict, ...], ...], "stats"}``.
        Exceptions from the source propagate unchanged.
        """
        groups, stats = await self.rollouts.source.groups(tasks, params, seed)
        return {
            "request_id": request_id,
            "groups": [[asdict(t) for t in g] for g in groups],
            "stats": dict(stats),
        }

    def load_weights(self, version: int) -> int:
        """Load ``version`` from the ring into the engine; returns the version now held.

        When nothing has been published yet this run, the worker's weights are
        already the start weights: only the version number is set. A version
        the ring no longer holds raises `WeightTransportError`.
        """
        if self.ring is None or self.ring.latest_version() is None:
            self.engine.version = int(version)
        else:
            self.engine.load_weights(self.ring, version)  # copies out of the ring slot
        TRAINER_STATE.global_step = self.version
        return self.version

    def set_threads(self, threads: int) -> int:
        """Use ``threads`` torch threads from the next operation on; returns the count
        the engine's compute thread now has."""
        compute.set_threads(int(threads))
        self.threads = compute.get_threads()
        return self.threads

    def ping(self) -> dict[str, Any]:
        return self.info()

    async def close(self) -> None:
        """Close the engine and the rollout source's reward workers and env resources."""
        await self.engine.close()
        self.rollouts.close()
