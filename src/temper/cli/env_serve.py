"""`temper env-serve`: serve a config's `[env]` over the env protocol until SIGTERM/Ctrl-C.

One process serves one port and many sessions (asyncio). ``--workers N`` starts N such
processes on ports ``port .. port+N-1`` (list them all in the run's ``env.servers``:
the client spreads episodes over them); the parent forwards SIGTERM/SIGINT to each and
exits when they have.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from typing import Any

from temper.errors import ConfigError


def add_parser(sub: Any) -> None:
    es = sub.add_parser(
        "env-serve",
        help="serve a config's env over the env protocol (ws://HOST:PORT/v1)",
        description="Serve the [env] of CONFIG (with overrides) to runs whose env.servers "
        "name this server, and to OpenEnv clients (base URL http://HOST:PORT, route /ws). "
        "/health and /metrics on the same port.",
    )
    es.add_argument("config", nargs="?", help="TOML config file (its [env] section is served)")
    es.add_argument("--host", default="127.0.0.1", help="address to listen on")
    es.add_argument("--port", type=int, default=8100, help="port (the first, with --workers)")
    es.add_argument("--workers", type=int, default=1, help="server processes, one port each")
    es.add_argument(
        "--ray", type=int, default=0, metavar="N", help="serve from N Ray actors instead"
    )
    es.add_argument(
        "--ray-address", default=None, help='the Ray cluster to join ("auto"; default: local)'
    )
    es.add_argument("--max-sessions", type=int, default=4096, help="sessions per process")
    es.add_argument("--idle-timeout-s", type=float, default=600.0, help="reap idle sessions")
    es.add_argument("--lifetime-s", type=float, default=3600.0, help="reap sessions this old")
    es.add_argument("--max-opens-per-s", type=float, default=2000.0, help="session creation rate")
    es.add_argument(
        "--max-observation-mb", type=float, default=8.0, help="largest answer (observation) sent"
    )


def add_sandbox_parser(sub: Any) -> None:
    ss = sub.add_parser(
        "sandbox-serve",
        help="serve the code sandbox (bubblewrap, warm pool) over the wire (ws://HOST:PORT/v1)",
        description="Run sandboxed code for envs and rewards whose sandbox_servers name this "
        "server. Refuses to start without working bubblewrap unless --allow-unisolated.",
    )
    ss.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ss.add_argument("--port", type=int, default=8200, help="port to listen on")
    ss.add_argument("--pool-size", type=int, default=4, help="warm sandboxes kept ready")
    ss.add_argument("--timeout-s", type=float, default=15.0, help="wall clock per call")
    ss.add_argument("--max-queue", type=int, default=4096, help="calls queued before 'full'")
    ss.add_argument(
        "--allow-unisolated",
        action="store_true",
        help="run with rlimits only where bubblewrap cannot start (not isolation)",
    )


def cmd_sandbox_serve(args: argparse.Namespace, overrides: list[str]) -> int:
    from pydantic import ValidationError

    from temper.sandbox import IsolationUnavailableError, SandboxPool
    from temper.sandbox.service import SandboxService
    from temper.wire.server import WireServer

    if overrides:
        raise ConfigError(f"sandbox-serve takes no config overrides, got {overrides[0]!r}")
    try:
        pool = SandboxPool(
            timeout_s=args.timeout_s, pool_size=args.pool_size,
            allow_fallback=args.allow_unisolated, max_concurrency=max(64, args.pool_size),
        )  # fmt: skip
    except IsolationUnavailableError as exc:
        raise ConfigError(f"{exc}; or pass --allow-unisolated") from None
    except ValidationError as exc:  # a bad --pool-size or --timeout-s
        first = exc.errors()[0]
        flag = "--" + "-".join(str(p) for p in first["loc"]).replace("_", "-")
        raise ConfigError(f"sandbox-serve {flag}: {first['msg']}") from None
    service = SandboxService(pool, args.max_queue)
    server = WireServer(service, args.host, args.port)
    asyncio.run(_serve(server, service, f"sandbox ({args.pool_size} warm)"))
    return 0


def cmd_env_serve(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.workers > 1:
        return _serve_workers(args, overrides)
    from temper.builder.tasks import build_env_spec
    from temper.config import load_config
    from temper.envs.service.messages import env_fingerprint
    from temper.envs.service.openenv_compat import OpenEnvRoute
    from temper.envs.service.server import EnvService, ServiceLimits
    from temper.wire.server import WireServer

    cfg = load_config(args.config, overrides)
    if not cfg.env.enabled:
        raise ConfigError("env-serve needs an env: set env.type (e.g. --env.type=tool_use)")
    if cfg.env.servers:
        raise ConfigError("env-serve serves its env in process: leave env.servers empty")
    limits = ServiceLimits(
        args.max_sessions, args.idle_timeout_s, args.lifetime_s, args.max_opens_per_s,
        int(args.max_observation_mb * 1024 * 1024),
    )  # fmt: skip
    if args.ray:
        return _serve_ray(args, cfg, limits)
    spec = build_env_spec(cfg.env.type, cfg.env.options, cfg.run.seed)
    env = cfg.env
    service = EnvService(
        spec, env.type, env_fingerprint(env.type, env.options), limits, env.options
    )
    openenv = {"/ws": OpenEnvRoute(service)}  # OpenEnv clients: base URL http://host:port
    server = WireServer(service, args.host, args.port, extra_routes=openenv)
    what = f"env {service.env_type!r} ({service.fingerprint}; OpenEnv clients at /ws)"
    asyncio.run(_serve(server, service, what))
    return 0


async def _serve(server: Any, service: Any, what: str) -> None:
    from temper.sandbox import SandboxConfig
    from temper.sandbox.bwrap import reclaim_orphans

    # A server started again after a crash clears what its killed predecessor left.
    reclaim_orphans(SandboxConfig())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except OSError as err:
        raise ConfigError(
            f"cannot listen on {server.host}:{server.port}: {err.strerror or err} "
            "(try another --port)"
        ) from None
    service.start()
    print(f"temper: serving {what} at {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        await service.close()
        print(f"temper: {server.url} stopped", flush=True)


def _serve_ray(args: argparse.Namespace, cfg: Any, limits: Any) -> int:
    """A standing fleet: N actors until SIGTERM/Ctrl-C, then none."""
    import threading

    from temper.builder.tasks import build_env_spec
    from temper.envs.service.ray_fleet import start_env_server_actors
    from temper.ray_cluster import import_ray, start_ray

    cfg.orchestrator.ray_address = args.ray_address
    start_ray(cfg)
    env = cfg.env
    actors = start_env_server_actors(
        args.ray, build_env_spec, env.type, env.options, cfg.run.seed, limits=limits
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        print(f"temper: serving env {env.type!r} from {args.ray} Ray actors:", flush=True)
        for url, pid in zip(actors.urls, actors.pids, strict=True):
            print(f"  {url}  (pid {pid})", flush=True)
        print("env.servers = " + json.dumps(actors.urls), flush=True)
        stop.wait()
    finally:
        actors.stop()
        import_ray().shutdown()
        print("temper: Ray env servers stopped", flush=True)
    return 0


def _serve_workers(args: argparse.Namespace, overrides: list[str]) -> int:
    base = [sys.executable, "-m", "temper", "env-serve"] + ([args.config] if args.config else [])
    flags = [
        f"--host={args.host}", f"--max-sessions={args.max_sessions}",
        f"--idle-timeout-s={args.idle_timeout_s}", f"--lifetime-s={args.lifetime_s}",
        f"--max-opens-per-s={args.max_opens_per_s}",
        f"--max-observation-mb={args.max_observation_mb}",
    ]  # fmt: skip
    argv = [*base, *flags, *(f"--{o}" for o in overrides)]
    # The first worker alone until it serves: bad input fails once, in one line.
    children = [subprocess.Popen([*argv, f"--port={args.port}"])]
    if not _wait_serving(children[0], args.host, args.port):
        return children[0].wait()
    children += [
        subprocess.Popen([*argv, f"--port={args.port + i}"]) for i in range(1, args.workers)
    ]

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return max(codes, key=abs)


def _wait_serving(child: subprocess.Popen, host: str, port: int) -> bool:
    """True once ``child`` answers /health; False if it exits first."""
    import time
    import urllib.request

    probe = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    while child.poll() is None:
        try:
            with urllib.request.urlopen(f"http://{probe}:{port}/health", timeout=2):
                return True
        except OSError:
            time.sleep(0.2)
    return False
