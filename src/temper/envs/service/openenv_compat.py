"""OpenEnv clients on a Temper env server: the ``/ws`` route of `temper env-serve`.

`OpenEnvRoute` speaks OpenEnv's WebSocket protocol (openenv-core 0.3: JSON text
frames, one reply per message, in order) over the sessions of an `EnvService`, so
``GenericEnvClient(base_url="http://host:port")`` (or any `EnvClient` whose actions
carry a text field) plays the env ``temper env-serve`` serves. One connection holds at
most one episode (one session, with the service's limits, counters and reaper);
``reset`` ends the one before.

Messages and replies:

- ``{"type": "reset", "data": {...}}``: ``data`` may name the task as ``"task"`` (a
  Temper task record: ``{"id", "prompt", "answer", "category", "columns"}``, the id
  optional) or ``"prompt"`` (text or chat messages); without either, the env's own
  held-out tasks are played in turn (an env without tasks of its own needs one).
  ``"seed"`` (an integer) seeds the episode; ``"episode_id"`` names it in ``state``.
- ``{"type": "step", "data": {"message": text}}`` (the field is ``action_field``):
  the text is the assistant turn (its Hermes ``<tool_call>`` blocks parsed, as the
  rollout loop does; no token ids).
- Both answer ``{"type": "observation", "data": {"observation": {...}, "reward", "done"}}``.
  The observation holds ``messages`` (the env's new chat messages; an image part is
  ``{"type": "image", "sha256", "png_base64"}``) and ``text`` (their text, one message
  a line); reset adds ``tools`` and ``task_id``, step adds ``info`` and ``metrics``.
- ``{"type": "state"}``: ``{"type": "state", "data": {"episode_id", "step_count",
  "task_id", "done", "env"}}``.
- ``{"type": "close"}``: no reply; the session ends and the server closes the socket.
- A message that cannot be taken gets ``{"type": "error", "data": {"message", "code"}}``
  with OpenEnv's codes (INVALID_JSON, UNKNOWN_TYPE, VALIDATION_ERROR, EXECUTION_ERROR,
  CAPACITY_REACHED) and Temper's own as ``temper_code``; the connection lives on.
  ``mcp`` messages are not served (UNKNOWN_TYPE).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import uuid
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from temper.envs.base import AssistantTurn, Message
from temper.envs.service.messages import (
    ImageCache,
    refuse_host_images,
    task_to_wire,
    turn_to_wire,
)
from temper.envs.service.server import EnvService
from temper.models.tool_calls import parse_tool_calls
from temper.records import Task
from temper.wire.codec import WireError

#: Temper's wire codes as OpenEnv error codes (the rest are EXECUTION_ERROR).
_CODES = {
    "server_full": "CAPACITY_REACHED",
    "rate_limited": "CAPACITY_REACHED",
    "bad_request": "VALIDATION_ERROR",
    "bad_image": "VALIDATION_ERROR",
}


def error(code: str, message: str, **more: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **more}}


@dataclass
class _Episode:
    """One connection's state: the service's peer and the episode it plays."""

    peer: Any
    session: str | None = None
    episode_id: str | None = None
    task_id: str | None = None
    step_count: int = 0
    done: bool = False


class OpenEnvRoute:
    """`WireServer` route (``extra_routes={"/ws": OpenEnvRoute(service)}``) for OpenEnv clients."""

    def __init__(self, service: EnvService, action_field: str = "message") -> None:
        self.service, self.action_field = service, action_field
        self._ids, self._own = itertools.count(), itertools.count()  # task ids; own tasks

    async def __call__(self, conn: ServerConnection) -> None:
        episode = _Episode(self.service.connected())
        try:
            async for raw in conn:
                reply = await self.answer(episode, raw)
                if reply is None:  # close: no reply; the episode ends as closed
                    await self._end(episode)
                    break
                await conn.send(json.dumps(reply, default=str))
        except ConnectionClosed:
            pass
        finally:
            await self.service.disconnected(episode.peer)
            with contextlib.suppress(Exception):
                await conn.close()

    async def answer(self, episode: _Episode, raw: str | bytes) -> dict[str, Any] | None:
        """The reply to one message (None for close)."""
        self.service.counts["openenv_messages"] += 1
        try:
            message = json.loads(raw)
        except ValueError as exc:
            return self._error(error("INVALID_JSON", f"Invalid JSON: {exc}"))
        if not isinstance(message, dict):
            return self._error(error("VALIDATION_ERROR", "a message is a JSON object"))
        kind, data = message.get("type"), message.get("data")
        if data is None:
            data = {}
        if kind == "close":
            return None
        if kind == "state":
            return {"type": "state", "data": self._state(episode)}
        if kind not in ("reset", "step"):
            hint = " (MCP is not served here)" if kind == "mcp" else ""
            return self._error(error("UNKNOWN_TYPE", f"Unknown message type: {kind}{hint}"))
        if not isinstance(data, dict):
            return self._error(error("VALIDATION_ERROR", f"{kind}: data must be an object"))
        try:
            if kind == "reset":
                return await self._reset(episode, data)
            return await self._step(episode, data)
        except WireError as exc:
            if episode.session is not None and episode.session not in self.service.sessions:
                episode.session = None  # the service ended it (the env raised, or reaped)
            code = _CODES.get(exc.code, "EXECUTION_ERROR")
            return self._error(error(code, exc.message, temper_code=exc.code))

    def _error(self, reply: dict[str, Any]) -> dict[str, Any]:
        self.service.counts[f"openenv_errors_{reply['data']['code']}"] += 1
        return reply

    # -- messages ------------------------------------------------------------------------

    async def _reset(self, episode: _Episode, data: dict[str, Any]) -> dict[str, Any]:
        seed, episode_id = data.get("seed"), data.get("episode_id")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise WireError("bad_request", f"reset: seed must be an integer, got {seed!r}")
        if episode_id is not None and not isinstance(episode_id, str):
            raise WireError(
                "bad_request", f"reset: episode_id must be a string, got {episode_id!r}"
            )
        task = self._task(data)
        await self._end(episode)
        peer = episode.peer
        peer.images.sent.clear()  # an OpenEnv client keeps no images: send each in full
        answer = await self.service.call(
            peer, {"op": "open", "task": task_to_wire(task, ImageCache()), "seed": seed}
        )
        episode.session, episode.task_id = answer["session"], task.id
        episode.episode_id = episode_id or uuid.uuid4().hex
        episode.step_count, episode.done = 0, False
        observation = self._observation(peer, answer["observation"])
        observation |= {"tools": answer.get("tools") or [], "task_id": task.id}
        return {
            "type": "observation",
            "data": {"observation": observation, "reward": None, "done": False},
        }

    async def _step(self, episode: _Episode, data: dict[str, Any]) -> dict[str, Any]:
        text = data.get(self.action_field)
        if not isinstance(text, str):
            raise WireError(
                "bad_request", f"step: data must be {{{self.action_field!r}: <text>}}, got {data!r}"
            )
        if episode.session is None:
            raise WireError("no_episode", "step before reset (or after the episode's env failed)")
        calls, errors = parse_tool_calls(text)
        turn = AssistantTurn(text, [], calls, errors, index=episode.step_count)
        peer = episode.peer
        peer.images.sent.clear()
        answer = await self.service.call(
            peer, {"op": "step", "session": episode.session, "turn": turn_to_wire(turn)}
        )
        episode.step_count += 1
        episode.done = bool(answer["done"])
        observation = self._observation(peer, answer["observation"])
        observation |= {"info": answer.get("info") or {}, "metrics": answer.get("metrics") or {}}
        reply = {"observation": observation, "reward": answer["reward"], "done": episode.done}
        return {"type": "observation", "data": reply}

    def _state(self, episode: _Episode) -> dict[str, Any]:
        return {
            "episode_id": episode.episode_id,
            "step_count": episode.step_count,
            "task_id": episode.task_id,
            "done": episode.done,
            "env": self.service.env_type,
        }

    async def _end(self, episode: _Episode) -> None:
        sid, episode.session = episode.session, None
        if sid is not None and sid in self.service.sessions:
            with contextlib.suppress(WireError):
                await self.service.call(episode.peer, {"op": "close", "session": sid})

    # -- tasks and observations ----------------------------------------------------------

    def _task(self, data: dict[str, Any]) -> Task:
        """The task a reset names, or the env's next own one."""
        record, prompt = data.get("task"), data.get("prompt")
        if record is not None:
            if not isinstance(record, dict):
                raise WireError("bad_request", "reset: task must be an object {id, prompt, ...}")
            record = {"id": f"openenv-{next(self._ids)}", **record}
            refuse_host_images(record.get("prompt"))
            try:
                return Task(**record)
            except TypeError as exc:
                raise WireError("bad_request", f"reset: task: {exc}") from None
        if prompt is not None:
            if not isinstance(prompt, str | list):
                raise WireError("bad_request", "reset: prompt must be text or chat messages")
            refuse_host_images(prompt)
            return Task(f"openenv-{next(self._ids)}", prompt)
        spec = self.service.spec
        if spec.heldout:
            return spec.heldout[next(self._own) % len(spec.heldout)]
        if spec.train is not None:
            return spec.train.sample(1)[0]
        raise WireError(
            "bad_request",
            f"env {self.service.env_type!r} has no tasks of its own: reset with data "
            '{"task": {"id": ..., "prompt": ...}} or {"prompt": ...}',
        )

    def _observation(self, peer: Any, messages: list[Message]) -> dict[str, Any]:
        """Packed messages as JSON can carry them, with their text."""
        known = dict(peer.images.received)
        out = [_json_message(m, known) for m in messages]
        return {"messages": out, "text": "\n".join(_text(m) for m in out)}


def _json_message(message: Message, known: dict[str, bytes]) -> Message:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image" and "sha256" in part:
            png = part.get("png")
            if isinstance(png, bytes):
                known[part["sha256"]] = png
            png = known.get(part["sha256"])
            part = {"type": "image", "sha256": part["sha256"]}
            if png:
                part["png_base64"] = base64.b64encode(png).decode("ascii")
        parts.append(part)
    return {**message, "content": parts}


def _text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        return " ".join(t for t in texts if isinstance(t, str))
    return ""
