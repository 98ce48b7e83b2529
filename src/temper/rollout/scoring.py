"""Attach rewards to trajectories."""

from __future__ import annotations

import math

from temper.data.base import Task
from temper.rewards.base import Reward, RewardInput
from temper.rollout.trajectory import Trajectory


async def score_trajectories(
    reward: Reward, tasks: dict[str, Task], trajs: list[Trajectory]
) -> int:
    """Score `trajs` in one batch and store the results on them.

    Returns the number of trajectories whose scoring failed (their `reward_error`
    is set; their reward is whatever the reward's error policy gave: 0, or NaN
    to mean "drop").
    """
    inputs = [RewardInput(tasks[t.task_id], t.prompt_text, t.response_text) for t in trajs]
    results = await reward.score(inputs)
    failures = 0
    for t, r in zip(trajs, results, strict=True):
        t.reward = float(r.score)
        t.reward_components = dict(r.components)
        t.reward_error = r.error
        t.correct = (
            r.correct if r.correct is not None else (not math.isnan(t.reward) and t.reward >= 1.0)
        )
        failures += r.error is not None
    return failures
