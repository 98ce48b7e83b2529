"""A plain `openai`-client agent on Temper's tool-use tasks, trained unchanged.

The agent is ordinary code: it sends the question with its tools, runs the tool
calls the model makes, sends the results back (an error message for a malformed
call, as the env sends), and stops at the first reply without a tool call. Temper
gives it a client whose ``base_url`` is the episode's gateway session; nothing else
about it knows it is being trained.

The tools are the tool-use env's own implementations (calculator, price lookup,
python in the sandbox), so a run of this agent compares like for like with
``configs/tool_use.toml``. It returns None: the run's ``[reward]`` scores the
final answer. Run it: ``temper train configs/agent_tool_use.toml``.
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI

from temper.envs.tool_use import tools_for
from temper.models.tool_calls import parse_tool_calls
from temper.records import Task

_SANDBOX: list[Any] = []


def _sandbox() -> Any:
    if not _SANDBOX:
        from temper.sandbox import Sandbox

        _SANDBOX.append(Sandbox())
    return _SANDBOX[0]


async def agent(client: AsyncOpenAI, task: Task) -> float | None:
    tools = {t.name: t for t in tools_for(task, _sandbox() if task.category == "python" else None)}
    schemas = [t.schema for t in tools.values()]
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task.prompt)}]
    while True:
        reply = await client.chat.completions.create(
            model="temper", messages=messages, tools=schemas
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        # A block the server could not parse stays in the content; like the env, say
        # what is wrong with it and go on, rather than take it as the answer.
        _, malformed = parse_tool_calls(message.content or "")
        if not message.tool_calls and not malformed:
            return None  # the run's reward scores the final answer
        for call in message.tool_calls or []:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.function.name,
                    "content": await _run_tool(tools, call.function.name, call.function.arguments),
                }
            )
        for error in malformed:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": f"invalid_{error.index}",
                    "name": "invalid",
                    "content": f"error: {error.message}",
                }
            )


async def _run_tool(tools: dict[str, Any], name: str, arguments: str) -> str:
    from temper.envs.tools import format_result

    if name not in tools:
        return f"error: unknown tool {name!r}; available tools: {', '.join(sorted(tools))}"
    try:
        return format_result(await tools[name].call(json.loads(arguments), 10.0), 4000)
    except Exception as exc:  # a tool's error goes back to the model, as the env does
        return f"error: tool {name!r} raised {type(exc).__name__}: {exc}"
