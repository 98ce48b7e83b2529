"""`[agent]`: episodes played by the user's own agent through the rollout gateway.

The agent is an async Python function ``agent(client, task) -> reward | None``
(``function``), or a program run once per episode (``command``) with
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set. Tasks come from ``[env]`` (its
task set; its episodes are not played) or ``[data]``; episode limits are
``env.limits``. See docs/agents.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    function: str | None = Field(
        None,
        description='"module:function" or "path/file.py:function": an async function '
        "agent(client, task) -> reward | None, where client is an openai.AsyncOpenAI on "
        "the episode's gateway session and task a temper.records.Task.",
    )
    command: list[str] = Field(
        default_factory=list,
        description="A program run per episode instead (argv), with OPENAI_BASE_URL, "
        "OPENAI_API_KEY, TEMPER_TASK (the task as JSON) and TEMPER_REWARD_URL set; its "
        'reward is the last stdout line (a number, or {"reward": x}), or a POST to '
        "TEMPER_REWARD_URL.",
    )
    splice: bool = Field(
        True,
        description="When a request re-renders the same conversation to different ids "
        "(re-spaced tool call, dropped text), feed the engine the exact sampled ids "
        "instead and count a repair; false starts a new training row and counts a break.",
    )
    on_error: Literal["drop", "zero"] = Field(
        "drop",
        description="An agent that raised, hung or returned a non-number: its episode is "
        "left out of training (drop) or scores 0 (zero). Either way the reason is logged.",
    )
    max_concurrency: int | None = Field(
        None, ge=1, description="Agent episodes in flight at once (default: all of a step's)."
    )
    api_key: str = Field(
        "temper", min_length=1, description="The API key agents are given (any is accepted)."
    )
    model_name: str = Field(
        "temper", min_length=1, description="The model name the gateway serves."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> AgentConfig:
        if self.function is not None and self.command:
            raise ValueError("agent: set function or command, not both")
        return self

    @property
    def enabled(self) -> bool:
        return self.function is not None or bool(self.command)
