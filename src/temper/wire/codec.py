"""Frames on the wire: msgpack maps, bytes kept as bytes (images, files), no pickle."""

from __future__ import annotations

from typing import Any

import msgpack

#: A frame larger than this is refused by both ends (``frame_too_large``).
DEFAULT_MAX_FRAME = 16 * 1024 * 1024

#: Error codes that mean the infrastructure failed, not the caller's input: a client
#: retries the episode elsewhere rather than blaming the policy.
INFRA_CODES = frozenset(
    {"connection_lost", "timeout", "server_full", "rate_limited", "shutting_down", "unavailable"}
)


class WireError(Exception):
    """A call that failed: ``code`` names why (e.g. ``unknown_session``, ``bad_request``,
    ``timeout``); ``infra`` is True when the infrastructure, not the request, failed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    @property
    def infra(self) -> bool:
        return self.code in INFRA_CODES


def encode(frame: dict[str, Any]) -> bytes:
    return msgpack.packb(frame, use_bin_type=True)


def decode(data: bytes | str) -> dict[str, Any]:
    """A frame from the wire; raises `WireError("bad_frame")` for anything but a msgpack map."""
    if isinstance(data, str):
        raise WireError("bad_frame", "text frame; the protocol sends binary msgpack frames")
    try:
        frame = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError("bad_frame", f"not msgpack ({type(exc).__name__})") from None
    if not isinstance(frame, dict):
        raise WireError("bad_frame", f"a frame is a map, got {type(frame).__name__}")
    return frame


def error_frame(call_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": call_id, "ok": False, "error": {"code": code, "message": message}}
