"""`temper serve` and `temper serve-rm`: build the configured engine (or load a reward
model) and serve it until Ctrl-C."""

from __future__ import annotations

import argparse
from pathlib import Path

from temper.config import config_from_dict
from temper.errors import ConfigError
from temper.serve.limits import HTTPLimits, uvicorn_config

# torch, transformers, the builder and the servers are imported where a model is
# loaded, after the flags checked out: a bad flag is reported at once.


def _limits(args: argparse.Namespace) -> HTTPLimits:
    return HTTPLimits.from_flags(args.max_body_mb, args.header_timeout_s, args.body_timeout_s)


def _image_dir(path: str | None) -> Path | None:
    """The ``--allowed-image-dir`` folder, checked at startup rather than per request."""
    if path is None:
        return None
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"--allowed-image-dir {path!r} is not a directory")
    return folder


def run_server(
    model: str = "tiny",
    engine_type: str = "native",
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_name: str | None = None,
    limits: HTTPLimits | None = None,
    image_dir: Path | None = None,
) -> None:
    """Load ``model`` (a path or "tiny"), build the engine and serve until Ctrl-C.

    The port is bound before the model loads, so a busy port fails at once; the
    URL is printed once the port accepts connections. Requests may name image
    files only inside ``image_dir`` (none: data URLs only).
    """
    from temper.builder.engines import build_engine
    from temper.builder.model import load_run_model
    from temper.serve.openai_server import create_app
    from temper.serve.runner import _bind, run_announced

    cfg = config_from_dict({"model": {"path": model}, "engine": {"type": engine_type}})
    sock = _bind(host, port)
    try:
        run_model = load_run_model(cfg, prompts=False)
        engine = build_engine(cfg, run_model)
    except BaseException:
        sock.close()
        raise
    tokenizer, vision = run_model.tokenizer, run_model.vision
    name = model_name or model
    limits = limits or HTTPLimits()
    app = create_app(
        engine,
        tokenizer,
        name,
        close_engine=True,
        limits=limits,
        vision=vision,
        image_dir=image_dir,
    )
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    config = uvicorn_config(app, limits, log_level="info", timeout_graceful_shutdown=5)
    server = run_announced(
        config,
        sock,
        lambda: print(f"temper serve: {name} ({engine_type} engine) at {url}", flush=True),
    )
    if server.should_exit:
        # A shutdown signal (Ctrl-C, SIGTERM) stopped it. uvicorn re-raises the
        # signal only when its handler saw it; report an interrupt either way.
        raise KeyboardInterrupt


def cmd_serve(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides:
        raise ConfigError(f"serve takes no config overrides, got {overrides[0]!r}")
    run_server(
        args.model,
        args.engine,
        args.host,
        args.port,
        model_name=args.served_model_name,
        limits=_limits(args),
        image_dir=_image_dir(args.allowed_image_dir),
    )
    return 0


def cmd_serve_rm(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides:
        raise ConfigError(f"serve-rm takes no config overrides, got {overrides[0]!r}")
    from temper.builder.model import quiet_libraries
    from temper.serve.reward_model import run_rm_server

    quiet_libraries()  # the reward model is loaded without `load_run_model`
    run_rm_server(
        args.model,
        args.host,
        args.port,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        limits=_limits(args),
    )
    return 0
