"""The Reward protocol: score a batch of completions.

A reward is async and batched. It returns one `RewardResult` per input with the
total score, the score of each named component (logged separately), and an
error string when scoring failed (the failure is recorded, never silently
turned into a zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from temper.data.base import Task


@dataclass
class RewardInput:
    task: Task
    prompt_text: str
    completion_text: str


@dataclass
class RewardResult:
    score: float
    components: dict[str, float] = field(default_factory=dict)
    #: Set when scoring failed; `score` is then the configured failure value.
    error: str | None = None
    #: True when the completion was judged correct (for accuracy metrics); None if unknown.
    correct: bool | None = None


@runtime_checkable
class Reward(Protocol):
    name: str

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]: ...
