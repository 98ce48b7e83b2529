"""Temper's wire: request/response frames in msgpack over one WebSocket per peer pair.

A client opens one connection to a server and multiplexes every call over it: a
request is ``{"id", "op", ...}``, its answer ``{"id", "ok": True, ...}`` or ``{"id",
"ok": False, "error": {"code", "message"}}``. Ids let many calls (many env sessions)
share one socket, so 2,000 sessions cost the server 1 connection, not 2,000.

- `codec`: the frame format and `WireError` (with the codes that mean "infrastructure").
- `server`: `WireServer`, a handler behind a WebSocket, with ``GET /health`` and
  ``GET /metrics`` on the same port.
- `client`: `WireClient`, one multiplexed connection with per-call timeouts.

The env service (`temper.envs.service`) and the sandbox service
(`temper.sandbox.service`) speak it; why msgpack over WebSocket: docs/env_service.md.
"""
