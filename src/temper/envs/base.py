"""The Env protocol: a multi-turn environment seen through chat messages.

An episode is: `reset(task, seed)` gives the first observation (chat messages,
e.g. system + user); then, turn after turn, the policy writes one assistant
turn and `step(turn)` answers with new messages (e.g. tool results), an
optional per-turn reward and whether the episode is over; `close()` frees the
env's resources. The env never sees or produces token ids: the rollout loop
(`temper.rollout.multi_turn`) renders messages through the chat template and
keeps the exact tokens. The env does not enforce limits either: the rollout
loop applies `EpisodeLimits` (turns, wall clock, tokens) and records why the
episode ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from temper.models.tool_calls import ToolCall, ToolCallError
from temper.records import Task

#: A chat message: {"role": ..., "content": ...} plus template-specific keys
#: (e.g. "tool_calls", "name", "tool_call_id").
Message = dict[str, Any]

#: Why an episode ended. "done": the env said so. "max_turns", "timeout",
#: "token_budget": an `EpisodeLimits` limit. "length": a turn hit the
#: sampling `max_new_tokens` (and `continue_after_length` is off). "env_error":
#: the env raised (the reason is on the trajectory). "abort": the engine
#: aborted the request. "infra_error": the infrastructure failed the episode (a
#: remote env server lost, a call timed out on the wire; `temper.errors.InfraError`):
#: retried, and never trained on.
EpisodeFinish = Literal[
    "done", "max_turns", "timeout", "token_budget", "length", "env_error", "abort", "infra_error"
]


@dataclass
class AssistantTurn:
    """What the policy wrote in one turn, as the env sees it.

    `token_ids` are exactly the sampled ids (the trajectory's copy is the
    reference; this one is for envs that want it). `text` is their decoding
    without a trailing stop token. `tool_calls` and `parse_errors` come from
    the rollout loop's tool-call parser (Hermes `<tool_call>` blocks by
    default). `finish_reason` is the engine's ("stop" or "length").
    """

    text: str
    token_ids: list[int]
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[ToolCallError] = field(default_factory=list)
    finish_reason: str = "stop"
    index: int = 0


@dataclass
class StepResult:
    """The env's answer to one assistant turn.

    `observation` holds the new messages only (never the history). `reward`
    is this turn's reward, or None for none. `info` is free-form and merged
    into the trajectory's `env_info`. `metrics` are numeric counters summed
    over the episode into the trajectory's `env_metrics` (tool envs count
    calls and errors by kind there).
    """

    observation: list[Message]
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """A multi-turn environment.

    One instance runs one episode at a time; `reset` starts a new one.
    `tools` are OpenAI-format function schemas handed to the chat template
    with the first observation (empty when the env has no tools). Exceptions
    from `reset` or `step` do not crash a rollout: the loop ends the episode
    with finish reason "env_error" and records the reason.
    """

    @property
    def tools(self) -> list[dict[str, Any]]: ...

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        """Start an episode; return the first observation as chat messages."""
        ...

    async def step(self, turn: AssistantTurn) -> StepResult:
        """React to one assistant turn."""
        ...

    async def close(self) -> None:
        """Free resources (processes, sandboxes, connections)."""
        ...
