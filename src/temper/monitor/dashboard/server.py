"""The dashboard's HTTP server: a JSON API over RUNS_DIR and the static page.

`create_app(runs_dir)` builds the FastAPI app; `DashboardServer` runs it with
uvicorn in a background thread (port 0 picks a free port: tests and
notebooks); `serve()` runs it in the foreground (`temper dash`).

API (all GET, JSON; run names are one plain folder name under RUNS_DIR:
anything else is a 400, a missing run or step a 404, both with `detail`):

    /api/runs                             every run: name, steps, last_step, events, status
                                          (failed / finished / running)
    /api/runs/{name}                      metric names, trajectory and eval steps
    /api/runs/{name}/metrics?since=N      metrics.jsonl records from index N; `next`
    /api/runs/{name}/events?since=N       events.jsonl records from index N, each with a
                                          `level` (its own, else derived); `next`
    /api/runs/{name}/evals                eval/step_N.json results
    /api/runs/{name}/steps                steps with saved trajectories
    /api/runs/{name}/trajectories/{step}  sample views (turns, tool calls, tokens, images)
        ?min_reward=&max_reward=&category=&correct=&decode=true&offset=0&limit=200
    /api/runs/{name}/images/{sha256}      one stored image (PNG) of a vision run; a hash
                                          that is not 64 lowercase hex digits is a 400,
                                          and so is a file that is not a regular file
                                          inside the run (a symlink out, a FIFO)

Run names longer than 255 bytes or holding control characters are 400s too;
error messages quote at most a short prefix of what the client sent.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from temper.monitor.dashboard.images import ImageLinks
from temper.monitor.dashboard.runs import (
    ImageHashError,
    RunNameError,
    RunNotFoundError,
    RunsRoot,
    UnsafeFileError,
    check_run_name,
    with_levels,
)
from temper.monitor.dashboard.samples import TokenDecoder, filter_samples, load_samples

STATIC_DIR = Path(__file__).resolve().parent / "static"
DEFAULT_POLL_MS = 3000
LOOPBACK = frozenset({"127.0.0.1", "localhost"})


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf (eval files and trajectories may hold them): send null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """A JSONResponse that writes NaN/Inf as null instead of failing the request."""

    def render(self, content: Any) -> bytes:
        return json.dumps(_finite(content), separators=(",", ":")).encode()


def _cut(path: str, limit: int = 100) -> str:
    """A request path for an error message: a 5,000-character one must not come back whole."""
    return path if len(path) <= limit else path[:limit] + "..."


def allowed_hosts(host: str) -> list[str]:
    """Host headers to accept when bound to `host`.

    On a loopback address only loopback names: a web page elsewhere cannot
    then read the runs through DNS rebinding. Bound elsewhere: any name.
    """
    if host in LOOPBACK:
        return sorted(LOOPBACK)
    return ["*"]  # also for "::1": starlette's host check cannot parse "[::1]:port"


def create_app(
    runs_dir: Path | str, poll_ms: int = DEFAULT_POLL_MS, hosts: list[str] | None = None
) -> FastAPI:
    """The dashboard app serving the run directories under `runs_dir`.

    `hosts`: the accepted Host headers (`allowed_hosts(bind address)`); None accepts any.
    """
    root = RunsRoot(Path(runs_dir))
    decoder = TokenDecoder()
    app = FastAPI(
        title="Temper dashboard",
        default_response_class=SafeJSONResponse,
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
    )
    app.state.root = root
    if hosts is not None and hosts != ["*"]:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)

    @app.exception_handler(RunNameError)
    async def _bad_name(_: Request, exc: RunNameError) -> Response:
        return SafeJSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(ImageHashError)
    async def _bad_hash(_: Request, exc: ImageHashError) -> Response:
        return SafeJSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(UnsafeFileError)
    async def _unsafe_file(_: Request, exc: UnsafeFileError) -> Response:
        return SafeJSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RunNotFoundError)
    async def _missing(_: Request, exc: RunNotFoundError) -> Response:
        return SafeJSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # Unmatched paths (e.g. a name holding "/" after URL decoding) say which path.
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such page or API endpoint: {_cut(request.url.path)}"
        return SafeJSONResponse({"detail": detail}, status_code=exc.status_code)

    def image_links(name: str, run_dir: Path) -> ImageLinks:
        @functools.cache
        def token_text(token_id: int) -> str | None:
            pieces, _ = decoder.pieces(run_dir, [token_id])
            return pieces[0] if pieces else None

        return ImageLinks(f"/api/runs/{quote(name, safe='')}/images/", token_text)

    @app.get("/api/config")
    def config() -> dict[str, Any]:
        """What the page needs to know about this server."""
        return {"runs_dir": str(root.root), "poll_ms": poll_ms}

    @app.get("/api/runs")
    def runs() -> dict[str, Any]:
        return {"runs_dir": str(root.root), "runs": root.list_runs()}

    @app.get("/api/runs/{name}")
    def run(name: str) -> dict[str, Any]:
        return root.summary(name)

    @app.get("/api/runs/{name}/metrics")
    def metrics(name: str, since: int = Query(0, ge=0)) -> dict[str, Any]:
        return root.records_since(name, "metrics.jsonl", since)

    @app.get("/api/runs/{name}/events")
    def events(name: str, since: int = Query(0, ge=0)) -> dict[str, Any]:
        body = root.records_since(name, "events.jsonl", since)
        return {**body, "records": with_levels(body["records"])}

    @app.get("/api/runs/{name}/evals")
    def evals(name: str) -> dict[str, Any]:
        return {"run": name, "evals": root.evals(name)}

    @app.get("/api/runs/{name}/steps")
    def steps(name: str) -> dict[str, Any]:
        return {"run": name, "steps": root.steps(name)}

    @app.get("/api/runs/{name}/trajectories/{step}")
    def trajectories(
        name: str,
        step: int,
        min_reward: float | None = None,
        max_reward: float | None = None,
        category: str | None = None,
        correct: bool | None = None,
        decode: bool = True,
        offset: int = Query(0, ge=0),
        limit: int = Query(200, ge=1, le=5000),
    ) -> dict[str, Any]:
        path = root.trajectory_file(name, step)
        samples, errors = load_samples(path, step, image_links(name, path.parent.parent))
        matched = filter_samples(samples, min_reward, max_reward, category, correct)
        # Pages keep a large `log.trajectories_per_step` from sending megabytes at once.
        shown = matched[offset : offset + limit]
        decode_error = None
        if decode:
            for s in shown:
                pieces, decode_error = decoder.pieces(path.parent.parent, s["tokens"]["ids"])
                if pieces is None:
                    break
                s["tokens"]["text"] = pieces
        rewards = [s["reward"] for s in samples if s["reward"] is not None]
        return {
            "run": name,
            "step": step,
            "total": len(samples),
            "matched": len(matched),
            "offset": offset,
            "categories": sorted({s["category"] for s in samples}),
            "reward_range": [min(rewards), max(rewards)] if rewards else None,
            "samples": shown,
            "decode_error": decode_error,
            "errors": errors,
        }

    @app.get("/api/runs/{name}/images/{sha256}")
    def image(name: str, sha256: str) -> FileResponse:
        # Named by content, so a URL's bytes never change: cache for a year.
        return FileResponse(
            root.image_file(name, sha256),
            media_type="image/png",
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )

    @app.get("/api/runs/{rest:path}", include_in_schema=False)
    def bad_run_path(rest: str) -> None:
        # Reached only when no endpoint matched: after URL decoding the name held a
        # "/" (e.g. "..%2F..%2Fetc" or "%2Fetc"). Say why instead of a bare 404.
        parts = rest.split("/")
        if len(parts) > 2 and parts[1] == "images" and check_run_name(parts[0]):
            raise ImageHashError(
                f"image hash {'/'.join(parts[2:])[:80]!r} must be a SHA-256: "
                "64 lowercase hex digits, no '/'"
            )
        if rest.startswith("/") or ".." in parts or "\\" in rest:
            raise RunNameError(
                f"run name in {_cut('/api/runs/' + rest)!r} must be a single directory name "
                "under RUNS_DIR (no '..', no absolute paths)"
            )
        raise HTTPException(404, f"no such API endpoint: {_cut('/api/runs/' + rest)}")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


class DashboardServer:
    """The dashboard in a background thread; `start()` returns its URL, `stop()` ends it.

    Port 0 takes a free port: the socket is bound here, before uvicorn starts,
    so the URL is known (and the port held) as soon as `start()` returns.
    """

    def __init__(
        self,
        runs_dir: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        poll_ms: int = DEFAULT_POLL_MS,
    ) -> None:
        self.app = create_app(runs_dir, poll_ms=poll_ms, hosts=allowed_hosts(host))
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> str:
        if self._thread is not None:
            raise RuntimeError("dashboard server already started")
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="temper-dash", daemon=True
        )
        self._thread.start()
        # uvicorn sets `started` once it accepts connections.
        deadline = time.monotonic() + timeout
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"dashboard server did not start on {self.url}")
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._server, self._thread = None, None

    def __enter__(self) -> DashboardServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    runs_dir: Path | str,
    host: str = "127.0.0.1",
    port: int = 8765,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Run the dashboard in the foreground until Ctrl-C; `announce(url)` once the
    port accepts connections (before that, a browser opened on it is refused).

    Raises OSError (port in use, bad host) before anything is served.
    """
    sock = _bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    config = uvicorn.Config(
        create_app(runs_dir, hosts=allowed_hosts(host)), log_level="warning", access_log=False
    )
    _AnnouncingServer(config, lambda: announce(url) if announce else None).run(sockets=[sock])


class _AnnouncingServer(uvicorn.Server):
    """A uvicorn server that calls ``on_started()`` once it listens."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # a failed startup exits instead, and says why
            self._on_started()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
