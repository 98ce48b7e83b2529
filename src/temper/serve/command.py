"""`temper serve`: build the configured engine and serve it until Ctrl-C.

Apart from `temper.serve.runner` because it builds components through
`temper.orchestrator.build`, and the builders reach `runner` themselves (the
reward-model client starts servers in threads): importing the builders from
`runner` would make a circle.
"""

from __future__ import annotations

from temper.serve.limits import HTTPLimits, uvicorn_config
from temper.serve.openai_server import create_app
from temper.serve.runner import _bind


def run_server(
    model: str = "tiny",
    engine_type: str = "native",
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_name: str | None = None,
    limits: HTTPLimits | None = None,
) -> None:
    """Load ``model`` (a path or "tiny"), build the engine and serve until Ctrl-C.

    The port is bound before the model loads, so a busy port fails at once.
    """
    import uvicorn

    from temper.config import config_from_dict
    from temper.models import load_tokenizer, resolve_model_path
    from temper.orchestrator.build import build_engine, build_vision

    sock = _bind(host, port)
    try:
        cfg = config_from_dict({"model": {"path": model}, "engine": {"type": engine_type}})
        tokenizer = load_tokenizer(model)
        engine = build_engine(cfg, str(resolve_model_path(model)), tokenizer)
        vision = build_vision(cfg)
    except BaseException:
        sock.close()
        raise
    name = model_name or model
    limits = limits or HTTPLimits()
    app = create_app(engine, tokenizer, name, close_engine=True, limits=limits, vision=vision)
    bound = sock.getsockname()[1]
    print(f"temper serve: {name} ({engine_type} engine) at http://{host}:{bound}/v1", flush=True)
    config = uvicorn_config(app, limits, log_level="info", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if server.should_exit:
        # A shutdown signal (Ctrl-C, SIGTERM) stopped it. uvicorn re-raises the
        # signal only when its handler saw it; report an interrupt either way.
        raise KeyboardInterrupt
