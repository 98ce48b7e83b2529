"""temper.serve: an OpenAI-compatible HTTP server in front of any Temper engine.

`start_server(engine, tokenizer, host, port=0)` serves from a background
thread and returns a `ServerHandle` (`base_url`, `stop()`); `create_app`
builds the FastAPI app; `run_server` is `temper serve`. See docs/serving.md.
"""

from temper.serve.openai_server import (
    ServerHandle,
    create_app,
    run_server,
    serve_app_in_thread,
    start_server,
)
from temper.serve.protocol import APIError

__all__ = [
    "APIError",
    "ServerHandle",
    "create_app",
    "run_server",
    "serve_app_in_thread",
    "start_server",
]
