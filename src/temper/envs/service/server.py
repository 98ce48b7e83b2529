"""`EnvService`: the sessions of one env, served over the wire (`temper env-serve`).

One session is one episode: ``open`` makes a fresh env from the spec and resets it on
the task, ``step`` answers a turn, ``close`` frees it. Sessions also end when their
connection closes (a client that vanished), when idle past ``idle_timeout_s`` and at
``lifetime_s`` (the reaper), so nothing a client forgets stays held. New sessions are
refused with ``server_full`` at ``max_sessions`` and ``rate_limited`` above
``max_opens_per_s``: both are infrastructure answers the client takes elsewhere.

An env's own exception is ``env_error`` (the episode ends as it would in process); bad
input (a malformed frame, an unknown session, a wrong version, an observation over
``max_observation_bytes``) gets its own code and ends only that call or session.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from temper.envs.base import Env
from temper.envs.registry import EnvSpec
from temper.envs.service.messages import (
    PROTOCOL_VERSION,
    ImageCache,
    identity_options,
    result_to_wire,
    task_from_wire,
    turn_from_wire,
)
from temper.wire.codec import WireError, encode


@dataclass(frozen=True)
class ServiceLimits:
    """What one env server holds at most, and for how long."""

    max_sessions: int = 4096
    idle_timeout_s: float = 600.0
    lifetime_s: float = 3600.0
    max_opens_per_s: float = 2000.0
    max_observation_bytes: int = 8 * 1024 * 1024


@dataclass
class _Peer:
    images: ImageCache = field(default_factory=ImageCache)
    sessions: set[str] = field(default_factory=set)


@dataclass
class _Session:
    env: Env
    peer: _Peer
    opened: float
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EnvService:
    """The `WireHandler` of an env: ops ``hello``, ``open``, ``step``, ``close``."""

    def __init__(
        self,
        spec: EnvSpec,
        env_type: str,
        fingerprint: str,
        limits: ServiceLimits | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.spec, self.env_type, self.fingerprint = spec, env_type, fingerprint
        #: The env's options as `hello` shows them (placement ones left out), so that a
        #: run whose env differs can be told which options differ.
        self.options = identity_options(options or {})
        self.limits = limits or ServiceLimits()
        self.sessions: dict[str, _Session] = {}
        self.counts: Counter[str] = Counter()
        self.step_seconds: deque[float] = deque(maxlen=4096)
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        self._bucket, self._bucket_at = self.limits.max_opens_per_s, time.monotonic()
        self._reaper: asyncio.Task[None] | None = None
        self.started = time.time()

    # -- the WireHandler protocol ------------------------------------------------------

    def connected(self) -> _Peer:
        self.counts["connections_opened"] += 1
        return _Peer()

    async def disconnected(self, peer: _Peer) -> None:
        for sid in list(peer.sessions):
            await self._end(sid, "disconnect")

    async def call(self, peer: _Peer, frame: dict[str, Any]) -> dict[str, Any]:
        op = frame.get("op")
        self.counts[f"calls_{op}" if op in _OPS else "calls_unknown"] += 1
        try:
            if op == "hello":
                return self._hello(frame)
            if op == "open":
                return await self._open(peer, frame)
            if op == "step":
                return await self._step(peer, frame)
            if op == "close":
                sid = self._session_id(peer, frame)
                await self._end(sid, "close")
                return {}
            if op == "ping":
                return {}
            raise WireError("bad_request", f"unknown op {op!r}; ops are {', '.join(_OPS)}")
        except WireError as exc:
            self.counts[f"errors_{exc.code}"] += 1
            raise

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "env": self.env_type,
            "fingerprint": self.fingerprint,
            "version": PROTOCOL_VERSION,
            "sessions": len(self.sessions),
            "max_sessions": self.limits.max_sessions,
        }

    def metrics(self) -> str:
        lines = [f"temper_env_sessions {len(self.sessions)}"]
        lines += [f"temper_env_{key}_total {n}" for key, n in sorted(self.counts.items())]
        if self.step_seconds:
            ordered = sorted(self.step_seconds)
            for q in (0.5, 0.99):
                value = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
                lines.append(f'temper_env_step_seconds{{quantile="{q}"}} {value:.6f}')
        return "\n".join(lines) + "\n"

    # -- ops ---------------------------------------------------------------------------

    def _hello(self, frame: dict[str, Any]) -> dict[str, Any]:
        version = frame.get("version")
        if version != PROTOCOL_VERSION:
            raise WireError(
                "protocol_version",
                f"this server speaks env protocol {PROTOCOL_VERSION}, the client {version!r}",
            )
        return {
            "version": PROTOCOL_VERSION,
            "env": self.env_type,
            "fingerprint": self.fingerprint,
            "options": _plain_options(self.options),
        }

    async def _open(self, peer: _Peer, frame: dict[str, Any]) -> dict[str, Any]:
        self._admit()
        task = task_from_wire(frame.get("task"), peer.images)
        seed = frame.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise WireError("bad_request", f"seed must be an integer or nil, got {seed!r}")
        sid = f"{self._prefix}-{next(self._ids)}"
        now = time.monotonic()
        try:
            env = self.spec.make_env(task)
        except Exception as exc:
            raise WireError("env_error", f"make_env: {type(exc).__name__}: {exc}") from None
        session = _Session(env, peer, now, now)
        self.sessions[sid] = session
        peer.sessions.add(sid)
        self.counts["sessions_opened"] += 1
        try:
            async with session.lock:
                observation = await env.reset(task, seed)
                tools = list(env.tools or [])
            answer = {"session": sid, "observation": peer.images.pack(list(observation))}
            answer["tools"] = tools
            self._check_size(answer)
        except Exception as exc:
            await self._end(sid, "failed")
            if isinstance(exc, WireError):
                raise
            raise WireError("env_error", f"reset: {type(exc).__name__}: {exc}") from None
        return answer

    async def _step(self, peer: _Peer, frame: dict[str, Any]) -> dict[str, Any]:
        sid = self._session_id(peer, frame)
        session = self.sessions[sid]
        turn = turn_from_wire(frame.get("turn"))
        if session.lock.locked():
            raise WireError("bad_request", f"session {sid} is already stepping")
        t0 = time.perf_counter()
        try:
            async with session.lock:
                result = await session.env.step(turn)
            answer = result_to_wire(result, peer.images)
            self._check_size(answer)
        except Exception as exc:
            await self._end(sid, "failed")
            if isinstance(exc, WireError):
                raise
            raise WireError("env_error", f"step: {type(exc).__name__}: {exc}") from None
        self.step_seconds.append(time.perf_counter() - t0)
        self.counts["steps"] += 1
        session.last_used = time.monotonic()
        return answer

    # -- sessions ----------------------------------------------------------------------

    def _admit(self) -> None:
        if len(self.sessions) >= self.limits.max_sessions:
            raise WireError("server_full", f"{len(self.sessions)} sessions open, the cap")
        now = time.monotonic()
        rate = self.limits.max_opens_per_s
        self._bucket = min(rate, self._bucket + (now - self._bucket_at) * rate)
        self._bucket_at = now
        if self._bucket < 1.0:
            raise WireError("rate_limited", f"more than {rate:g} sessions opened per second")
        self._bucket -= 1.0

    def _session_id(self, peer: _Peer, frame: dict[str, Any]) -> str:
        sid = frame.get("session")
        if not isinstance(sid, str) or sid not in self.sessions:
            raise WireError("unknown_session", f"no open session {sid!r} (closed or reaped)")
        if self.sessions[sid].peer is not peer:
            raise WireError("unknown_session", f"session {sid!r} belongs to another connection")
        return sid

    def _check_size(self, answer: dict[str, Any]) -> None:
        size = len(encode(answer))
        if size > self.limits.max_observation_bytes:
            raise WireError(
                "observation_too_large",
                f"the answer is {size} bytes > max_observation_bytes "
                f"{self.limits.max_observation_bytes}",
            )

    async def _end(self, sid: str, why: str) -> None:
        session = self.sessions.pop(sid, None)
        if session is None:
            return
        session.peer.sessions.discard(sid)
        self.counts[f"sessions_ended_{why}"] += 1
        try:
            await session.env.close()
        except Exception:
            self.counts["close_errors"] += 1

    async def reap(self) -> int:
        """End the sessions idle past ``idle_timeout_s`` or older than ``lifetime_s``."""
        now, ended = time.monotonic(), 0
        for sid, s in list(self.sessions.items()):
            if now - s.opened > self.limits.lifetime_s:
                await self._end(sid, "lifetime")
            elif now - s.last_used > self.limits.idle_timeout_s and not s.lock.locked():
                await self._end(sid, "idle")
            else:
                continue
            ended += 1
        return ended

    def start(self) -> None:
        """Start the reaper (on the running event loop)."""
        period = max(0.05, min(self.limits.idle_timeout_s, self.limits.lifetime_s) / 4)

        async def loop() -> None:
            while True:
                await asyncio.sleep(period)
                await self.reap()

        self._reaper = asyncio.create_task(loop())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for sid in list(self.sessions):
            await self._end(sid, "shutdown")
        if self.spec.close is not None:
            self.spec.close()


_OPS = ("hello", "open", "step", "close", "ping")


def _plain_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options as msgpack carries them (a value it cannot is shown as its repr)."""
    return {k: v if isinstance(v, str | int | float | bool | list | dict | None) else repr(v)
            for k, v in options.items()}  # fmt: skip
