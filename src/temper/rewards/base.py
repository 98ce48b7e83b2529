"""The Reward protocol: score a batch of completions.

A reward is async and batched, and says when it can free what it holds (`close`;
`RewardDefaults` supplies a no-op for rewards that hold nothing). It returns one `RewardResult` per input with the
total score, the score of each named component (logged separately), and an
error string when scoring failed (the failure is recorded, never silently
turned into a zero). A score is always a finite number: a reward that yields
NaN, inf, None or a non-number has failed on that sample, and says so in
`error`.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass, field
from traceback import format_exception
from typing import Protocol, runtime_checkable

from temper.records import Task


@dataclass
class RewardInput:
    task: Task
    prompt_text: str
    completion_text: str
    #: The sampled token ids of the completion (single-turn rollouts); None when unknown.
    completion_ids: list[int] | None = None


@dataclass
class RewardResult:
    score: float
    components: dict[str, float] = field(default_factory=dict)
    #: Set when scoring failed; `score` is then the configured failure value.
    error: str | None = None
    #: True when the completion was judged correct (for accuracy metrics); None if unknown.
    correct: bool | None = None
    #: The reward does not apply to this sample (a TRL function returned None):
    #: a weighted sum leaves it out; it is neither a score nor an error.
    not_applicable: bool = False
    #: The formatted traceback of the exception behind `error`, when one was raised
    #: (the pre-run reward check writes it to events.jsonl); None otherwise.
    traceback: str | None = None


@dataclass
class TrainerState:
    """What a TRL reward function sees as ``trainer_state`` (TRL passes its TrainerState).

    ``global_step`` is the number of training steps completed when the batch was
    scored (0 for the first batch, as in TRL); ``max_steps`` is the run's step count.
    """

    global_step: int = 0
    max_steps: int = 0


#: The trainer state of the run in this process; the orchestrator advances it each step.
#: Rollout worker processes (backend = "process" or "ray") score with their own copy,
#: which stays at 0.
TRAINER_STATE = TrainerState()


def bad_score(value: object) -> str | None:
    """Why ``value`` cannot be a reward (NaN, inf, None, not a real number); None if it can.

    Python, numpy and one-element torch numbers count; bools count as 0 and 1.
    """
    if value is None:
        return "None"
    item = getattr(value, "item", None)
    if not isinstance(value, numbers.Real) and callable(item):
        with contextlib.suppress(TypeError, ValueError, RuntimeError):  # numpy, torch scalars
            value = item()
    if not isinstance(value, numbers.Real):
        return f"a {type(value).__name__}"
    if not math.isfinite(value):
        return str(float(value))
    return None


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as text, chained causes included (for `RewardResult.traceback`)."""
    return "".join(format_exception(exc)).rstrip()


@runtime_checkable
class Reward(Protocol):
    """Scores batches; ``close`` frees what it holds (worker processes, a model)."""

    name: str

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]: ...

    def close(self) -> None:
        """Free the reward's resources; safe to call twice, and from inside a running loop."""
        ...


class RewardDefaults:
    """The `Reward` methods a reward that holds nothing leaves out (as `EngineDefaults`)."""

    def close(self) -> None:
        return None
