"""Env servers as Ray actors: one `EnvService` per actor, on any node of the cluster.

A run with ``env.ray_servers = N`` starts N actors (``num_cpus`` each) and plays its
episodes on their URLs; ``temper env-serve --ray N`` starts a standing fleet that runs
can share (its URLs go in their ``env.servers``). Each actor serves on a port of its
own node, from an event loop in a thread of the actor, so Ray's calls to the actor
(its URL, its pid) never wait on episodes. An actor that dies is not restarted: its
episodes fail as infra errors and are retried on the others, which is what a lost
node does too.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

from temper.envs.registry import EnvSpec
from temper.envs.service.messages import env_fingerprint
from temper.envs.service.openenv_compat import OpenEnvRoute
from temper.envs.service.server import EnvService, ServiceLimits
from temper.ray_cluster import import_ray
from temper.wire.server import WireServer

#: ``build_spec(kind, options, seed) -> EnvSpec``: the builder's, handed down so this
#: module need not import the builder.
SpecBuilder = Callable[[str, dict[str, Any], int], EnvSpec]


class EnvServerActor:
    """The body of one env-server actor (made a Ray actor by `start_env_server_actors`)."""

    def __init__(
        self,
        build_spec: SpecBuilder,
        kind: str,
        options: dict[str, Any],
        seed: int,
        limits: ServiceLimits,
    ) -> None:
        spec = build_spec(kind, options, seed)
        self.service = EnvService(spec, kind, env_fingerprint(kind, options), limits, options)
        openenv = {"/ws": OpenEnvRoute(self.service)}  # OpenEnv's clients, as env-serve
        self.server = WireServer(self.service, "0.0.0.0", 0, extra_routes=openenv)
        self.host = import_ray().util.get_node_ip_address()  # this actor's node
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=120)

    async def _start(self) -> None:
        await self.server.start()
        self.service.start()

    def url(self) -> str:
        return f"ws://{self.host}:{self.server.port}/v1"

    def pid(self) -> int:
        return os.getpid()


class RayEnvServers:
    """N env-server actors, their URLs, and `stop`."""

    def __init__(self, actors: list[Any], urls: list[str], pids: list[int]) -> None:
        self.actors, self.urls, self.pids = actors, urls, pids

    def stop(self) -> None:
        ray = import_ray()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def start_env_server_actors(
    n: int,
    build_spec: SpecBuilder,
    kind: str,
    options: dict[str, Any],
    seed: int,
    *,
    limits: ServiceLimits | None = None,
    num_cpus: float = 1.0,
) -> RayEnvServers:
    """Start ``n`` env-server actors on the connected Ray cluster and wait for their URLs."""
    ray = import_ray()
    actor_class = ray.remote(num_cpus=num_cpus, max_restarts=0)(EnvServerActor)
    limits = limits or ServiceLimits()
    actors = [actor_class.remote(build_spec, kind, options, seed, limits) for _ in range(n)]
    urls = ray.get([a.url.remote() for a in actors])
    pids = ray.get([a.pid.remote() for a in actors])
    return RayEnvServers(actors, urls, pids)
