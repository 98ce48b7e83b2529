"""An OpenAI Agents SDK agent on Temper's tool-use tasks (calc, lookup, lookup_calc).

Ordinary Agents SDK code: an `Agent` with two `function_tool`s, run by `Runner`.
The only Temper-specific line is the model: the SDK's chat-completions model on
the client Temper hands the agent (the gateway serves chat completions, not the
Responses API). Tracing is off: it would export to OpenAI's servers.

    temper train configs/agent_tool_use.toml --agent.function=examples/agents/agents_sdk.py:agent \
        --env.options='{categories=["calc","lookup","lookup_calc"]}'
"""

from __future__ import annotations

import json

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI

from temper.envs.tool_use import calculator as evaluate
from temper.records import Task

set_tracing_disabled(True)


async def agent(client: AsyncOpenAI, task: Task) -> float | None:
    table: dict[str, int] = task.columns.get("table", {})

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return json.dumps(evaluate(expression))

    @function_tool
    def lookup(key: str) -> str:
        """Look up the price of an item."""
        if key not in table:
            return f"error: unknown key {key!r}; known keys: {', '.join(sorted(table))}"
        return json.dumps({"value": table[key]})

    solver = Agent(
        name="solver",
        instructions="Answer with the tools; put the final answer in \\boxed{}.",
        model=OpenAIChatCompletionsModel(model="temper", openai_client=client),
        tools=[calculator, lookup],
    )
    try:
        await Runner.run(solver, str(task.prompt), max_turns=4)
    except MaxTurnsExceeded:
        pass  # the run's reward scores the last reply (no answer: 0)
    return None
