"""`env.type = "openenv"`: train on an OpenEnv env server (https://github.com/meta-pytorch/OpenEnv).

`OpenEnvEnv` plays one episode on one OpenEnv server by speaking its WebSocket
protocol (openenv-core 0.3) itself, with ``websockets``: Temper never imports
``openenv``, which pulls in FastAPI, Gradio and MCP. One episode is one connection
to ``<url>/ws``, so it is one env instance on the server:

- `reset(task, seed)` connects and sends ``{"type": "reset", "data": {"seed": seed,
  **reset_kwargs}}``. The first observation is one user message: the task's prompt,
  a blank line, and the observation's text.
- `step(turn)` sends ``{"type": "step", "data": {action_field: turn.text}}``. The
  observation's text becomes the user message, ``reward`` the turn's reward (None
  stays None), and ``done`` ends the episode.
- `close()` sends ``{"type": "close"}`` and waits for the server to close the socket,
  by which time the server has freed the session's slot.

An observation's text is its ``observation_field`` (a string as it is, anything else
as compact JSON), or the whole observation dict as compact JSON. The server drops
``reward``, ``done`` and ``metadata`` from the observation before sending it.

Failures: a refused or lost connection, a reply that does not come within
``timeout_s``, and a full server (``CAPACITY_REACHED``) raise `InfraError`: the
rollout loop plays the episode again and never trains on it. An ``error`` reply
(an invalid action, the env raised) raises RuntimeError: the episode ends as
``env_error``. OpenEnv servers hold one session each by default
(``max_concurrent_envs=1``), so at most ``max_sessions`` episodes (default 1) of a
run's rollout process are connected at once; the others wait in `reset`.

`openenv_spec(options, seed)` is the registry's spec factory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from temper.data.sampler import ListSampler
from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError, InfraError
from temper.records import Task

#: Prompts of the default tasks: the server's observations carry the actual problem.
DEFAULT_TASKS = (
    "You are acting in an environment. Each message you write is sent to it as your "
    "action, and its reply comes back to you. Here is what it shows now.",
    "Interact with the environment below. Your reply is your next action.",
    "You control an agent in an environment. Read its observation and act.",
    "Solve the task the environment below sets. Answer with your action only.",
)

#: OpenEnv error codes that mean the server could not take the session, not the episode's fault.
INFRA_CODES = frozenset({"CAPACITY_REACHED"})

_OPTIONS = (
    "url", "action_field", "observation_field", "tasks", "eval_size", "max_sessions",
    "timeout_s", "reset_kwargs",
)  # fmt: skip


def ws_url(url: str) -> str:
    """An OpenEnv base URL's WebSocket route: ``http://h:p[/prefix]`` -> ``ws://h:p[/prefix]/ws``."""
    scheme, rest = url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest.rstrip('/')}/ws"


def render(observation: dict[str, Any], field: str | None) -> str:
    """The text of an observation: ``field``'s value, or the whole dict, as the module says."""
    value: Any = observation
    if field is not None:
        if field not in observation:
            have = ", ".join(sorted(observation)) or "none"
            raise RuntimeError(f"the observation has no field {field!r} (it has: {have})")
        value = observation[field]
        if isinstance(value, str):
            return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def first_messages(task: Task, text: str) -> list[Message]:
    """The task's prompt with the first observation's text in the same (last) user message."""
    if isinstance(task.prompt, str):
        return [{"role": "user", "content": f"{task.prompt}\n\n{text}" if task.prompt else text}]
    messages = [dict(m) for m in task.prompt]
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{text}"
        return messages
    return [*messages, {"role": "user", "content": text}]


class SessionGate:
    """At most ``limit`` sessions open at once, per event loop (a semaphore belongs to one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(self.limit)
        return gate


class OpenEnvEnv:
    """One episode on the OpenEnv server at ``url``; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        action_field: str = "message",
        observation_field: str | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        reset_kwargs: dict[str, Any] | None = None,
        gate: SessionGate | None = None,
        max_message_bytes: int = 100 * 1024 * 1024,
    ) -> None:
        self.url, self.ws_url = url, ws_url(url)
        self.action_field, self.observation_field = action_field, observation_field
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.reset_kwargs = dict(reset_kwargs or {})
        self.gate, self.max_message_bytes = gate, max_message_bytes
        self._ws: ClientConnection | None = None
        self._slot: asyncio.Semaphore | None = None

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        await self.close()
        try:
            if self.gate is not None:
                slot = self.gate.semaphore()
                await slot.acquire()
                self._slot = slot
            self._ws = await self._connect()
            data = dict(self.reset_kwargs)
            if seed is not None and seed >= 0:
                data["seed"] = seed
            observation, _, _ = await self._call({"type": "reset", "data": data})
        except BaseException:
            await self.close()
            raise
        return first_messages(task, render(observation, self.observation_field))

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self._ws is None:
            raise RuntimeError("step before reset")
        message = {"type": "step", "data": {self.action_field: turn.text}}
        observation, reward, done = await self._call(message)
        text = render(observation, self.observation_field)
        return StepResult([{"role": "user", "content": text}], reward, done)

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        slot, self._slot = self._slot, None
        try:
            if ws is not None:
                with contextlib.suppress(ConnectionClosed, OSError):  # TimeoutError included
                    await ws.send(json.dumps({"type": "close"}))
                    # The server frees the session, then closes: wait for that, so the
                    # next episode's connection finds the slot free.
                    async with asyncio.timeout(min(5.0, self.timeout_s)):
                        await ws.wait_closed()
                with contextlib.suppress(Exception):
                    await ws.close()
        finally:
            if slot is not None:
                slot.release()

    # -- the wire ------------------------------------------------------------------------

    async def _connect(self) -> ClientConnection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await connect(
                    self.ws_url, max_size=self.max_message_bytes, open_timeout=None
                )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise InfraError(f"cannot connect to {self.ws_url}: {exc}") from None

    async def _call(self, message: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool]:
        """Send ``message``; the reply's (observation, reward, done)."""
        ws, kind = self._ws, message["type"]
        assert ws is not None
        try:
            try:
                await ws.send(json.dumps(message))
            except ConnectionClosed:
                # A server that refused the session said why before it closed.
                async with asyncio.timeout(1.0):
                    raw = await ws.recv()
            else:
                async with asyncio.timeout(self.timeout_s):
                    raw = await ws.recv()
        except TimeoutError:
            self._ws = None  # no request ids: a late reply would answer the next request
            with contextlib.suppress(Exception):
                await ws.close()
            raise InfraError(f"{self.ws_url}: no reply to {kind} in {self.timeout_s:g} s") from None
        except ConnectionClosed as exc:
            self._ws = None
            raise InfraError(
                f"{self.ws_url}: the connection closed during {kind} ({exc})"
            ) from None
        return self._parse(raw, kind)

    def _parse(self, raw: str | bytes, kind: str) -> tuple[dict[str, Any], float | None, bool]:
        try:
            reply = json.loads(raw)
        except ValueError:
            raise RuntimeError(f"{self.ws_url}: the reply to {kind} is not JSON") from None
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, dict):
            raise RuntimeError(f"{self.ws_url}: the reply to {kind} has no data object")
        if reply.get("type") == "error":
            code, text = data.get("code", "UNKNOWN"), data.get("message", "")
            if code in INFRA_CODES:
                raise InfraError(f"{self.ws_url}: {code}: {text}")
            raise RuntimeError(f"OpenEnv server error on {kind}: {text} (code: {code})")
        observation = data.get("observation") or {}
        reward = data.get("reward")
        if not isinstance(observation, dict):
            raise RuntimeError(f"{self.ws_url}: the observation is not an object: {observation!r}")
        if reward is not None and not isinstance(reward, int | float):
            raise RuntimeError(f"{self.ws_url}: the reward is not a number: {reward!r}")
        return observation, None if reward is None else float(reward), bool(data.get("done"))


# ----------------------------------------------------------------------------- spec


def _check(options: dict[str, Any]) -> dict[str, Any]:
    """The options with their defaults, each checked; a bad one is a one-line ConfigError."""
    for key in options:
        if key not in _OPTIONS:
            raise ConfigError(
                f"env.options.{key}: unknown option for env 'openenv'; "
                f"allowed: {', '.join(sorted(_OPTIONS))}"
            )
    url = options.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or url[-3:] == "://":
        raise ConfigError(
            'env.options.url is required: the OpenEnv server\'s base URL, "http://host:port"'
            + ("" if url is None else f", got {url!r}")
        )
    o = {"action_field": "message", "observation_field": None, "tasks": list(DEFAULT_TASKS)}
    o |= {"max_sessions": 1, "timeout_s": 60.0, "reset_kwargs": {}, **options}
    if not isinstance(o["action_field"], str) or not o["action_field"]:
        raise ConfigError(
            f"env.options.action_field must be a field name, got {o['action_field']!r}"
        )
    if o["observation_field"] is not None and not isinstance(o["observation_field"], str):
        raise ConfigError(
            f"env.options.observation_field must be a field name, got {o['observation_field']!r}"
        )
    tasks = o["tasks"]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ConfigError(f"env.options.tasks must be a non-empty list of prompts, got {tasks!r}")
    o.setdefault("eval_size", len(tasks))
    for key in ("eval_size", "max_sessions"):
        if isinstance(o[key], bool) or not isinstance(o[key], int) or o[key] < 1:
            raise ConfigError(f"env.options.{key} must be an integer >= 1, got {o[key]!r}")
    timeout = o["timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"env.options.timeout_s must be a number > 0, got {timeout!r}")
    if not isinstance(o["reset_kwargs"], dict):
        raise ConfigError(f"env.options.reset_kwargs must be a table, got {o['reset_kwargs']!r}")
    return o


def openenv_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for `env.type = "openenv"`.

    Options (defaults): ``url`` (required: the server's base URL, as OpenEnv clients
    take it), ``action_field`` ("message"), ``observation_field`` (None: the whole
    observation as JSON), ``tasks`` (a few generic prompts; the server's first
    observation follows the prompt), ``eval_size`` (as many held-out tasks as
    prompts, cycling), ``max_sessions`` (1: episodes connected at once per rollout
    process; at most the server's ``max_concurrent_envs``), ``timeout_s`` (60 s per
    reply), ``reset_kwargs`` ({}: more keyword arguments for the env's ``reset``).
    The server is not contacted until the first episode.
    """
    o = _check(options)
    prompts: list[str] = o["tasks"]
    train = [Task(f"openenv-{i}", p, category="openenv") for i, p in enumerate(prompts)]
    heldout = [
        Task(f"openenv-eval-{i}", prompts[i % len(prompts)], category="openenv")
        for i in range(o["eval_size"])
    ]
    gate = SessionGate(o["max_sessions"])

    def make_env(task: Task) -> OpenEnvEnv:
        return OpenEnvEnv(
            o["url"], action_field=o["action_field"], observation_field=o["observation_field"],
            timeout_s=float(o["timeout_s"]), reset_kwargs=o["reset_kwargs"], gate=gate,
        )  # fmt: skip

    return EnvSpec(
        make_env=make_env,
        train=ListSampler(train, seed),
        heldout=heldout,
        name=f"openenv:{o['url']}",
    )
