"""MCP tools in Temper envs: the tool-use tasks with tools from an MCP server.

`MCPServer` (`temper.envs.mcp_server`) is one connection to an MCP server, over
stdio (a command, run in a bubblewrap sandbox by default) or streamable HTTP.
`MCPToolEnv` is a `ToolEnv` that records the MCP tools an episode really called,
in order, in ``StepResult.info["mcp_calls"]`` (so the trajectory's
``env_info["mcp_calls"]``) for rewards to check. `mcp_tool_use_spec` is the
`tool_use` env with its calculator and lookup tools served by an MCP server
(``env.type = "temper.envs.mcp_tools:mcp_tool_use_spec"``), one server for the
run or one per episode (``mcp.scope``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.mcp_server import MCPServer, MCPToolError
from temper.envs.registry import EnvSpec
from temper.envs.tools import Tool, ToolEnv
from temper.errors import ConfigError, InfraError
from temper.records import Task
from temper.sandbox.command import SandboxedCommand
from temper.sandbox.config import SandboxConfig, SandboxError

__all__ = ["MCPServer", "MCPToolEnv", "MCPToolError", "MCPToolUseEnv", "mcp_tool_use_spec"]


class MCPToolEnv(ToolEnv):
    """A `ToolEnv` that records, in order, the names of the tools an episode called
    (every call that passed validation and reached the server, whatever its outcome)
    in each step's ``info["mcp_calls"]``. Subclasses score the answer (`ToolEnv.answer`).
    """

    def __init__(self, tools: Iterable[Tool], **kwargs: Any) -> None:
        self.mcp_calls: list[str] = []
        super().__init__([self._recording(t) for t in tools], **kwargs)

    def _recording(self, tool: Tool) -> Tool:
        inner = tool.fn

        async def call(**arguments: Any) -> Any:
            self.mcp_calls.append(tool.name)
            return await inner(**arguments)

        return Tool(tool.name, tool.description, tool.parameters, call)

    async def step(self, turn: AssistantTurn) -> StepResult:
        result = await super().step(turn)
        result.info["mcp_calls"] = list(self.mcp_calls)
        return result


class MCPToolUseEnv(MCPToolEnv):
    """The `tool_use` env's episode (prompt, scoring) with MCP-served tools.

    Give ``tools`` (from the run's shared server) or ``own_server`` (started at
    `reset`, with ``names`` and ``bind`` chosen from it, and closed at `close`: one
    server per episode). A server of its own that cannot start is an `InfraError`.
    """

    def __init__(
        self,
        task: Task,
        tools: Iterable[Tool],
        tool_timeout_s: float,
        own_server: MCPServer | None = None,
        names: Sequence[str] = (),
        bind: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(tools, tool_timeout_s=tool_timeout_s)
        self._answer = str(task.answer)
        self._own, self._names, self._bind = own_server, list(names), bind

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        self.mcp_calls.clear()
        if self._own is not None and not self.tool_map:
            try:
                tools = await asyncio.to_thread(self._own.tools, self._names, self._bind)
            except MCPToolError as exc:
                raise InfraError(f"the episode's MCP server did not start: {exc}") from exc
            self.tool_map = {t.name: self._recording(t) for t in tools}
        return [{"role": "user", "content": str(task.prompt)}]

    async def answer(self, turn: AssistantTurn) -> StepResult:
        from temper.rewards.answers import extract_boxed

        boxed = extract_boxed(turn.text)
        success = boxed is not None and boxed.strip() == self._answer
        info = {"success": success, "mcp_calls": list(self.mcp_calls)}
        return StepResult([], reward=1.0 if success else 0.0, done=True, info=info)

    async def close(self) -> None:
        if self._own is not None:
            await asyncio.to_thread(self._own.close)


#: A sandboxed server lives for a run or an episode, not for one call: a CPU budget
#: and address space for a Python server and its imports (SandboxConfig's own
#: defaults, 10 s and 1 GiB, are a snippet's).
SERVER_SANDBOX = {"cpu_s": 3600, "memory_mb": 2048, "allow_fallback": False}
_SERVER_KEYS = {"command", "url", "env", "cwd", "connect_timeout_s", "scope", "sandbox"}


def _sandbox_config(value: Any, where: str) -> SandboxConfig:
    """``sandbox = true`` or a table of `SandboxConfig` fields; ConfigError if bad."""
    fields = {} if value is True else value
    if not isinstance(fields, dict):
        raise ConfigError(f"{where}.sandbox must be true, false or a table of sandbox settings")
    try:
        return SandboxConfig(**{**SERVER_SANDBOX, **fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(map(str, first["loc"]))
        raise ConfigError(f"{where}.sandbox.{loc}: {first['msg']}") from None


def server_from_options(value: Any, where: str = "env.options.mcp") -> tuple[MCPServer, str]:
    """(an MCPServer, its scope) from ``{"command": [...]}`` or ``{"url": "http://..."}``,
    plus optional ``env`` (dict), ``cwd``, ``connect_timeout_s``, ``scope`` ("run", the
    default: one server for the run; "episode": one per episode) and ``sandbox`` (a
    command's default is true: it runs in bubblewrap; a table sets `SandboxConfig`
    fields; false runs it as a plain subprocess). ConfigError if bad."""
    usage = f'{where} must be {{"command": [exe, *args]}} or {{"url": "http(s)://..."}}'
    if not isinstance(value, dict):
        raise ConfigError(f"{usage}, got {value!r}")
    unknown = sorted(set(value) - _SERVER_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed {sorted(_SERVER_KEYS)}")
    command, url = value.get("command"), value.get("url")
    ok = (command is None) != (url is None)
    if command is not None:
        ok = ok and isinstance(command, list) and bool(command)
        ok = ok and all(isinstance(c, str) and c for c in command)
    if url is not None:
        ok = ok and isinstance(url, str) and url.startswith(("http://", "https://"))
    env = value.get("env")
    ok = ok and (
        env is None or (isinstance(env, dict) and all(isinstance(v, str) for v in env.values()))
    )
    timeout = value.get("connect_timeout_s", 30.0)
    ok = ok and isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0
    if not ok:
        raise ConfigError(f"{usage}, got {value!r}")
    scope = value.get("scope", "run")
    if scope not in ("run", "episode"):
        raise ConfigError(f'{where}.scope must be "run" or "episode", got {scope!r}')
    boxed = value.get("sandbox", command is not None)
    if boxed is not False and url is not None:
        raise ConfigError(
            f"{where}.sandbox: a server at a URL runs elsewhere; only a command runs in the sandbox"
        )
    sandbox = None
    if boxed is not False:
        sandbox = _sandbox_config(boxed, where)
        try:  # found now, in one line, rather than as every episode's failure
            SandboxedCommand(command, sandbox, value.get("cwd")).close()
        except SandboxError as exc:
            raise ConfigError(
                f"{where}.sandbox: {exc} (sandbox = false runs it unsandboxed)"
            ) from None
    server = MCPServer(
        command,
        url,
        env=env,
        cwd=value.get("cwd"),
        connect_timeout_s=float(timeout),
        sandbox=sandbox,
    )
    return server, scope


def mcp_tool_use_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory: the `tool_use` env with calculator and lookup from an MCP server.

    Options: ``mcp`` (required: ``{"command": [...]}`` or ``{"url": ...}``, with
    ``scope`` and ``sandbox``; see `server_from_options`), ``categories`` (a subset of
    calc, lookup, lookup_calc; default all three), ``eval_size`` (default 200),
    ``tool_timeout_s`` (default 10). The server must offer ``calculator(expression)``
    and ``lookup(key, table)``; ``table`` is bound to the task's price table
    (see examples/mcp/tool_server.py). With scope "run" one connection serves the
    run and opens at the first episode; with "episode" each episode starts its own.
    """
    from temper.data.sampler import ProceduralSampler
    from temper.envs.tool_use import CATEGORY_TOOLS, ToolUseTasks

    allowed = {"mcp", "categories", "eval_size", "tool_timeout_s"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"env.options: unknown option(s) {unknown} for mcp_tool_use; allowed {sorted(allowed)}"
        )
    if "mcp" not in options:
        raise ConfigError('env.options.mcp is required: {"command": [...]} or {"url": "..."}')
    server, scope = server_from_options(options["mcp"])
    supported = ("calc", "lookup", "lookup_calc")
    categories = options.get("categories", list(supported))
    if not isinstance(categories, list) or not set(categories) <= set(supported):
        raise ConfigError(
            f"env.options.categories must be a non-empty subset of {list(supported)} "
            f"for mcp_tool_use (no python tool over MCP), got {categories!r}"
        )
    tasks = ToolUseTasks(tuple(categories))
    timeout = options.get("tool_timeout_s", 10.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError(f"env.options.tool_timeout_s must be a positive number, got {timeout!r}")

    def make_env(task: Task) -> MCPToolUseEnv:
        names = CATEGORY_TOOLS[task.category]
        bind = {"lookup": {"table": task.columns["table"]}} if "lookup" in names else None
        if scope == "episode":
            own = server.copy()
            return MCPToolUseEnv(task, [], float(timeout), own, names, bind)
        return MCPToolUseEnv(task, server.tools(names, bind), float(timeout))

    return EnvSpec(
        make_env=make_env,
        train=ProceduralSampler(tasks, seed),
        heldout=tasks.heldout(int(options.get("eval_size", 200))),
        name="mcp_tool_use",
        close=server.close,
    )
