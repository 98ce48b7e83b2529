"""temper.envs: the Env protocol, episode limits and tool calling.

An `Env` turns assistant turns into observations (chat messages) and rewards;
`temper.rollout.multi_turn` drives it against an engine, token in / token out.
`ToolEnv` gives an env Python-function tools with schemas, validation,
timeouts and error observations; the Hermes `<tool_call>` format itself is
`temper.models.tool_calls` (re-exported here for env authors).
"""

from temper.config.env import EpisodeLimits
from temper.envs.base import (
    AssistantTurn,
    Env,
    EpisodeFinish,
    Message,
    StepResult,
)
from temper.envs.tools import Tool, ToolEnv, execute_tool_calls, validate_arguments
from temper.models.tool_calls import ToolCall, ToolCallError, parse_tool_calls

__all__ = [
    "AssistantTurn",
    "Env",
    "EpisodeFinish",
    "EpisodeLimits",
    "Message",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolEnv",
    "execute_tool_calls",
    "parse_tool_calls",
    "validate_arguments",
]
