"""Servers for tests: `ServerThread` (an `EnvService`) and `SandboxThread` (a
`SandboxService`), each on its own event loop in a thread of the test process, and
`ServerProcess` (``temper env-serve`` as a child process)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from temper.builder.tasks import build_env_spec
from temper.envs.service.messages import env_fingerprint
from temper.envs.service.server import EnvService, ServiceLimits
from temper.sandbox import SandboxPool
from temper.sandbox.service import SandboxService
from temper.wire.server import WireServer

ROOT = Path(__file__).resolve().parents[1]
COUNTER = str(ROOT / "tests" / "counter_env.py") + ":counter_spec"


class ServiceThread:
    """``with ServiceThread(service) as server:`` serves a wire handler at ``server.url``
    from its own event loop in a thread of the test process."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.server = WireServer(service)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the server's loop (e.g. ``service.reap()``)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def __enter__(self) -> ServiceThread:
        self._thread.start()
        self.run(self.server.start())
        return self

    def __exit__(self, *exc: Any) -> None:
        self.run(self.server.stop())
        self.run(self.service.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)


class ServerThread(ServiceThread):
    """An `EnvService` of env ``kind`` with ``options`` and `ServiceLimits` ``limits``."""

    def __init__(
        self, kind: str = COUNTER, options: dict[str, Any] | None = None, **limits: Any
    ) -> None:
        self.kind, self.options = kind, dict(options or {})
        spec = build_env_spec(kind, self.options, 0)
        fingerprint = env_fingerprint(kind, self.options)
        service = EnvService(spec, kind, fingerprint, ServiceLimits(**limits), self.options)
        super().__init__(service)


class SandboxThread(ServiceThread):
    """A `SandboxService` on a warm pool of ``pool_size``."""

    def __init__(self, pool_size: int = 2, **config: Any) -> None:
        pool = SandboxPool(pool_size=pool_size, allow_fallback=False, **config)
        super().__init__(SandboxService(pool))


class ServerProcess:
    """``temper env-serve`` in a child process on ``port``; ``env`` adds variables."""

    def __init__(self, port: int, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = port
        cmd = [sys.executable, "-m", "temper", "env-serve", f"--port={port}", *args]
        child_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
        self.proc = subprocess.Popen(
            cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"env-serve exited {self.proc.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"env-serve on {self.port} not healthy in {timeout_s} s")

    def output(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return out

    def __enter__(self) -> ServerProcess:
        self.wait_healthy()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
