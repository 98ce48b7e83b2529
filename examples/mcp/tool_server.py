"""An MCP server with the `tool_use` env's calculator and lookup tools (FastMCP).

The tools are the env's own functions (`temper.envs.tool_use`), with the env's
hand-written schemas, and return the JSON text the built-in tools show the
model, so an episode through this server sees the same observations. The
lookup table is per task: the server's ``lookup`` takes it as a second argument,
``table``, which the env binds to the task's table and hides from the model
(see `temper.envs.mcp_tools.mcp_tool_use_spec`).

    python examples/mcp/tool_server.py                    # stdio (default)
    python examples/mcp/tool_server.py --http --port 8765 # streamable HTTP at /mcp
"""

from __future__ import annotations

import argparse
import json

from fastmcp import FastMCP
from fastmcp.tools.function_tool import FunctionTool

from temper.envs.tool_use import SCHEMAS, _lookup_tool, calculator

TABLE_SCHEMA = {"type": "object", "additionalProperties": {"type": "integer"}}


def mcp_calculator(expression: str) -> str:
    return json.dumps(calculator(expression))


def mcp_lookup(key: str, table: dict[str, int]) -> str:
    return json.dumps(_lookup_tool(table).fn(key))


def build_server() -> FastMCP:
    server = FastMCP("temper-tool-use")
    for name, fn, extra in (
        ("calculator", mcp_calculator, {}),
        ("lookup", mcp_lookup, {"table": TABLE_SCHEMA}),
    ):
        description, params = SCHEMAS[name]
        params = {
            **params,
            "properties": {**params["properties"], **extra},
            "required": [*params["required"], *extra],
        }
        tool = FunctionTool.from_function(fn, name=name, description=description)
        server.add_tool(tool.model_copy(update={"parameters": params}))
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = build_server()
    if args.http:
        server.run(transport="http", host=args.host, port=args.port, show_banner=False)
    else:
        server.run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
