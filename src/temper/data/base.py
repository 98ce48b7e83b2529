"""Tasks: the unit a rollout starts from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    """One prompt with what is needed to score it.

    `prompt` is either plain text (sent as a single user message) or a list of
    chat messages (`{"role": ..., "content": ...}`). `answer` is the reference
    answer for verifiable rewards (may be None). `columns` carries every other
    dataset column, passed to reward functions as keyword arguments.
    """

    id: str
    prompt: str | list[dict[str, Any]]
    answer: str | None = None
    category: str = "default"
    columns: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return list(self.prompt)
