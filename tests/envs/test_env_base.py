"""The Env protocol's records and the episode limits config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from temper.envs import AssistantTurn, Env, EpisodeLimits, StepResult, ToolEnv
from temper.records import Task


class MinimalEnv:
    @property
    def tools(self) -> list[dict]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[dict]:
        return task.messages()

    async def step(self, turn: AssistantTurn) -> StepResult:
        return StepResult([], done=True)

    async def close(self) -> None:
        return None


def test_envs_satisfy_the_protocol() -> None:
    assert isinstance(MinimalEnv(), Env)
    assert isinstance(ToolEnv([]), Env)
    assert not isinstance(object(), Env)


def test_records_defaults() -> None:
    result = StepResult([{"role": "user", "content": "hi"}])
    assert (result.reward, result.done, result.info, result.metrics) == (None, False, {}, {})
    turn = AssistantTurn("hi", [1, 2])
    assert (turn.tool_calls, turn.parse_errors, turn.finish_reason, turn.index) == (
        [],
        [],
        "stop",
        0,
    )


def test_limits_defaults_and_bounds() -> None:
    limits = EpisodeLimits()
    assert limits.max_turns == 8
    assert limits.timeout_s is None
    assert limits.max_total_tokens is None and limits.max_generated_tokens is None
    assert limits.continue_after_length is False
    for field, value in [
        ("max_turns", 0),
        ("max_turns", 1001),
        ("timeout_s", 0),
        ("max_total_tokens", 1),
        ("max_generated_tokens", 0),
        ("max_truns", 3),
    ]:
        with pytest.raises(ValidationError, match=field):
            EpisodeLimits(**{field: value})
    with pytest.raises(ValidationError):
        limits.max_turns = 3  # frozen: limits are shared by concurrent episodes
    assert all(f.description for f in EpisodeLimits.model_fields.values())
