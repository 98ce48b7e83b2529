"""Attach rewards to trajectories."""

from __future__ import annotations

import math

from temper.records import Task, Trajectory
from temper.rewards.base import Reward, RewardInput, RewardResult, bad_score
from temper.rewards.combine import score_each


async def score_trajectories(
    reward: Reward, tasks: dict[str, Task], trajs: list[Trajectory]
) -> int:
    """Score `trajs` in one batch and store the results on them.

    `correct` is the reward's declared verdict (`RewardResult.correct`), or, when it
    declares none, reward >= 1; `correct_declared` says which.

    Returns the number of trajectories whose scoring failed (their `reward_error`
    is set; their reward is whatever the reward's error policy gave: 0, or NaN
    to mean "drop"). A reward that raises on the batch is retried one
    trajectory at a time (`score_each`), so one bad completion fails alone.
    """
    inputs = [
        RewardInput(tasks[t.task_id], t.prompt_text, t.response_text, list(t.response_ids))
        for t in trajs
    ]
    results = await score_each(reward, inputs)
    failures = 0
    for t, r in zip(trajs, results, strict=True):
        error = _error_of(r)
        t.reward = float(r.score) if r.error is not None or error is None else 0.0
        t.reward_components = dict(r.components)
        t.reward_error = error
        # The reward's declared verdict; without one, the default rule: reward >= 1.
        t.correct_declared = r.correct is not None
        t.correct = (
            r.correct if r.correct is not None else (not math.isnan(t.reward) and t.reward >= 1.0)
        )
        failures += error is not None
    return failures


def _error_of(r: RewardResult) -> str | None:
    """The result's error; a score that is no score (N/A, NaN, inf) is one too."""
    if r.error is not None:
        return r.error
    if r.not_applicable:
        return "the reward does not apply to this sample (it returned None)"
    bad = bad_score(r.score)
    return None if bad is None else f"reward {bad}; expected a finite number"
