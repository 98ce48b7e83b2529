"""What keeps a server's memory and connections bounded whatever a client sends.

Both servers (`temper serve`, `temper serve-rm`) use these:

- `HTTPLimits`: the largest request body, how long a request's head (request
  line and headers) may take to arrive, and how long its body may take.
- `read_body(request, limits)`: the body, read in chunks and refused with
  `BodyError` (413) as soon as it passes the limit, before it is all in
  memory; a ``Content-Length`` over the limit is refused before any of the
  body is read. A body that takes too long is refused with 408.
- `uvicorn_config(app, limits, ...)`: a uvicorn config whose HTTP protocol
  closes a connection whose request head has not arrived within the head
  timeout (counted from the connection's start or the previous response's
  end). uvicorn itself has no such timeout: a client that sends half a
  request line and waits held its connection forever. A connection closed
  before its request body was read lingers (`LINGER_S`), dropping input, so
  a client still sending a refused body reads the 413 instead of a reset.
- texts are bounded in characters before they are tokenized with
  `temper.models.loader.longest_token_chars` (a text of more than
  ``max_tokens * longest_token_chars`` characters has more than ``max_tokens``
  tokens).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

#: Defaults of `HTTPLimits` (and of the ``--max-body-mb``, ``--header-timeout-s``
#: and ``--body-timeout-s`` flags of both servers).
DEFAULT_MAX_BODY_MB = 8.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HTTPLimits:
    """Per-request limits. ``max_body_bytes``: larger bodies get 413.
    ``header_timeout_s``: a request head slower than this closes the connection.
    ``body_timeout_s``: a body not all received this long after its head gets 408."""

    max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20)
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError(
                "need max_body_bytes >= 1, header_timeout_s > 0 and body_timeout_s > 0, got "
                f"{self.max_body_bytes}, {self.header_timeout_s}, {self.body_timeout_s}"
            )

    @classmethod
    def from_flags(
        cls, max_body_mb: float, header_timeout_s: float, body_timeout_s: float
    ) -> HTTPLimits:
        """From the servers' command-line flags; `TemperError` (one line) when out of range."""
        from temper.errors import TemperError

        values = (max_body_mb, header_timeout_s, body_timeout_s)
        if not all(0 < v < math.inf for v in values):  # also refuses nan
            raise TemperError(
                "need finite --max-body-mb > 0, --header-timeout-s > 0 and --body-timeout-s > 0"
            )
        return cls(max(1, int(max_body_mb * 2**20)), header_timeout_s, body_timeout_s)


class BodyError(Exception):
    """A request body refused before it was used: ``status`` 413 (too large) or 408 (too slow).

    The response must close the connection (`CLOSE`): the rest of the body was
    never read, so the connection cannot carry another request.
    """

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


#: Headers for a response to a request whose body was not read to the end.
CLOSE = {"connection": "close"}


def _too_large(limits: HTTPLimits) -> BodyError:
    mb = limits.max_body_bytes / 2**20
    return BodyError(
        413,
        f"request body is larger than the server's limit of {limits.max_body_bytes} bytes "
        f"({mb:g} MiB; --max-body-mb)",
        "body_too_large",
    )


async def read_body(request: Any, limits: HTTPLimits) -> bytes:
    """The whole body of a Starlette ``request``, or `BodyError` past the size or time limit.

    Memory stays within about ``max_body_bytes`` plus one chunk: the reading
    stops at the first chunk that passes the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(limits)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise _too_large(limits)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(
            408,
            f"request body not received within {limits.body_timeout_s:g} s (--body-timeout-s)",
            "body_timeout",
        ) from None
    return b"".join(chunks)


#: How long a connection closed with its request body unread keeps reading (and
#: dropping) what the client still sends, so the client gets to read the answer.
LINGER_S = 5.0


class _LingeringTransport:
    """A transport whose `close` lingers while the client may still be sending.

    Closing a TCP socket with unread bytes in its receive buffer sends a reset,
    and a client still writing its (refused) body then loses the 413 it was
    sent: it sees "connection reset" instead of the reason. So when the request
    body was not read to its end, `close` sends the answer and a FIN
    (``write_eof``), keeps reading and dropping input, and closes when the
    client closes or after `LINGER_S`. Everything else goes to the transport.
    """

    def __init__(self, transport: Any, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        import h11

        unread_body = self._protocol.conn.their_state is h11.SEND_BODY
        closing = self.lingering or self._transport.is_closing()
        if closing or not unread_body or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()
        self._transport.resume_reading()
        self._protocol.loop.call_later(LINGER_S, self._transport.close)


def _bounded_protocol(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol, plus a deadline for each request's head and a lingering close."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        """Closes the connection when a request head takes over ``header_timeout_s``,
        and lingers on close while a refused body is still arriving (`_LingeringTransport`).

        The head clock starts when the connection opens and again when a
        response ends; it stops when a request head is complete (uvicorn then
        starts a request cycle). A request in progress is never cut by it: its
        body has `read_body`'s timeout.
        """

        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(_LingeringTransport(transport, self))
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self.transport.lingering:  # what a refused body still sends is dropped
                super().data_received(data)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request head arrived
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            # Armed before the base class runs a pipelined request, which cancels it.
            if not self.transport.is_closing():
                self._arm_head_timer()
            super().on_response_complete()

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            in_progress = self.cycle is not None and not self.cycle.response_complete
            if not in_progress and not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol


def uvicorn_config(app: Any, limits: HTTPLimits, **kwargs: Any) -> Any:
    """A `uvicorn.Config` for ``app`` whose connections obey ``limits.header_timeout_s``
    and linger on close while a refused body arrives."""
    import uvicorn

    return uvicorn.Config(app, http=_bounded_protocol(limits.header_timeout_s), **kwargs)
