"""`WireClient`: one WebSocket to a wire server, many calls in flight over it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from temper.wire.codec import DEFAULT_MAX_FRAME, WireError, decode, encode


class WireClient:
    """Calls to the server at ``url``. Connects on first use and again after a loss; a
    loss fails every call in flight with ``connection_lost`` (the server has dropped
    whatever those calls held). ``on_reconnect`` tells the owner its state is gone."""

    def __init__(
        self, url: str, *, max_frame: int = DEFAULT_MAX_FRAME, connect_timeout_s: float = 10.0
    ) -> None:
        self.url, self.max_frame, self.connect_timeout_s = url, max_frame, connect_timeout_s
        #: The frame codec; only benchmarks/wire_transport.py swaps it (to measure JSON).
        self.encode, self.decode = encode, decode
        self._conn: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        #: Bumped on every new connection: state tied to an older one is gone.
        self.generation = 0

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._reader is not None and not self._reader.done()

    async def _ensure(self) -> ClientConnection:
        async with self._lock:
            if self.connected:
                assert self._conn is not None
                return self._conn
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    conn = await connect(
                        self.url, max_size=self.max_frame, compression=None,
                        ping_interval=20, ping_timeout=60, open_timeout=None,
                    )  # fmt: skip
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
                raise WireError("unavailable", f"cannot connect to {self.url}: {exc}") from None
            self._conn, self.generation = conn, self.generation + 1
            self._reader = asyncio.create_task(self._read(conn))
            return conn

    async def _read(self, conn: ClientConnection) -> None:
        try:
            async for data in conn:
                try:
                    frame = self.decode(data)
                except WireError:
                    continue  # a server that is not ours; the call times out
                future = self._pending.pop(frame.get("id"), None)  # type: ignore[arg-type]
                if future is not None and not future.done():
                    future.set_result(frame)
        except ConnectionClosed:
            pass
        finally:
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(
                        WireError("connection_lost", f"the connection to {self.url} closed")
                    )

    async def call(self, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        """The answer's fields; raises `WireError` (``timeout`` after ``timeout_s``)."""
        conn = await self._ensure()
        call_id = next(self._ids)
        data = self.encode({"id": call_id, "op": op, **fields})
        if len(data) > self.max_frame:
            raise WireError("frame_too_large", f"{op}: {len(data)} bytes > {self.max_frame}")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            await conn.send(data)
            async with asyncio.timeout(timeout_s):
                frame = await future
        except TimeoutError:
            raise WireError("timeout", f"{op} on {self.url}: no answer in {timeout_s} s") from None
        except ConnectionClosed:
            raise WireError("connection_lost", f"the connection to {self.url} closed") from None
        finally:
            self._pending.pop(call_id, None)
        if not frame.get("ok"):
            error = frame.get("error") or {}
            raise WireError(str(error.get("code", "error")), str(error.get("message", "")))
        return frame

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._conn = self._reader = None
