"""temper.envs: the Env protocol, episode limits and tool calling.

An `Env` turns assistant turns into observations (chat messages) and rewards;
`temper.rollout.multi_turn` drives it against an engine, token in / token out.
`ToolEnv` gives an env Python-function tools with schemas, the Hermes
`<tool_call>` parser, validation, timeouts and error observations.
"""

from temper.envs.base import (
    AssistantTurn,
    Env,
    EpisodeFinish,
    EpisodeLimits,
    Message,
    StepResult,
    ToolCall,
    ToolCallError,
)
from temper.envs.tools import (
    Tool,
    ToolEnv,
    execute_tool_calls,
    parse_tool_calls,
    validate_arguments,
)

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
