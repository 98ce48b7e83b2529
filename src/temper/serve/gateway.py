"""The rollout gateway: an OpenAI-compatible base URL per agent episode.

An agent written against the `openai` client (or a framework on top of it)
trains unchanged: its ``base_url`` is ``http://127.0.0.1:PORT/sessions/ID/v1``.
Each session serves ``POST chat/completions`` (tools and streaming included)
and ``POST completions`` exactly as `temper serve` does (the same
`OpenAIServer`), with three differences:

- the engine it reaches is a `SessionEngine`: every call is planned and
  recorded by the session's `AgentSession` (token-exact rows, extension
  property, repairs and breaks), and the sampled ids, their logprobs and
  their policy versions are kept;
- sampling follows the run, not the agent: temperature, top-p and top-k are
  the run's, ``max_tokens`` is capped by the run's per-turn limit and the
  episode's token budget, ``n`` must be 1, and each call's seed comes from
  the episode seed and the call's index (reproducible episodes);
- ``POST /sessions/ID/reward`` with ``{"reward": x}`` sets the episode's
  reward (for agents that score themselves elsewhere).

An unknown or ended session is a 404 naming it; a call past the episode's
``max_turns`` or token budget is a 400 with code ``max_turns`` or
``token_budget``. The gateway runs on the caller's event loop (the rollout
worker's), where the engine runs. Text only: image content parts are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from temper.config.env import EpisodeLimits
from temper.engine.base import Engine, GenerationResult, SamplingParams, TokenUpdate
from temper.errors import TemperError
from temper.safe_json import loads as safe_loads
from temper.serve import protocol as P
from temper.serve.agent_session import AgentSession
from temper.serve.limits import HTTPLimits, uvicorn_config
from temper.serve.openai_server import OpenAIServer, respond
from temper.serve.protocol import APIError
from temper.serve.runner import _bind


@dataclass
class CallContext:
    """What the session engine needs of the request in flight, beyond its ids."""

    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    chat: bool = True


@dataclass
class GatewaySession:
    """One episode's session: its record, its limits and its view of the engine."""

    record: AgentSession
    params: SamplingParams
    limits: EpisodeLimits
    seed: int | None
    base_url: str = ""
    posted_reward: float | None = None
    #: Why the episode was cut short by the gateway ("max_turns", "token_budget"), if it was.
    cut: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    context: CallContext = field(default_factory=CallContext)
    server: OpenAIServer | None = None
    opened_at: float = field(default_factory=time.monotonic)
    #: Seconds the session's finished calls spent in the engine (queued and generating).
    engine_s: float = 0.0
    #: When the call now in the engine started (None: none is).
    engine_since: float | None = None

    def agent_s(self, now: float | None = None) -> float:
        """Seconds since the session opened that the agent spent on its own: the time
        its calls waited for and ran in the engine is the policy's, not the agent's."""
        now = time.monotonic() if now is None else now
        in_call = 0.0 if self.engine_since is None else now - self.engine_since
        return now - self.opened_at - self.engine_s - in_call

    @contextlib.contextmanager
    def in_engine(self) -> Iterator[None]:
        """Count the enclosed call as engine time (see `agent_s`)."""
        self.engine_since = time.monotonic()
        try:
            yield
        finally:
            self.engine_s += time.monotonic() - self.engine_since
            self.engine_since = None


class SessionEngine:
    """The run's engine as one session sees it (see the module doc)."""

    def __init__(self, engine: Engine, session: GatewaySession, server: OpenAIServer) -> None:
        self.engine, self.session, self.server = engine, session, server

    @property
    def abilities(self) -> Any:
        return self.engine.abilities

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    @property
    def version(self) -> int:
        return self.engine.version

    def _params(self, asked: SamplingParams, prompt_len: int) -> SamplingParams:
        s, run = self.session, self.session.params
        if asked.n != 1:
            raise APIError("n must be 1 in a rollout session (one trajectory)", param="n")
        if s.record.calls >= s.limits.max_turns:
            s.cut = "max_turns"
            raise APIError(
                f"the episode's turn limit is reached (max_turns = {s.limits.max_turns})",
                code="max_turns",
            )
        room = min(self.engine.max_context, s.limits.max_total_tokens or 1 << 30) - prompt_len
        if s.limits.max_generated_tokens is not None:
            room = min(room, s.limits.max_generated_tokens - s.record.generated)
        if room < 1:
            s.cut = "token_budget"
            raise APIError("the episode's token budget is spent", code="token_budget")
        seed = None if s.seed is None else (s.seed * 1_000_003 + s.record.calls) % (1 << 31)
        return replace(
            asked,
            temperature=run.temperature,
            top_p=run.top_p,
            top_k=run.top_k,
            max_new_tokens=max(1, min(asked.max_new_tokens, run.max_new_tokens, room)),
            stop_token_ids=tuple(dict.fromkeys(asked.stop_token_ids + run.stop_token_ids)),
            seed=seed,
        )

    @contextlib.contextmanager
    def _planned(self, ids: list[int], params: SamplingParams) -> Iterator[tuple[Any, Any]]:
        ctx = self.session.context
        rec = self.session.record
        messages = ctx.messages if ctx.chat else None
        plan = rec.plan(ids, messages or [], ctx.tools) if messages else rec.plan(ids, [], None)
        try:
            yield plan, self._params(params, len(plan.ids))
        except BaseException:
            rec.cancel()
            raise

    def _record(self, result: GenerationResult, rendered: list[int]) -> GenerationResult:
        ctx, sample = self.session.context, result.samples[0]
        answer, _ = self.server._message(sample, parse_tools=ctx.tools is not None)
        if not ctx.chat:
            answer = {"role": "assistant", "content": self.server._text(sample)}
        self.session.record.record(sample, ctx.messages or [], answer, rendered, self.version)
        return result

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        with self._planned(prompt_ids, params) as (plan, p), self.session.in_engine():
            result = await self.engine.generate(plan.ids, p)
        return self._record(result, prompt_ids)

    async def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenUpdate]:
        with self._planned(prompt_ids, params) as (plan, p), self.session.in_engine():
            async for update in self.engine.generate_stream(plan.ids, p):  # type: ignore[attr-defined]
                if update.result is not None:
                    self._record(update.result, prompt_ids)
                yield update

    async def close(self) -> None:  # the run owns the engine
        return None


class AgentGateway:
    """Sessions by id, and the HTTP app that serves them (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        model_name: str = "temper",
        limits: HTTPLimits | None = None,
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.server = OpenAIServer(engine, tokenizer, model_name)
        self.limits = limits or HTTPLimits()
        self.sessions: dict[str, GatewaySession] = {}
        self.app = self._build_app()
        self._uvicorn: Any = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    # ---------------------------------------------------------------- sessions
    def open(
        self,
        params: SamplingParams,
        limits: EpisodeLimits,
        seed: int | None = None,
        splice: bool = True,
    ) -> GatewaySession:
        sid = secrets.token_hex(8)
        session = GatewaySession(AgentSession(sid, self.tokenizer, splice), params, limits, seed)
        server = copy.copy(self.server)  # shares the tokenizer, grammars, limits
        server.engine = SessionEngine(self.engine, session, self.server)  # type: ignore[assignment]
        session.server = server
        session.base_url = f"{self.url}/sessions/{sid}/v1"
        self.sessions[sid] = session
        return session

    def close(self, session_id: str) -> GatewaySession:
        return self.sessions.pop(session_id)

    def _session(self, session_id: str) -> GatewaySession:
        session = self.sessions.get(session_id)
        if session is None:
            raise APIError(
                f"unknown session {session_id[:64]!r}: never opened, or its episode has ended",
                status=404,
                code="unknown_session",
            )
        return session

    # ---------------------------------------------------------------- endpoints
    async def chat(self, session_id: str, raw: bytes) -> Any:
        session = self._session(session_id)
        req: P.ChatRequest = P.parse_body(raw, P.ChatRequest)
        messages = P.chat_messages(req)  # text only: no image folder, no vision
        async with session.lock:  # one call at a time: rows stay in order
            session.context = CallContext(messages, P.chat_tools(req), chat=True)
            assert session.server is not None
            return await session.server.chat(raw)

    async def completions(self, session_id: str, raw: bytes) -> Any:
        session = self._session(session_id)
        async with session.lock:
            session.context = CallContext(chat=False)
            assert session.server is not None
            return await session.server.completions(raw)

    def post_reward(self, session_id: str, raw: bytes) -> dict[str, Any]:
        session = self._session(session_id)
        try:
            body = safe_loads(raw)
        except ValueError as exc:
            raise APIError(f"reward body is not JSON: {exc}", param="reward") from None
        value = body.get("reward") if isinstance(body, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise APIError(
                f'body must be {{"reward": <number>}}, got {str(body)[:80]}', param="reward"
            )
        if not math.isfinite(value):
            raise APIError(f"reward must be finite, got {value}", param="reward")
        session.posted_reward = float(value)
        return {"session": session_id, "reward": float(value)}

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="Temper rollout gateway")
        limits = self.limits

        @app.post("/sessions/{sid}/v1/chat/completions")
        async def chat(sid: str, request: Request) -> Response:
            return await respond(request, lambda raw: self.chat(sid, raw), limits)

        @app.post("/sessions/{sid}/v1/completions")
        async def completions(sid: str, request: Request) -> Response:
            return await respond(request, lambda raw: self.completions(sid, raw), limits)

        @app.get("/sessions/{sid}/v1/models")
        async def models(sid: str) -> Response:
            try:
                self._session(sid)
            except APIError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            return JSONResponse(self.server.models())

        @app.post("/sessions/{sid}/reward")
        async def reward(sid: str, request: Request) -> Response:
            async def endpoint(raw: bytes) -> dict[str, Any]:
                return self.post_reward(sid, raw)

            return await respond(request, endpoint, limits)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "sessions": len(self.sessions)}

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
            err = APIError(
                f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code
            )
            return JSONResponse(err.body(), status_code=exc.status_code)

        return app

    # ---------------------------------------------------------------- running
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0: a free port) on this event loop; returns the URL
        once connections are accepted."""
        import uvicorn

        class QuietServer(uvicorn.Server):
            # The run owns the process's signals; the gateway must not take SIGINT.
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        sock = _bind(host, port)
        config = uvicorn_config(
            self.app, self.limits, log_level="warning", access_log=False, lifespan="off"
        )
        self._uvicorn = QuietServer(config)
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:  # a condition, with the task's failure as the way out
            if self._task.done():
                exc = self._task.exception()
                raise TemperError(f"the rollout gateway did not start: {exc}")
            await asyncio.sleep(0.01)
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    def request_stop(self) -> None:
        """Ask the server to exit (safe from any thread); `stop` also waits for it."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    async def stop(self) -> None:
        if self._uvicorn is None or self._task is None:
            return
        self._uvicorn.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
        self._uvicorn = self._task = None
