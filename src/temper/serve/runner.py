"""Running the OpenAI-compatible server: in a background thread, or as `temper serve`.

`start_server(engine, tokenizer, host, port=0)` runs the app of
`temper.serve.openai_server.create_app` under uvicorn in a daemon thread with
its own event loop and returns a `ServerHandle` (base URL, `stop()`). The
engine is driven from that loop only: the native engine runs on one event
loop at a time, so do not call the same engine from another running loop
while the server is up (after `stop()` it can be used elsewhere again).
The blocking entry point of `temper serve` is `temper.cli.serve.run_server`,
which builds the engine from config (`temper.builder`), binds the port here and
runs uvicorn with `run_announced`: the URL is printed once the port accepts
connections, so a client that starts on that line is not refused.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.engine.base import Engine
from temper.errors import TemperError
from temper.serve.limits import HTTPLimits, uvicorn_config
from temper.serve.openai_server import create_app


@dataclass
class ServerHandle:
    """A server running in a background thread. `stop()` shuts it down cleanly."""

    host: str
    port: int
    _server: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        """The root URL, e.g. ``http://127.0.0.1:8000`` (``/health`` lives here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``."""
        return f"{self.url}/v1"

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit (in-flight requests get a few seconds) and join the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"server at {self.url} did not stop within {timeout}s")

    @property
    def open_connections(self) -> int:
        """HTTP connections the server holds open now (idle keep-alive ones included)."""
        return len(self._server.server_state.connections)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``; `TemperError` (one line) if that fails."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise TemperError(f"cannot listen on {host}:{port}: {exc}") from None
    return sock


def run_announced(config: Any, sock: socket.socket, announce: Callable[[], None]) -> Any:
    """Run uvicorn with ``config`` on the bound ``sock`` in this thread until it exits.

    ``announce()`` runs once uvicorn listens, not before: until then a client
    that connects on the announcement is refused. Returns the uvicorn server
    (its ``should_exit`` says whether a signal stopped it).
    """
    import uvicorn

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # a failed startup exits instead, and says why
                announce()

    server = Announcing(config)
    server.run(sockets=[sock])
    return server


def serve_app_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    startup_timeout: float = 30.0,
    limits: HTTPLimits | None = None,
) -> ServerHandle:
    """Run any ASGI ``app`` under uvicorn in a daemon thread with its own event loop.

    ``port=0`` picks a free port. The socket is bound here, before the thread
    starts, so the port is known and a bind error raises in the caller.
    Connections whose request head is slower than ``limits.header_timeout_s``
    are closed (`temper.serve.limits.uvicorn_config`).
    """
    import uvicorn

    sock = _bind(host, port)
    config = uvicorn_config(
        app,
        limits or HTTPLimits(),
        log_level="warning",
        timeout_graceful_shutdown=5,
        lifespan="on",
        access_log=False,
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # reported to the starting thread below
            failure.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(
        target=main, name=f"temper-serve-{sock.getsockname()[1]}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            reason = f": {failure[0]!r}" if failure else ""
            raise RuntimeError(f"server on {host}:{sock.getsockname()[1]} failed to start{reason}")
        time.sleep(0.01)
    return ServerHandle(host, sock.getsockname()[1], server, thread)


def start_server(
    engine: Engine,
    tokenizer: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    model_name: str = "temper",
    close_engine: bool = False,
    limits: HTTPLimits | None = None,
    vision: Any | None = None,
    image_dir: Path | None = None,
) -> ServerHandle:
    """Serve ``engine`` on ``host:port`` (0 = a free port) from a background thread.

    Returns once the server accepts connections. The engine runs on the
    server's event loop; with ``close_engine`` it is closed when the server
    stops, otherwise the caller keeps it (and may use it again after `stop()`).
    ``limits``: body size and read timeouts (`temper.serve.limits.HTTPLimits`).
    ``image_dir``: the folder image paths in requests may name (none: data URLs only).
    """
    app = create_app(
        engine,
        tokenizer,
        model_name,
        close_engine=close_engine,
        limits=limits,
        vision=vision,
        image_dir=image_dir,
    )
    return serve_app_in_thread(app, host, port, limits=limits)
