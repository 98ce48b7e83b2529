"""temper.serve: an OpenAI-compatible HTTP server in front of any Temper engine.

`start_server(engine, tokenizer, host, port=0)` serves from a background
thread and returns a `ServerHandle` (`base_url`, `stop()`); `create_app`
builds the FastAPI app; `HTTPLimits` bounds request bodies and read times on
both servers (`temper serve` itself is `temper.cli.serve`; the client side is
`temper.http_client`). See docs/serving.md.

Names are imported lazily, so a command that only parses its limits does not
pull in FastAPI.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "APIError": "temper.serve.protocol",
    "HTTPLimits": "temper.serve.limits",
    "OpenAIServer": "temper.serve.openai_server",
    "create_app": "temper.serve.openai_server",
    "ServerHandle": "temper.serve.runner",
    "serve_app_in_thread": "temper.serve.runner",
    "start_server": "temper.serve.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'temper.serve' has no attribute {name!r}")
