"""One MCP server connection through the ``mcp`` SDK: its tools as Temper `Tool`s.

`MCPServer` connects to one server, over stdio (a command and its arguments: the
server runs as a subprocess, in a bubblewrap sandbox when given a `SandboxConfig`)
or streamable HTTP (a URL), lists its tools and calls them. `MCPServer.tools()`
turns each listed tool into a `Tool`: its JSON input schema becomes the Tool's
``parameters`` (what the chat template shows the model), and a call goes through
``call_tool``; the result's text content, joined, is the tool's result string. An
error result (``isError``), a lost connection or any other failure raises
`MCPToolError`, which `temper.envs.tools.execute_tool_calls` turns into an
"error: ..." message to the model (the episode goes on); the Tool's timeout
(``ToolEnv.tool_timeout_s``) bounds each call.

A connection lives on its own thread and event loop, so episodes on any loop (or
thread) share it, and calls may run concurrently (the SDK matches responses to
requests by id). A connection that is lost (the server crashed) fails the calls in
flight and is re-opened by the next call. Arguments can be *bound* per episode
(``bind={"lookup": {"table": ...}}``): they are removed from the schema the model
sees and added to every call.

The ``mcp`` package (the ``mcp`` extra) is imported only when a server connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from temper.envs.tools import Tool
from temper.sandbox.command import SandboxedCommand
from temper.sandbox.config import SandboxConfig


class MCPToolError(Exception):
    """An MCP tool call failed: an error result, a lost connection, a protocol error."""


def _ordered_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with ``type``, ``properties``, ``required`` first (as Temper writes schemas):
    the chat template renders the schema's JSON, so key order is part of the prompt."""
    head = {k: schema[k] for k in ("type", "properties", "required") if k in schema}
    return {**head, **{k: v for k, v in schema.items() if k not in head}}


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, or of the first leaf of an exception group
    (anyio task groups wrap a transport's error in one)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _result_text(result: Any) -> str:
    """The text of a CallToolResult: its text blocks joined by newlines (other blocks
    are named); the structured content as JSON when there is no text."""
    parts: list[str] = []
    for block in result.content or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', '?')} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


class MCPServer:
    """One MCP server connection, shared by every episode of a run (see the module doc).

    Give ``command`` (``[executable, *args]``, stdio) or ``url`` (streamable HTTP).
    With ``sandbox`` (a `SandboxConfig`; stdio only) the command runs inside a
    bubblewrap sandbox (`temper.sandbox.command`), started anew at each connect.
    `connect()` (called by `tools()` / `call()` when needed) starts the connection;
    `close()` ends it (and a stdio server's process). Thread-safe.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        url: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout_s: float = 30.0,
        errlog: Any = None,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("MCPServer needs exactly one of command (stdio) or url (HTTP)")
        if sandbox is not None and command is None:
            raise ValueError("MCPServer: only a command (stdio) server runs in a sandbox")
        if command is not None and (
            not command or not all(isinstance(c, str) and c for c in command)
        ):
            raise ValueError(f"MCPServer command must be a non-empty list of strings: {command!r}")
        self.command = list(command) if command is not None else None
        self.url = url
        self.env = dict(env) if env else None
        self.cwd = cwd
        self.connect_timeout_s = connect_timeout_s
        self.errlog = errlog if errlog is not None else sys.stderr
        self.sandbox = sandbox
        self.listed: list[Any] = []  # the SDK's Tool objects, from list_tools
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._runner_task: asyncio.Task[None] | None = None
        self._closed = False

    def copy(self) -> MCPServer:
        """A new, unconnected server of the same settings (one per episode)."""
        return MCPServer(
            self.command,
            self.url,
            env=self.env,
            cwd=self.cwd,
            connect_timeout_s=self.connect_timeout_s,
            errlog=self.errlog,
            sandbox=self.sandbox,
        )

    @property
    def where(self) -> str:
        return " ".join(self.command) if self.command is not None else str(self.url)

    # -- the background loop -------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="temper-mcp", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """Open the transport and session, list the tools, then hold them until stopped
        (or until the connection breaks)."""
        from mcp.client.session import ClientSession

        session = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.command is not None:
                    from mcp.client.stdio import StdioServerParameters, stdio_client

                    argv = self.command
                    if self.sandbox is not None:  # its scratch dir goes when the server does
                        env = {**self.sandbox.env, **(self.env or {})}
                        box = self.sandbox.model_copy(update={"env": env})
                        boxed = SandboxedCommand(argv, box, self.cwd)
                        stack.callback(boxed.close)
                        argv = boxed.argv
                    params = StdioServerParameters(
                        command=argv[0], args=argv[1:], env=self.env, cwd=self.cwd
                    )
                    streams = await stack.enter_async_context(stdio_client(params, self.errlog))
                else:
                    from mcp.client.streamable_http import streamable_http_client

                    streams = await stack.enter_async_context(streamable_http_client(self.url))
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                listed, cursor = [], None
                while True:
                    from mcp.types import PaginatedRequestParams

                    params_ = PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params_)
                    listed.extend(page.tools)
                    cursor = getattr(page, "next_cursor", None)
                    if not cursor:
                        break
                self.listed, self._session = listed, session
                self._stop = asyncio.Event()
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, Exception | asyncio.CancelledError):
                raise
        finally:
            if self._session is session:
                self._session = None

    def connect(self) -> None:
        """Connect (once; again after the connection was lost). Raises MCPToolError."""
        with self._lock:
            if self._closed:
                raise MCPToolError(f"MCP server {self.where!r} is closed")
            if self._session is not None:
                return
            self._stop_runner()  # what is left of a lost connection
            loop = self._ensure_loop()

            async def start() -> None:
                ready: asyncio.Future[None] = loop.create_future()
                self._runner_task = loop.create_task(self._serve(ready))
                await asyncio.wait_for(ready, self.connect_timeout_s)

            try:
                asyncio.run_coroutine_threadsafe(start(), loop).result()
            except Exception as exc:
                self._stop_runner()
                raise MCPToolError(
                    f"cannot connect to MCP server {self.where!r}: {_describe(exc)}"
                ) from exc

    def _stop_runner(self) -> None:
        task = self._runner_task
        if task is None or self._loop is None:
            return

        async def stop() -> None:
            if self._stop is not None:
                self._stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except BaseException:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(15.0)
        self._runner_task = None
        self._stop = None

    def close(self) -> None:
        """End the connection (a stdio server process exits) and the loop's thread."""
        with self._lock:
            self._closed = True
            self._stop_runner()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._thread is not None:
                    self._thread.join(5.0)
                if not self._loop.is_running():
                    self._loop.close()
                self._loop = self._thread = None

    # -- calls ---------------------------------------------------------------------

    async def _call_on_loop(
        self, name: str, arguments: dict[str, Any], timeout_s: float | None
    ) -> str:
        session = self._session
        if session is None:
            raise MCPToolError(f"MCP server {self.where!r} is not connected")
        try:
            result = await session.call_tool(name, arguments, read_timeout_seconds=timeout_s)
        except Exception as exc:
            from mcp.types import CONNECTION_CLOSED

            if getattr(getattr(exc, "error", None), "code", None) == CONNECTION_CLOSED:
                if self._session is session:  # the next call reconnects
                    self._session = None
                    if self._stop is not None:
                        self._stop.set()
                raise MCPToolError(
                    f"MCP server {self.where!r} closed the connection (it crashed or exited); "
                    "the next call reconnects"
                ) from exc
            if callable(getattr(exc, "errors", None)) and hasattr(exc, "title"):  # pydantic's
                problems = "; ".join(
                    f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()
                )
                raise MCPToolError(f"malformed {exc.title} from the server: {problems}") from exc
            raise MCPToolError(_describe(exc)) from exc
        text = _result_text(result)
        if getattr(result, "is_error", False):
            raise MCPToolError(text or "the MCP server returned an error with no text")
        return text

    async def call(
        self, name: str, arguments: Mapping[str, Any], timeout_s: float | None = None
    ) -> str:
        """Call tool ``name`` from any event loop; its text, or MCPToolError."""
        if self._session is None or self._runner_task is None or self._runner_task.done():
            await asyncio.to_thread(self.connect)  # the first call, or after a crash
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(
            self._call_on_loop(name, dict(arguments), timeout_s), self._loop
        )
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # a Tool timeout: cancel the request on the MCP loop too
            raise

    def tools(
        self,
        names: Iterable[str] | None = None,
        bind: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Tool]:
        """The server's tools as Temper Tools (``names``: these, in this order).

        ``bind[tool]`` maps argument names to values that every call of that
        tool gets; they are not in the schema the model sees.
        """
        if not self.listed or self._session is None:
            self.connect()
        by_name = {t.name: t for t in self.listed}
        wanted = list(names) if names is not None else list(by_name)
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise MCPToolError(
                f"MCP server {self.where!r} has no tool(s) {missing}; it has {sorted(by_name)}"
            )
        return [self._tool(by_name[n], dict((bind or {}).get(n, {}))) for n in wanted]

    def _tool(self, listed: Any, bound: dict[str, Any]) -> Tool:
        schema = dict(listed.input_schema or {"type": "object"})
        if bound:
            props = {k: v for k, v in schema.get("properties", {}).items() if k not in bound}
            schema["properties"] = props
            if "required" in schema:
                schema["required"] = [r for r in schema["required"] if r not in bound]
        name = listed.name

        async def call(**arguments: Any) -> str:
            return await self.call(name, {**arguments, **bound})

        return Tool(name, listed.description or "", _ordered_schema(schema), call)
