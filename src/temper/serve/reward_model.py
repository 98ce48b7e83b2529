"""A reward-model server: a dynamic batcher in front of a sequence-classification model.

`RewardModelBatcher` queues (prompt, response) pairs; a worker task collects
up to ``max_batch_size`` of them, or waits at most ``max_wait_ms`` after the
oldest one arrived, and scores them with `temper.serve.rm_scoring` on the
compute thread (`temper.compute.arun`): one tokenizer call, rows sorted by
token length, one padded forward of an `AutoModelForSequenceClassification`
(with one label) per group of similar lengths. Each pair's future gets its
scalar score, or the error that pair alone causes: a bad pair fails only its
own request. The queue is bounded (``max_queue`` pairs): when full, new
requests fail at once with `Overloaded`; a request of more than
``max_queue`` pairs fails with `TooManyPairs`. `close()` fails every pending
pair with `BatcherClosed` instead of leaving it hanging.

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

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper import compute, safe_json
from temper.errors import ModelLoadError, TemperError
from temper.serve.limits import CLOSE, BodyError, HTTPLimits, read_body, uvicorn_config
from temper.serve.rm_scoring import (
    SPLIT_COST_TOKENS,
    UnscorablePair,
    length_groups,
    score_pairs,
    score_pairs_each,
)

__all__ = [
    "SPLIT_COST_TOKENS",
    "BatcherClosed",
    "Overloaded",
    "RewardModelBatcher",
    "TooManyPairs",
    "UnscorablePair",
    "create_app",
    "length_groups",
    "load_reward_model",
    "parse_score_request",
    "run_rm_server",
    "score_pairs",
    "start_rm_server",
]


class Overloaded(Exception):
    """The batcher's queue is full; the request was not queued."""


class BatcherClosed(Exception):
    """The batcher shut down before (or while) scoring the pair."""


class TooManyPairs(ValueError):
    """A request with more pairs than the whole queue holds: it can never be queued."""


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


def load_reward_model(path: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a one-label sequence-classification model at ``path``.

    ``path`` is a directory or a built-in alias (``tiny-rm``: the shipped tiny
    reward model, see `temper.models.loader`).
    The model is loaded on the compute thread, in eval mode; a missing pad token
    falls back to EOS so batches can be padded.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from temper.models.loader import ALIASES

    directory = ALIASES.get(str(path)) or Path(path).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(
            f"reward model path {str(path)!r} does not exist or is not a directory"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = compute.run(AutoModelForSequenceClassification.from_pretrained, directory)
    except (OSError, ValueError) as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), repr(exc))
        raise ModelLoadError(f"cannot load a reward model from {str(path)!r}: {first}") from exc
    if model.config.num_labels != 1:
        raise ModelLoadError(
            f"reward model {str(path)!r} has num_labels={model.config.num_labels}; need 1"
        )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"tokenizer of {str(path)!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def _index_of(items: list[_Item], exc: BaseException) -> int:
    """Which item's future failed with ``exc``; marks every failure as retrieved."""
    failed = [
        i
        for i, it in enumerate(items)
        if it.future.done() and not it.future.cancelled() and it.future.exception() is exc
    ]
    return failed[0] if failed else -1


@dataclass
class _Item:
    prompt: str
    response: str
    future: asyncio.Future
    arrived: float


class RewardModelBatcher:
    """Dynamic batching of reward-model forwards on one event loop.

    Use from a single event loop: `start()` there (or let the first `score`
    start it), `close()` there. ``forwards`` counts model forwards and
    ``scored`` counts pairs scored.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
        max_length: int | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("need max_batch_size >= 1, max_queue >= 1 and max_wait_ms >= 0")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.max_wait_ms, self.max_queue = (
            max_batch_size,
            max_wait_ms,
            max_queue,
        )
        if max_length is None:
            max_length = getattr(model.config, "max_position_embeddings", None)
        self.max_length = max_length
        self.forwards = 0
        self.scored = 0
        self._items: deque[_Item] = deque()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Pairs queued and not yet taken into a batch."""
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        """Start the worker task on the running loop (idempotent)."""
        if self._closed:
            raise BatcherClosed("reward-model batcher is closed")
        if self._worker is None:
            self._wake = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Scores of ``pairs`` (all queued together, or none: `Overloaded` when full).

        A pair that fails on its own fails the call with its error
        (`UnscorablePair` or `RuntimeError`); pairs of other calls batched
        with it are scored as usual. `TooManyPairs`: more pairs than
        ``max_queue``, so the call could never succeed.
        """
        if not pairs:
            return []
        self.start()
        if len(pairs) > self.max_queue:
            raise TooManyPairs(
                f"request has {len(pairs)} pairs, more than the queue holds (max_queue="
                f"{self.max_queue}); send at most {self.max_queue} per request"
            )
        if len(self._items) + len(pairs) > self.max_queue:
            raise Overloaded(
                f"reward-model queue is full ({len(self._items)} pairs queued, "
                f"max_queue={self.max_queue}); retry later"
            )
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        items = [_Item(p, r, loop.create_future(), now) for p, r in pairs]
        was_empty = not self._items
        self._items.extend(items)
        assert self._wake is not None
        # Wake the worker only when it has something new to decide: the first
        # pair (start the wait) or a full batch (stop waiting). Not per request.
        if was_empty or len(self._items) >= self.max_batch_size:
            self._wake.set()
        try:
            if len(items) == 1:  # the common case; gather would add a task per request
                return [await items[0].future]
            return list(await asyncio.gather(*(it.future for it in items)))
        except BaseException as exc:
            for it in items:  # a cancelled or failed request: drop its other pairs too
                if not it.future.done():
                    it.future.cancel()
            if isinstance(exc, UnscorablePair):  # name the pair
                raise UnscorablePair(f"pairs.{_index_of(items, exc)}: {exc}") from None
            raise

    async def close(self) -> None:
        """Stop the worker; pending pairs fail with `BatcherClosed`."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._fail(list(self._items), "reward-model server is shutting down")
        self._items.clear()

    @staticmethod
    def _fail(items: list[_Item], message: str) -> None:
        for it in items:
            if not it.future.done():
                it.future.set_exception(BatcherClosed(message))

    async def _collect(self) -> list[_Item]:
        assert self._wake is not None
        while not self._items:
            self._wake.clear()
            await self._wake.wait()
        deadline = self._items[0].arrived + self.max_wait_ms / 1000
        while len(self._items) < self.max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # no extra task, unlike wait_for
                    await self._wake.wait()
        batch: list[_Item] = []
        while self._items and len(batch) < self.max_batch_size:
            it = self._items.popleft()
            if not it.future.done():  # skip pairs of cancelled requests
                batch.append(it)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            if not batch:
                continue
            pairs = [(it.prompt, it.response) for it in batch]
            try:
                results = await compute.arun(
                    score_pairs_each, self.model, self.tokenizer, pairs, self.max_length
                )
            except asyncio.CancelledError:
                self._fail(batch, "reward-model server is shutting down")
                raise
            except Exception as exc:  # a bug outside any one pair
                results = [RuntimeError(f"reward-model forward failed: {exc!r}")] * len(batch)
            self.forwards += 1
            for it, result in zip(batch, results, strict=True):
                if it.future.done():
                    continue
                if isinstance(result, Exception):
                    it.future.set_exception(result)
                else:
                    self.scored += 1
                    it.future.set_result(float(result))


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
    """``temper serve-rm``: load ``model`` and serve it until Ctrl-C."""
    import uvicorn

    from temper.serve.runner import _bind

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
    bound = sock.getsockname()[1]
    print(f"temper serve-rm: {model} at http://{host}:{bound}/score", flush=True)
    limits = limits or HTTPLimits()
    config = uvicorn_config(
        create_app(batcher, model, limits), limits, log_level="info", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if server.should_exit:
        raise KeyboardInterrupt
