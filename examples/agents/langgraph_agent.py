"""A LangGraph ReAct agent on Temper's tool-use tasks (calc, lookup, lookup_calc).

Ordinary LangGraph code: `create_react_agent` over LangChain's `ChatOpenAI` with
two tools. The only Temper-specific part is the base URL and key, taken from the
client Temper hands the agent.

    temper train configs/agent_tool_use.toml --agent.function=examples/agents/langgraph_agent.py:agent \
        --env.options='{categories=["calc","lookup","lookup_calc"]}'
"""

from __future__ import annotations

import contextlib
import json

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent
from openai import AsyncOpenAI

from temper.envs.tool_use import calculator as evaluate
from temper.records import Task


async def agent(client: AsyncOpenAI, task: Task) -> float | None:
    table: dict[str, int] = task.columns.get("table", {})

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return json.dumps(evaluate(expression))

    @tool
    def lookup(key: str) -> str:
        """Look up the price of an item."""
        if key not in table:
            return f"error: unknown key {key!r}; known keys: {', '.join(sorted(table))}"
        return json.dumps({"value": table[key]})

    model = ChatOpenAI(
        model="temper", base_url=str(client.base_url), api_key=client.api_key, max_retries=0
    )
    graph = create_react_agent(model, [calculator, lookup])
    # At most 4 model calls (each graph step is a model or a tools node); past them
    # the run's reward scores the last reply.
    with contextlib.suppress(GraphRecursionError):
        await graph.ainvoke({"messages": [("user", str(task.prompt))]}, {"recursion_limit": 8})
    return None
