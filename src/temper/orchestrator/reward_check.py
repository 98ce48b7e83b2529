"""Try the reward on a few real samples before the step-0 eval.

A reward that fails on everything (a typo in a reward function, a missing
column, a judge that cannot be reached) would otherwise show up only after the
step-0 eval, as a held-out accuracy of 0.000. `check_reward_on_samples` generates
one completion for each of the first ``reward.check_samples`` training tasks (the
held-out ones when the tasks are procedural), scores them through the run's
rollout source, and, when every one failed, writes the error with its full
traceback to ``events.jsonl`` (``kind = "reward_check_failed"``) and stops the run
with one line (`TemperError`: exit 2). One sample that scores is enough to pass:
the reward's errors on single samples are reported during the run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from temper.backends.base import Rollouts
from temper.builder.rewards import build_reward
from temper.config import Config
from temper.errors import TemperError
from temper.monitor.sinks import JsonlSink
from temper.orchestrator.rl_step import sampling_params
from temper.records import Task, Trajectory
from temper.rewards.base import Reward, RewardInput
from temper.rewards.combine import score_each

#: Added to ``run.seed`` for the check's samples (the eval uses + 7919).
_SEED_OFFSET = 4099


async def check_reward_on_samples(
    cfg: Config, rollouts: Rollouts, tokenizer: Any, events: JsonlSink
) -> None:
    """Raise TemperError if the reward fails on every one of a few real samples."""
    n = cfg.reward.check_samples
    tasks = (rollouts.train.tasks or rollouts.heldout)[:n]
    if not tasks:
        return
    params = replace(sampling_params(cfg), n=1)
    groups, _ = await rollouts.source.groups(tasks, params, seed=cfg.run.seed + _SEED_OFFSET)
    flat = [t for g in groups for t in g]
    if not flat or any(t.reward_error is None for t in flat):
        return
    first = flat[0]
    trace = await _traceback(cfg, rollouts, tokenizer, tasks, first)
    events.write(
        {
            "step": 0,
            "kind": "reward_check_failed",
            "samples": len(flat),
            "task_id": first.task_id,
            "error": first.reward_error,
            "traceback": trace,
        }
    )
    where = "its traceback" if trace else "the event"
    error = " ".join(str(first.reward_error).split())
    raise TemperError(
        f"the reward failed on all {len(flat)} samples tried before the first eval: "
        f"{error} ({where} in {events.path}; reward.check_samples = 0 skips "
        "this check)"
    )


async def _traceback(
    cfg: Config, rollouts: Rollouts, tokenizer: Any, tasks: list[Task], traj: Trajectory
) -> str | None:
    """The traceback behind ``traj``'s reward error: the sample scored again here, by
    the run's reward (built anew when it lives in rollout workers); None when scoring
    it here raises nothing (an env's or an agent's error, or one the reward only hit
    in a worker)."""
    reward: Reward = rollouts.reward or build_reward(cfg.reward, tokenizer)
    try:
        task = next(t for t in tasks if t.id == traj.task_id)
        [result] = await score_each(reward, [RewardInput(task, traj.prompt_text, _answer(traj),
                                                         list(traj.response_ids))])  # fmt: skip
        return result.traceback
    finally:
        if rollouts.reward is None:
            reward.close()


def _answer(traj: Trajectory) -> str:
    """What the reward scored: the last assistant message of an episode, else the response."""
    replies = [m.get("content") or "" for m in traj.messages if m.get("role") == "assistant"]
    return replies[-1] if replies else traj.response_text
