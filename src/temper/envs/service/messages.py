"""The env protocol's records on the wire: tasks, turns, step results and images.

Everything crosses as plain msgpack values. An image in a message's content is
``{"type": "image", "sha256": ..., "png": <bytes>}`` the first time a connection
sees it and ``{"type": "image", "sha256": ...}`` after, so a screenshot an episode
shows again, or one many sessions share, crosses once per connection.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.models.tool_calls import ToolCall, ToolCallError
from temper.records import Task
from temper.vision.images import ImageError, load_image
from temper.wire.codec import WireError

#: The protocol's version; a peer speaking another is refused with ``protocol_version``.
PROTOCOL_VERSION = 1

#: `env.options` keys that say where an env's parts run, not what the env is: they may
#: differ between a run and the server it uses (see `env_fingerprint`).
PLACEMENT_OPTIONS = frozenset({"sandbox_servers", "sandbox_workers", "warm_sandboxes"})


def identity_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that make an env what it is: all but the placement ones."""
    return {k: v for k, v in options.items() if k not in PLACEMENT_OPTIONS}


def env_fingerprint(kind: str, options: dict[str, Any]) -> str:
    """What names an env across the wire: its type and its options (placement ones left
    out). A run refuses a server whose fingerprint differs from its own `[env]`."""
    kept = identity_options(options)
    text = json.dumps({"type": kind, "options": kept}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ImageCache:
    """One connection's images, each direction apart: the hashes this side has sent
    (the peer holds their bytes) and the bytes this side has received. Keeping the
    directions apart matters: an image this side sent is not one it can resolve by
    hash, and the peer only ever names by hash what it sent before, in order, on the
    same ordered socket; both ends forget the oldest first, past ``limit``."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self.sent: dict[str, None] = {}
        self.received: dict[str, bytes] = {}

    def pack(self, messages: list[Message]) -> list[Message]:
        return [_map_parts(m, self._pack_part) for m in messages]

    def unpack(self, messages: list[Message]) -> list[Message]:
        return [_map_parts(m, self._unpack_part) for m in messages]

    def _pack_part(self, part: dict[str, Any]) -> dict[str, Any]:
        if part.get("type") != "image" or "image" not in part:
            return part
        try:
            image = load_image(part["image"])
        except ImageError as exc:
            raise WireError("bad_image", str(exc)) from None
        out = {"type": "image", "sha256": image.sha256}
        if image.sha256 not in self.sent:
            _remember(self.sent, image.sha256, None, self.limit)
            out["png"] = image.png
        return out

    def _unpack_part(self, part: dict[str, Any]) -> dict[str, Any]:
        """A part from the peer. Images cross only as bytes: a path or a URL from the
        wire would have this process read its own disk on a peer's say-so."""
        kind = part.get("type")
        if kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not (isinstance(url, str) and url.startswith("data:")):
                raise WireError("bad_image", "an image_url on the wire must be a data: URL")
            return part
        if kind != "image":
            return part
        if not isinstance(part.get("sha256"), str):
            raise WireError("bad_image", "an image on the wire is {type, sha256, png}")
        png, sha = part.get("png"), part["sha256"]
        if isinstance(png, bytes):
            _remember(self.received, sha, png, self.limit)
        elif sha not in self.received:
            raise WireError("bad_image", f"image {sha[:12]} was never sent")
        return {"type": "image", "image": self.received[sha]}


def _remember(table: dict[str, Any], key: str, value: Any, limit: int) -> None:
    """Insert, forgetting the oldest past ``limit`` (the same order at both ends)."""
    if key not in table and len(table) >= limit:
        table.pop(next(iter(table)))
    table[key] = value


def _map_parts(message: Message, fn: Any) -> Message:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": [fn(p) if isinstance(p, dict) else p for p in content]}


def refuse_host_images(prompt: Any) -> None:
    """`WireError("bad_image")` for an image a peer names by path or URL rather than
    giving its bytes (a data: URL or bytes): this process must not read its own disk,
    or the network, on a peer's say-so."""
    if not isinstance(prompt, list):
        return
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            value = part.get("image") if part.get("type") == "image" else None
            if part.get("type") == "image_url":
                value = part.get("image_url")
                value = value.get("url") if isinstance(value, dict) else value
            elif part.get("type") != "image":
                continue
            if not (
                isinstance(value, bytes) or (isinstance(value, str) and value.startswith("data:"))
            ):
                raise WireError("bad_image", "an image from a peer must be bytes or a data: URL")


def task_to_wire(task: Task, images: ImageCache) -> dict[str, Any]:
    record = asdict(task)
    if isinstance(task.prompt, list):
        record["prompt"] = images.pack(task.prompt)
    return record


def task_from_wire(value: Any, images: ImageCache) -> Task:
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        raise WireError("bad_request", "task must be a map with a string 'id'")
    try:
        task = Task(**value)
    except TypeError as exc:
        raise WireError("bad_request", f"task: {exc}") from None
    if isinstance(task.prompt, list):
        task.prompt = images.unpack(task.prompt)
    return task


def turn_to_wire(turn: AssistantTurn) -> dict[str, Any]:
    return asdict(turn)


def turn_from_wire(value: Any) -> AssistantTurn:
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        raise WireError("bad_request", "turn must be a map with a string 'text'")
    try:
        calls = [ToolCall(**c) for c in value.get("tool_calls") or []]
        errors = [ToolCallError(**e) for e in value.get("parse_errors") or []]
        rest = {k: v for k, v in value.items() if k not in ("tool_calls", "parse_errors")}
        return AssistantTurn(**rest, tool_calls=calls, parse_errors=errors)
    except TypeError as exc:
        raise WireError("bad_request", f"turn: {exc}") from None


def result_to_wire(result: StepResult, images: ImageCache) -> dict[str, Any]:
    return {
        "observation": images.pack(list(result.observation)),
        "reward": result.reward,
        "done": bool(result.done),
        "info": _plain(result.info),
        "metrics": {k: float(v) for k, v in result.metrics.items()},
    }


def result_from_wire(value: dict[str, Any], images: ImageCache) -> StepResult:
    return StepResult(
        observation=images.unpack(list(value.get("observation") or [])),
        reward=value.get("reward"),
        done=bool(value.get("done")),
        info=dict(value.get("info") or {}),
        metrics=dict(value.get("metrics") or {}),
    )


def _plain(value: Any) -> Any:
    """``info`` as msgpack carries it: what JSON can say, the rest as its repr."""
    try:
        return json.loads(json.dumps(value, default=repr))
    except (TypeError, ValueError):
        return repr(value)
