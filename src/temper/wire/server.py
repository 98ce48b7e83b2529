"""`WireServer`: a `WireHandler` behind a WebSocket, plus ``GET /health`` and ``GET /metrics``.

Each frame runs as its own task, so one slow call (a 1 s tool) never holds up the
others on the same connection. A frame the handler cannot take gets an error answer
with a code and the connection lives on: bad input ends a call, not a connection.
When a connection closes, the handler hears of it (`disconnected`) and frees what that
peer held: a client that vanishes leaks nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, Protocol

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from temper.wire.codec import DEFAULT_MAX_FRAME, WireError, decode, encode, error_frame

log = logging.getLogger(__name__)

#: A route of another protocol on the same port: it gets the whole connection.
Route = Callable[[ServerConnection], Awaitable[None]]


class WireHandler(Protocol):
    """What a wire server serves. ``peer`` is the handler's own per-connection state."""

    def connected(self) -> Any: ...

    async def call(self, peer: Any, frame: dict[str, Any]) -> dict[str, Any]:
        """Answer one request (the answer's fields; ``id`` and ``ok`` are added). Raise
        `WireError` for a refusal with a code."""
        ...

    async def disconnected(self, peer: Any) -> None: ...

    def health(self) -> dict[str, Any]:
        """``GET /health``'s JSON; ``"status": "ok"`` answers 200, anything else 503."""
        ...

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        ...


class WireServer:
    """Serve ``handler`` at ``ws://host:port/<path>``; `start`, then `stop` (or `serve_forever`).

    ``extra_routes`` maps more WebSocket paths to handlers that own their connections
    and speak their own protocol (e.g. OpenEnv's JSON at ``/ws``)."""

    def __init__(
        self,
        handler: WireHandler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        path: str = "/v1",
        max_frame: int = DEFAULT_MAX_FRAME,
        extra_routes: dict[str, Route] | None = None,
    ) -> None:
        self.handler, self.host, self.port, self.path = handler, host, port, path
        self.max_frame, self.extra_routes = max_frame, dict(extra_routes or {})
        #: The frame codec; only benchmarks/wire_transport.py swaps it (to measure JSON).
        self.encode, self.decode = encode, decode
        self._server: Server | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}{self.path}"

    async def start(self) -> None:
        self._server = await serve(
            self._connection,
            self.host,
            self.port,
            max_size=self.max_frame,
            process_request=self._http,
            compression=None,  # msgpack frames of bytes and short strings gain little
            ping_interval=20,
            ping_timeout=60,
            # At stop, a peer whose loop is gone never answers the closing handshake;
            # websockets' default waits 10 s for each such peer.
            close_timeout=1,
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def serve_forever(self) -> None:
        await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    def _http(self, conn: ServerConnection, request: Request) -> Response | None:
        route = request.path.split("?", 1)[0]
        if route == "/health":
            body = self.handler.health()
            ok = body.get("status") == "ok"
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            return conn.respond(status, json.dumps(body) + "\n")
        if route == "/metrics":
            return conn.respond(HTTPStatus.OK, self.handler.metrics())
        if route != self.path and route not in self.extra_routes:
            return conn.respond(HTTPStatus.NOT_FOUND, f"no such path {route!r}; try {self.path}\n")
        return None  # the WebSocket handshake goes on

    async def _connection(self, conn: ServerConnection) -> None:
        route = self.extra_routes.get(conn.request.path.split("?", 1)[0] if conn.request else "")
        if route is not None:
            await route(conn)
            return
        peer = self.handler.connected()
        calls: set[asyncio.Task[None]] = set()
        try:
            async for data in conn:
                task = asyncio.create_task(self._answer(conn, peer, data))
                calls.add(task)
                task.add_done_callback(calls.discard)
        except ConnectionClosed:
            pass
        finally:
            for task in list(calls):
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await self.handler.disconnected(peer)

    async def _answer(self, conn: ServerConnection, peer: Any, data: bytes | str) -> None:
        call_id = None
        try:
            frame = self.decode(data)
            call_id = frame.get("id")
            answer = {"id": call_id, "ok": True, **await self.handler.call(peer, frame)}
        except WireError as exc:
            answer = error_frame(call_id, exc.code, exc.message)
        except Exception as exc:  # a handler bug: answer it, keep serving
            log.exception("wire call %r failed", call_id)
            answer = error_frame(call_id, "internal", f"{type(exc).__name__}: {exc}")
        try:
            data_out = self.encode(answer)
        except Exception as exc:  # an answer msgpack cannot carry
            data_out = self.encode(error_frame(call_id, "internal", f"unencodable answer: {exc}"))
        if len(data_out) > self.max_frame:
            message = f"the answer is {len(data_out)} bytes > {self.max_frame}"
            data_out = self.encode(error_frame(call_id, "frame_too_large", message))
        with contextlib.suppress(ConnectionClosed):  # the peer left; disconnected() cleans up
            await conn.send(data_out)
