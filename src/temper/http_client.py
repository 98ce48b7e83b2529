"""A small async client for `POST {base_url}/chat/completions` with retries.

Used by the LLM judge (`temper.rewards.judge`), the reward-model client and the
OpenAI-endpoint engine to call `temper serve`, vLLM, OpenAI or any
OpenAI-compatible endpoint; it sits on the ground floor so that none of them
imports the server. Each attempt has a timeout;
connection errors, timeouts, HTTP 408 (the server timed out reading the
request), 429 and 5xx are retried with exponential backoff (``backoff_s *
2**attempt``, capped at ``max_backoff_s``, no jitter); other 4xx answers are
not retried: 413 (body too large, or more reward-model pairs than the
server's queue holds) cannot succeed on a retry. The last failure is raised as
`ChatClientError` with one line saying what happened and how many attempts
were made. It does not stream and does not validate the reply beyond JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import httpx

from temper.errors import ConfigError

Send = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ChatClientError(Exception):
    """A failed chat-completion request. ``retryable``: a later attempt may succeed."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def _short(text: str, n: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[:n] + "..."


def retryable_status(status: int) -> bool:
    """Whether an HTTP error status may go away on a retry: 408, 429 and 5xx."""
    return status in (408, 429) or status >= 500


async def post_json(http: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> Any:
    """POST ``payload`` and return the JSON reply; failures raise `ChatClientError`,
    marked retryable for connection errors, 408, 429 and 5xx (`retryable_status`)."""
    try:
        reply = await http.post(url, json=payload)
    except httpx.TransportError as exc:
        raise ChatClientError(f"cannot reach {url}: {exc!r}", True) from None
    if reply.status_code >= 400:
        retry = retryable_status(reply.status_code)
        raise ChatClientError(f"HTTP {reply.status_code} from {url}: {_short(reply.text)}", retry)
    try:
        return reply.json()
    except ValueError:
        raise ChatClientError(f"reply from {url} is not JSON") from None


class ChatClient:
    """Settings and counters for chat-completion calls; `session()` opens connections.

    ``path`` is the route the httpx transport posts to (default
    ``/chat/completions``; the endpoint engine uses ``/completions``).
    ``transport="openai"`` sends through the ``openai`` package's async client
    (its own retries off), otherwise through httpx. ``concurrency`` bounds the
    requests in flight per session. ``attempts`` counts every request sent,
    retries included.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str = "EMPTY",
        *,
        transport: Literal["httpx", "openai"] = "httpx",
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        concurrency: int = 8,
        path: str = "/chat/completions",
    ) -> None:
        if transport not in ("httpx", "openai"):
            raise ValueError(f"transport must be 'httpx' or 'openai', got {transport!r}")
        if max_retries < 0 or concurrency < 1 or timeout_s <= 0:
            raise ValueError("need max_retries >= 0, concurrency >= 1 and timeout_s > 0")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.transport = transport
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.concurrency = concurrency
        # Where httpx sessions POST (e.g. "/completions"); the openai transport is chat-only.
        self.path = path
        self.attempts = 0

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Send]:
        """Yield ``send(payload) -> reply JSON`` (with retries); close connections after.

        A session lives on one event loop; open one per batch rather than
        keeping a client across `asyncio.run` calls.
        """
        gate = asyncio.Semaphore(self.concurrency)
        # The per-attempt timeout below fires first; the client's own is a backstop.
        backstop = self.timeout_s + 5
        if self.transport == "openai":
            import openai

            api = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=backstop
            )

            async def once(payload: dict[str, Any]) -> dict[str, Any]:
                try:
                    reply = await api.chat.completions.create(**payload)
                except openai.APIStatusError as exc:
                    retry = retryable_status(exc.status_code)
                    body = exc.body if isinstance(exc.body, dict) else {}
                    detail = body.get("message") or exc.message
                    raise ChatClientError(f"HTTP {exc.status_code}: {detail}", retry) from None
                except openai.APIConnectionError as exc:  # includes APITimeoutError
                    raise ChatClientError(f"cannot reach {self.base_url}: {exc}", True) from None
                return reply.model_dump()

            close: Callable[[], Awaitable[None]] = api.close
        else:
            headers = {"Authorization": f"Bearer {self.api_key}"}
            client = httpx.AsyncClient(headers=headers, timeout=backstop)
            url = f"{self.base_url}{self.path}"

            async def once(payload: dict[str, Any]) -> dict[str, Any]:
                return await post_json(client, url, payload)

            close = client.aclose

        async def send(payload: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                return await self._with_retries(once, payload)

        try:
            yield send
        finally:
            await close()

    async def _with_retries(self, once: Send, payload: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.max_retries + 1):
            try:
                self.attempts += 1
                return await asyncio.wait_for(once(payload), self.timeout_s)
            except TimeoutError:
                err = ChatClientError(f"request timed out after {self.timeout_s}s", True)
            except ChatClientError as exc:
                err = exc
            if not err.retryable or attempt == self.max_retries:
                raise ChatClientError(f"{err} (gave up after {attempt + 1} attempt(s))")
            await asyncio.sleep(min(self.backoff_s * 2**attempt, self.max_backoff_s))
        raise AssertionError("unreachable")


def api_key_from_env(name: str | None, field: str = "engine.api_key_env") -> str | None:
    """The API key in environment variable ``name`` (None when unset); a named but
    missing variable is a config error that names ``field``, the setting that named it."""
    if not name:
        return None
    key = os.environ.get(name)
    if key is None:
        raise ConfigError(f"{field} names {name!r}, which is not set")
    return key
