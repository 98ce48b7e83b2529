"""The sandbox as a service: `SandboxService` (``temper sandbox-serve``) and `RemoteSandbox`.

A rollout machine need not run bubblewrap at all: envs and code rewards that take a
sandbox (`Sandbox`'s API: ``run``, ``run_python``, ``arun``, ``arun_python``) get a
`RemoteSandbox` instead, which sends each call over Temper's wire (`temper.wire`) to
one of several sandbox servers. Each server runs the calls in its own warm
`SandboxPool`, so the isolation is exactly the local sandbox's (docs/sandbox.md); a
server refuses to start without working bubblewrap unless told otherwise.

Calls are stateless, so a call that fails for the infrastructure (a server lost, a
timeout) is tried once on each other server before `InfraError` reaches the episode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from temper.errors import InfraError
from temper.sandbox.config import SandboxError, SandboxResult
from temper.sandbox.sandbox import Sandbox
from temper.wire.client import WireClient
from temper.wire.codec import WireError

#: The sandbox protocol's version.
SANDBOX_PROTOCOL_VERSION = 1


def _job_fields(frame: dict[str, Any]) -> dict[str, Any]:
    """A run request's fields, checked; `WireError("bad_request")` names what is wrong."""
    code, cmd = frame.get("code"), frame.get("cmd")
    if (code is None) == (cmd is None):
        raise WireError("bad_request", "a run needs exactly one of 'code' and 'cmd'")
    if code is not None and not isinstance(code, str):
        raise WireError("bad_request", "'code' must be a string")
    if cmd is not None and not (isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)):
        raise WireError("bad_request", "'cmd' must be a list of strings")
    files = frame.get("files") or {}
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str | bytes) for k, v in files.items()
    ):
        raise WireError("bad_request", "'files' must map paths to strings or bytes")
    stdin = frame.get("stdin")
    if stdin is not None and not isinstance(stdin, str | bytes):
        raise WireError("bad_request", "'stdin' must be a string or bytes")
    collect = frame.get("collect")
    if collect is not None and not (
        isinstance(collect, list) and all(isinstance(p, str) for p in collect)
    ):
        raise WireError("bad_request", "'collect' must be a list of paths")
    return {"code": code, "cmd": cmd, "files": files, "stdin": stdin, "collect": collect}


class SandboxService:
    """The `WireHandler` of a sandbox: ops ``hello``, ``run``, ``ping``."""

    def __init__(self, sandbox: Sandbox, max_queue: int = 4096) -> None:
        self.sandbox, self.max_queue = sandbox, max_queue
        self.in_flight = 0
        self.counts: Counter[str] = Counter()
        self.seconds: deque[float] = deque(maxlen=4096)

    def connected(self) -> None:
        return None

    async def disconnected(self, peer: None) -> None:
        return None  # calls hold nothing between them

    async def call(self, peer: None, frame: dict[str, Any]) -> dict[str, Any]:
        op = frame.get("op")
        if op == "hello":
            if frame.get("version") != SANDBOX_PROTOCOL_VERSION:
                raise WireError(
                    "protocol_version",
                    f"this server speaks sandbox protocol {SANDBOX_PROTOCOL_VERSION}, "
                    f"the client {frame.get('version')!r}",
                )
            return {"version": SANDBOX_PROTOCOL_VERSION, "isolated": self.sandbox.isolated}
        if op == "ping":
            return {}
        if op != "run":
            raise WireError("bad_request", f"unknown op {op!r}; ops are hello, run, ping")
        job = _job_fields(frame)
        if self.in_flight >= self.max_queue:
            self.counts["refused_full"] += 1
            raise WireError("server_full", f"{self.in_flight} calls queued, the cap")
        self.in_flight += 1
        t0 = time.perf_counter()
        try:
            if job["code"] is not None:
                result = await self.sandbox.arun_python(
                    job["code"], job["files"], job["stdin"], job["collect"]
                )
            else:
                result = await self.sandbox.arun(
                    job["cmd"], job["files"], job["stdin"], job["collect"]
                )
        finally:
            self.in_flight -= 1
        self.seconds.append(time.perf_counter() - t0)
        self.counts["calls"] += 1
        return {"result": asdict(result)}

    def start(self) -> None:
        return None  # nothing runs between calls

    async def close(self) -> None:
        self.sandbox.close()

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "isolated": self.sandbox.isolated,
            "in_flight": self.in_flight,
            "version": SANDBOX_PROTOCOL_VERSION,
        }

    def metrics(self) -> str:
        lines = [f"temper_sandbox_in_flight {self.in_flight}"]
        lines += [f"temper_sandbox_{k}_total {n}" for k, n in sorted(self.counts.items())]
        if self.seconds:
            ordered = sorted(self.seconds)
            for q in (0.5, 0.99):
                value = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
                lines.append(f'temper_sandbox_call_seconds{{quantile="{q}"}} {value:.6f}')
        return "\n".join(lines) + "\n"


class RemoteSandbox:
    """`Sandbox`'s API over sandbox servers. Its connections live on a private event loop
    in a thread of their own, so any caller (a thread, any event loop) may use it."""

    def __init__(self, urls: Sequence[str], call_timeout_s: float = 300.0) -> None:
        if not urls:
            raise ValueError("RemoteSandbox needs at least one server URL")
        self.urls, self.call_timeout_s = list(urls), call_timeout_s
        self.isolated = True  # every server checks its bubblewrap (see `sandbox-serve`)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="temper-remote-sandbox", daemon=True
        )
        self._thread.start()
        self._clients = [WireClient(u) for u in self.urls]
        self._greeted: dict[int, int] = {}
        self._in_flight = [0] * len(self.urls)
        self.infra_failures = 0

    # -- Sandbox's API -------------------------------------------------------------------

    def run(self, cmd: Sequence[str], files: Mapping[str, str | bytes] | None = None,
            stdin: str | bytes | None = None, collect: Sequence[str] | None = None) -> SandboxResult:  # fmt: skip
        return self._submit({"cmd": list(cmd)}, files, stdin, collect).result()

    def run_python(self, code: str, files: Mapping[str, str | bytes] | None = None,
                   stdin: str | bytes | None = None, collect: Sequence[str] | None = None) -> SandboxResult:  # fmt: skip
        return self._submit({"code": code}, files, stdin, collect).result()

    async def arun(self, cmd: Sequence[str], files: Mapping[str, str | bytes] | None = None,
                   stdin: str | bytes | None = None, collect: Sequence[str] | None = None) -> SandboxResult:  # fmt: skip
        return await asyncio.wrap_future(self._submit({"cmd": list(cmd)}, files, stdin, collect))

    async def arun_python(self, code: str, files: Mapping[str, str | bytes] | None = None,
                          stdin: str | bytes | None = None, collect: Sequence[str] | None = None) -> SandboxResult:  # fmt: skip
        return await asyncio.wrap_future(self._submit({"code": code}, files, stdin, collect))

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def shut() -> None:
            for client in self._clients:
                await client.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    # -- internals -----------------------------------------------------------------------

    def _submit(self, job: dict[str, Any], files: Any, stdin: Any, collect: Any) -> Any:
        fields = {**job, "files": dict(files or {}), "stdin": stdin,
                  "collect": list(collect) if collect is not None else None}  # fmt: skip
        return asyncio.run_coroutine_threadsafe(self._call(fields), self._loop)

    async def _call(self, fields: dict[str, Any]) -> SandboxResult:
        """One run: the least-loaded server first, each other server once on an
        infrastructure failure."""
        order = sorted(range(len(self._clients)), key=lambda i: self._in_flight[i])
        failures = []
        for i in order:
            self._in_flight[i] += 1
            try:
                answer = await self._on(i, fields)
            except WireError as exc:
                if not exc.infra:
                    raise SandboxError(f"sandbox server {self.urls[i]}: {exc}") from None
                self.infra_failures += 1
                failures.append(f"{self.urls[i]}: {exc}")
                continue
            finally:
                self._in_flight[i] -= 1
            return SandboxResult(**answer["result"])
        raise InfraError("no sandbox server answered: " + "; ".join(failures))

    async def _on(self, i: int, fields: dict[str, Any]) -> dict[str, Any]:
        client = self._clients[i]
        if not client.connected or self._greeted.get(i) != client.generation:
            hello = await client.call(
                "hello", timeout_s=self.call_timeout_s, version=SANDBOX_PROTOCOL_VERSION
            )
            self._greeted[i] = client.generation
            if not hello.get("isolated"):
                raise WireError("unisolated", f"{self.urls[i]} runs without bubblewrap")
        return await client.call("run", timeout_s=self.call_timeout_s, **fields)


def sandbox_for(servers: Sequence[str] | None, local: Any) -> Any:
    """A `RemoteSandbox` on ``servers`` when given, else ``local()`` (a `Sandbox` or
    `SandboxPool` made on first use)."""
    return RemoteSandbox(servers) if servers else local()
