"""A reward-model server: HTTP in front of a `temper.rewards.rm_batcher.RewardModelBatcher`
(a dynamic batcher of a sequence-classification model's forwards, which the
in-process `reward_model` reward uses as well).

`create_app(batcher)` serves it: ``POST /score`` with
``{"pairs": [{"prompt": ..., "response": ...}, ...]}`` answers
``{"scores": [...]}``; ``GET /health``. Errors are JSON
``{"error": {"message": ..., "type": ...}}``: 400 for a bad request (or a
pair the tokenizer refuses), 408/413 for a body too slow or too large (see
`temper.serve.limits`), 413 for more pairs than the queue holds, 503 when
overloaded or shutting down, 500 for a failing forward.
`start_rm_server(...)` runs it in a background thread (tests, benchmarks);
`run_rm_server(...)` is ``temper serve-rm``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temper import safe_json
from temper.errors import TemperError
from temper.rewards.rm_batcher import (
    BatcherClosed,
    Overloaded,
    RewardModelBatcher,
    TooManyPairs,
    load_reward_model,
)
from temper.rewards.rm_scoring import UnscorablePair
from temper.serve.limits import CLOSE, BodyError, HTTPLimits, read_body, uvicorn_config

__all__ = ["create_app", "parse_score_request", "run_rm_server", "start_rm_server"]


def _bad(where: str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}")


def _pair(i: int, item: Any) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise _bad(f"pairs.{i}", "Input should be an object")
    for key in ("prompt", "response"):
        if key not in item:
            raise _bad(f"pairs.{i}.{key}", "Field required")
        if not isinstance(item[key], str):
            raise _bad(f"pairs.{i}.{key}", "Input should be a valid string")
    extra = next((k for k in item if k not in ("prompt", "response")), None)
    if extra is not None:
        raise _bad(f"pairs.{i}.{extra}", "Extra inputs are not permitted")
    return item["prompt"], item["response"]


def parse_score_request(body: bytes) -> list[tuple[str, str]]:
    """The (prompt, response) pairs of a ``POST /score`` body.

    The body must be ``{"pairs": [{"prompt": str, "response": str}, ...]}`` and
    nothing else. Raises ValueError with a one-line ``"field: problem"``
    message (`temper.safe_json.loads` decodes the JSON: no lone surrogates, no
    NaN, nesting of at most 64). Plain checks rather than a pydantic model:
    this runs on the event loop once per request, and under load that loop is
    the server's bottleneck.
    """
    try:
        data = safe_json.loads(body)
    except safe_json.JSONInputError as exc:
        raise _bad("body", str(exc)) from None
    if not isinstance(data, dict):
        raise _bad("body", "expected a JSON object")
    extra = next((k for k in data if k != "pairs"), None)
    if extra is not None:
        raise _bad(str(extra), "Extra inputs are not permitted")
    if "pairs" not in data:
        raise _bad("pairs", "Field required")
    pairs = data["pairs"]
    if not isinstance(pairs, list):
        raise _bad("pairs", "Input should be a valid list")
    return [_pair(i, item) for i, item in enumerate(pairs)]


def create_app(
    batcher: RewardModelBatcher, model_name: str = "reward-model", limits: HTTPLimits | None = None
) -> Any:
    """The FastAPI app serving ``batcher`` (closed when the app shuts down).

    Request bodies obey ``limits`` (size: 413, time: 408; `temper.serve.limits`).
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    limits = limits or HTTPLimits()

    def error(
        status: int, message: str, kind: str, headers: dict[str, str] | None = None
    ) -> JSONResponse:
        body = {"error": {"message": message, "type": kind}}
        return JSONResponse(body, status_code=status, headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await batcher.close()

    app = FastAPI(title="temper reward model", lifespan=lifespan)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error(exc.status_code, message, "invalid_request")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok" if not batcher.closed else "closing",
            "model": model_name,
            "pending": batcher.pending,
            "forwards": batcher.forwards,
            "scored": batcher.scored,
        }

    async def score(request: Request) -> Response:
        # A plain Starlette endpoint (no FastAPI body model or response
        # encoding): the per-request work on the event loop is what limits
        # throughput once batching makes the forwards cheap.
        try:
            pairs = parse_score_request(await read_body(request, limits))
        except BodyError as exc:
            return error(exc.status, exc.message, exc.code, CLOSE)
        except ClientDisconnect:  # nobody is left to answer
            return error(400, "client disconnected before sending the body", "invalid_request")
        except ValueError as exc:
            return error(400, f"bad request: {exc}", "invalid_request")
        try:
            scores = await batcher.score(pairs)
        except UnscorablePair as exc:
            return error(400, f"bad request: {exc}", "invalid_request")
        except TooManyPairs as exc:  # can never succeed: not 503, which clients retry
            return error(413, str(exc), "too_many_pairs")
        except Overloaded as exc:
            return error(503, str(exc), "overloaded")
        except BatcherClosed as exc:
            return error(503, str(exc), "shutting_down")
        except RuntimeError as exc:
            return error(500, str(exc), "server_error")
        return Response(json.dumps({"scores": scores}), media_type="application/json")

    app.router.add_route("/score", score, methods=["POST"])
    return app


def start_rm_server(
    model: str | Path | tuple[Any, Any],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_batch_size: int = 32,
    max_wait_ms: float = 5.0,
    max_queue: int = 1024,
    limits: HTTPLimits | None = None,
) -> tuple[Any, RewardModelBatcher]:
    """Serve a reward model (a path, or a loaded ``(model, tokenizer)``) from a thread.

    Returns ``(handle, batcher)``; ``handle.url`` is the root URL and
    ``handle.stop()`` shuts it down (pending requests fail with 503).
    """
    from temper.serve.runner import serve_app_in_thread

    loaded = model if isinstance(model, tuple) else load_reward_model(model)
    batcher = RewardModelBatcher(
        *loaded, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_queue=max_queue
    )
    name = "reward-model" if isinstance(model, tuple) else str(model)
    app = create_app(batcher, name, limits)
    return serve_app_in_thread(app, host, port, limits=limits), batcher


def run_rm_server(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    max_batch_size: int = 32,
    max_wait_ms: float = 5.0,
    max_queue: int = 1024,
    limits: HTTPLimits | None = None,
) -> None:
    """``temper serve-rm``: load ``model`` and serve it until Ctrl-C; the URL is
    printed once the port accepts connections."""
    from temper.serve.runner import _bind, run_announced

    if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
        raise TemperError("need --max-batch-size >= 1, --max-queue >= 1 and --max-wait-ms >= 0")
    sock = _bind(host, port)
    try:
        loaded = load_reward_model(model)
    except BaseException:
        sock.close()
        raise
    batcher = RewardModelBatcher(
        *loaded, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_queue=max_queue
    )
    url = f"http://{host}:{sock.getsockname()[1]}/score"
    limits = limits or HTTPLimits()
    config = uvicorn_config(
        create_app(batcher, model, limits), limits, log_level="info", timeout_graceful_shutdown=5
    )
    server = run_announced(
        config, sock, lambda: print(f"temper serve-rm: {model} at {url}", flush=True)
    )
    if server.should_exit:
        raise KeyboardInterrupt
