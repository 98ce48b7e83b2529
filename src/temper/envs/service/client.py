"""The client side: `EnvFleet` (servers of one env) and `RemoteEnv` (one episode on one).

A run with ``env.servers`` plays every episode through a `RemoteEnv`; the rollout
loop does not know. Each episode sticks to one server (its session lives there) and
goes to the live server with the fewest sessions of this client in flight. A call
that fails for the infrastructure (connection lost, timeout, server full) raises
`InfraError` and marks that server down for a while, so the rollout loop's retry of
the episode lands elsewhere. The env's own errors stay the env's (``env_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.envs.service.messages import (
    PROTOCOL_VERSION,
    ImageCache,
    identity_options,
    result_from_wire,
    task_to_wire,
    turn_to_wire,
)
from temper.errors import ConfigError, InfraError
from temper.records import Task
from temper.wire.client import WireClient
from temper.wire.codec import WireError


class _Server:
    """One server as this client sees it: its connection, load and health."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.wire = WireClient(url)
        self.images = ImageCache()
        self.in_flight = 0
        self.down_until = 0.0
        self.greeted_generation = -1
        self.greeting = asyncio.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def ensure_loop(self) -> None:
        """Connections belong to an event loop; a new loop (a new `asyncio.run`) starts
        a new connection rather than touching the old loop's."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.loop, self.wire = loop, WireClient(self.url)
            self.images, self.greeted_generation = ImageCache(), -1
            self.greeting = asyncio.Lock()


class EnvFleet:
    """The servers of one env, and the routing of episodes to them."""

    def __init__(
        self,
        urls: list[str],
        fingerprint: str,
        *,
        env_type: str = "",
        options: dict[str, Any] | None = None,
        call_timeout_s: float = 300.0,
        down_for_s: float = 10.0,
    ) -> None:
        if not urls:
            raise ConfigError("env.servers is empty")
        self.servers = [_Server(u) for u in urls]
        self.fingerprint, self.call_timeout_s, self.down_for_s = (
            fingerprint,
            call_timeout_s,
            down_for_s,
        )
        self.infra_failures = 0
        #: This run's env, to say what differs from a server's (the fingerprint decides).
        self.env_type, self.options = env_type, dict(options or {})

    def pick(self) -> _Server:
        """The live server with the fewest of our sessions (any, if all are down)."""
        now = time.monotonic()
        live = [s for s in self.servers if s.down_until <= now] or self.servers
        return min(live, key=lambda s: s.in_flight)

    def mark_down(self, server: _Server) -> None:
        server.down_until = time.monotonic() + self.down_for_s
        self.infra_failures += 1

    async def call(self, server: _Server, op: str, **fields: Any) -> dict[str, Any]:
        """``op`` on ``server``; infrastructure failures become `InfraError`."""
        try:
            await server.ensure_loop()
            await self._greet(server)
            return await server.wire.call(op, timeout_s=self.call_timeout_s, **fields)
        except WireError as exc:
            if exc.infra:
                self.mark_down(server)
                raise InfraError(f"{server.url}: {exc}") from None
            raise

    async def _greet(self, server: _Server) -> None:
        """Check the server's protocol version and env once per connection (episodes
        that start together wait for one greeting)."""
        async with server.greeting:
            if server.wire.connected and server.greeted_generation == server.wire.generation:
                return
            hello = await server.wire.call(
                "hello", timeout_s=self.call_timeout_s, version=PROTOCOL_VERSION
            )
            if hello.get("fingerprint") != self.fingerprint:
                raise WireError("env_mismatch", self._mismatch(server, hello))
            server.greeted_generation = server.wire.generation

    def _mismatch(self, server: _Server, hello: dict[str, Any]) -> str:
        """What differs between the server's env and this run's, in words."""
        theirs = hello.get("options")
        if hello.get("env") != self.env_type or not isinstance(theirs, dict):
            return (
                f"{server.url} serves env {hello.get('env')!r}, not this run's "
                f"{self.env_type!r}: check env.type and env.options"
            )
        ours = identity_options(self.options)
        keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        shown = ", ".join(f"{k}: here {ours.get(k)!r}, there {theirs.get(k)!r}" for k in keys)
        return f"{server.url} serves {self.env_type!r} with other env.options ({shown})"

    async def check(self) -> None:
        """Greet every server now. A wrong env or version is a `ConfigError` (exit 2),
        and so is a fleet of which no server answers (a run would only retry); a server
        that is down while others answer is left to the episodes' retries."""
        down = []
        for server in self.servers:
            try:
                await server.ensure_loop()
                await self._greet(server)
            except WireError as exc:
                if not exc.infra:
                    raise ConfigError(f"env.servers: {server.url}: {exc}") from None
                down.append(exc.message)
        if len(down) == len(self.servers):
            raise ConfigError(f"env.servers: no server answered ({down[0]})")

    async def aclose(self) -> None:
        for server in self.servers:
            if server.loop is asyncio.get_running_loop():
                await server.wire.close()


class RemoteEnv:
    """One episode of the fleet's env, on the server `EnvFleet.pick` chose at reset."""

    def __init__(self, fleet: EnvFleet) -> None:
        self.fleet = fleet
        self.server: _Server | None = None
        self.session: str | None = None
        self.generation = -1
        self._tools: list[dict[str, Any]] = []

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._tools

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        self.server = server = self.fleet.pick()
        server.in_flight += 1
        try:
            await server.ensure_loop()
            answer = await self.fleet.call(
                server, "open", task=task_to_wire(task, server.images), seed=seed
            )
        except BaseException:
            server.in_flight -= 1
            self.server = None
            raise
        self.session, self.generation = answer["session"], server.wire.generation
        self._tools = list(answer.get("tools") or [])
        return server.images.unpack(answer["observation"])

    async def step(self, turn: AssistantTurn) -> StepResult:
        server = self._live_server()
        answer = await self.fleet.call(
            server, "step", session=self.session, turn=turn_to_wire(turn)
        )
        return result_from_wire(answer, server.images)

    def _live_server(self) -> _Server:
        server = self.server
        if server is None or self.session is None:
            raise RuntimeError("step before reset")
        if server.wire.generation != self.generation:
            # The connection was lost and made again: the server dropped this session.
            self.fleet.mark_down(server)
            raise InfraError(f"{server.url}: the connection was lost mid-episode")
        return server

    async def close(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        server.in_flight -= 1
        if self.session is None or server.wire.generation != self.generation:
            return
        # A failed close is harmless: the server ends the session on idleness, or has.
        with contextlib.suppress(WireError):
            await server.wire.call(
                "close", timeout_s=self.fleet.call_timeout_s, session=self.session
            )


def remote_spec(spec: EnvSpec, fleet: EnvFleet) -> EnvSpec:
    """``spec`` with its episodes on ``fleet``: the run keeps the spec's tasks, the
    servers run the envs."""

    def close() -> None:  # connections die with their event loops; nothing else is held
        pass

    return EnvSpec(
        make_env=lambda task: RemoteEnv(fleet),
        train=spec.train,
        heldout=spec.heldout,
        name=spec.name,
        close=close,
    )


def check_servers(fleet: EnvFleet) -> None:
    """`EnvFleet.check` from synchronous code, on a thread with its own event loop (the
    caller may be inside one). Raises `ConfigError` for a wrong env or version; a server
    that is down now is left to the episodes' retries."""
    import threading

    failure: list[BaseException] = []

    def run() -> None:
        async def greet() -> None:
            try:
                await fleet.check()
            finally:
                await fleet.aclose()

        try:
            asyncio.run(greet())
        except ConfigError as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="env-servers-check")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
