"""An OpenAI Agents SDK agent on Temper's tool-use tasks (calc, lookup, lookup_calc).

Ordinary Agents SDK code: an `Agent` with two `FunctionTool`s, run by `Runner`.
The only Temper-specific line is the model: the SDK's chat-completions model on
the client Temper hands the agent (the gateway serves chat completions, not the
Responses API). Tracing is off: it would export to OpenAI's servers.

What the built-in tiny model needs: it was pretrained on the tool-use env's terse
tool schemas and no system prompt. With `@function_tool`'s generated schemas
(titles, ``additionalProperties``) and an instructions prompt it answered every
task at once without a tool (reward 0 on 16 episodes), so the tools here carry the
env's own schemas (`tool_use.SCHEMAS`) and the agent has no instructions.

    temper train configs/agent_tool_use.toml --agent.function=examples/agents/agents_sdk.py:agent \
        --env.options='{categories=["calc","lookup","lookup_calc"]}'
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI

from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    Runner,
    set_tracing_disabled,
)
from temper.envs.tool_use import CATEGORY_TOOLS, SCHEMAS
from temper.envs.tool_use import calculator as evaluate
from temper.records import Task

set_tracing_disabled(True)


async def agent(client: AsyncOpenAI, task: Task) -> float | None:
    table: dict[str, int] = task.columns.get("table", {})

    def calculator(args: dict[str, Any]) -> str:
        return json.dumps(evaluate(str(args.get("expression", ""))))

    def lookup(args: dict[str, Any]) -> str:
        key = args.get("key")
        if key not in table:
            return f"error: unknown key {key!r}; known keys: {', '.join(sorted(table))}"
        return json.dumps({"value": table[key]})

    names = CATEGORY_TOOLS[task.category]
    solver = Agent(
        name="solver",
        model=OpenAIChatCompletionsModel(model="temper", openai_client=client),
        # The task's own tools, in the env's order (lookup_calc: lookup, then calculator).
        tools=[_tool(n, {"calculator": calculator, "lookup": lookup}[n]) for n in names],
    )
    # Past 4 model calls the run's reward scores the last reply (no answer: 0).
    with contextlib.suppress(MaxTurnsExceeded):
        await Runner.run(solver, str(task.prompt), max_turns=4)
    return None


def _tool(name: str, fn: Any) -> FunctionTool:
    description, schema = SCHEMAS[name]

    async def invoke(ctx: Any, arguments: str) -> str:
        try:
            return fn(json.loads(arguments or "{}"))
        except Exception as exc:  # the error goes back to the model
            return f"error: {type(exc).__name__}: {exc}"

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
