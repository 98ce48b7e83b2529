"""One synchronous step's groups, with DAPO dynamic sampling (refill) when it is on.

A group whose rewards are all equal has zero advantage everywhere: it costs
generation and teaches nothing, so `assign_advantages` drops it. Without
refill the step then trains on fewer groups than ``prompts_per_step``. With
``orchestrator.refill`` the step samples more prompts and generates again
until it holds ``prompts_per_step`` informative groups, for at most
``max_refill_rounds`` extra rounds. Each extra round asks for the missing
number of groups divided by the informative fraction seen so far in this step
(at most ``prompts_per_step`` prompts per round); surplus informative groups
are not trained (every step trains the same number of groups).

Round 0 uses the step's usual seed, so a run with refill generates exactly
what a run without it would before its first extra round. The sampler sees
the results of every group generated (`LearnsFromResults.observe`, called by
the orchestrator), zero-variance ones included.

Async runs (``orchestrator.max_staleness > 0``) do not refill: their batches
come from groups finished in the background, and the config refuses the
combination (docs/sampling.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from temper.algos import compute_advantages
from temper.algos.turn_credit import (
    episode_turn_rewards,
    token_advantages,
    turn_advantages,
    turn_returns,
)
from temper.data.sampler import TaskSampler
from temper.engine.base import SamplingParams
from temper.rollout.sources import Groups, RolloutSource
from temper.rollout.trajectory import Trajectory

#: Seed offset between refill rounds (far from the per-step stride of 1).
ROUND_SEED_STRIDE = 500_000_009


def usable(group: list[Trajectory]) -> list[Trajectory]:
    """The group without samples that failed scoring (NaN reward) or the env (no tokens)."""
    return [t for t in group if not math.isnan(t.reward) and t.num_tokens > 0]


def is_informative(group: list[Trajectory]) -> bool:
    """True if the group gives a non-zero advantage: two or more usable samples whose
    rewards differ."""
    g = usable(group)
    return len(g) >= 2 and len({t.reward for t in g}) > 1


def assign_advantages(
    groups: list[list[Trajectory]],
    estimator: str,
    drop_zero_variance: bool,
    credit: str = "outcome",
    turn_discount: float = 1.0,
) -> tuple[list[Trajectory], int]:
    """Set `advantage` on each trajectory; returns (kept trajectories, dropped groups).

    Groups are computed per group size (all groups here share one size).
    Trajectories whose reward is NaN (scoring failed with on_error="drop") are
    removed from their group first. With ``estimator = "gae"`` no group is dropped
    for its size or for equal rewards (the critic is the baseline). ``credit = "turn"`` also sets
    `token_advantages` (see `assign_turn_advantages`); "outcome" clears them.
    Which groups are dropped depends on the episodes' rewards either way.
    """
    kept: list[Trajectory] = []
    dropped = 0
    good = []
    # PPO's critic is the baseline (the trainer computes GAE): a group of one, or of
    # equal rewards, still gets non-zero advantages.
    group_baseline = estimator != "gae"
    for g in groups:
        # NaN reward: scoring failed with on_error="drop"; no tokens: the env failed at reset.
        g = usable(g)
        if not g or (group_baseline and len(g) < 2):
            dropped += 1
            continue
        if group_baseline and drop_zero_variance and not is_informative(g):
            dropped += 1
            continue
        good.append(g)
    by_size: dict[int, list[list[Trajectory]]] = {}
    for g in good:
        by_size.setdefault(len(g), []).append(g)
    for gs in by_size.values():
        rewards = torch.tensor([[t.reward for t in g] for g in gs], dtype=torch.float32)
        adv = compute_advantages(estimator, rewards)
        for gi, g in enumerate(gs):
            for ti, t in enumerate(g):
                t.advantage = float(adv[gi, ti])
                t.token_advantages = None
                kept.append(t)
    if credit == "turn" and estimator != "gae":  # gae: turn-level GAE, in the trainer
        assign_turn_advantages(good, estimator, turn_discount)
    return kept, dropped


def assign_turn_advantages(groups: list[list[Trajectory]], estimator: str, gamma: float) -> None:
    """Turn-level credit (`temper.algos.turn_credit`): each turn's tokens get the advantage
    of its discounted return against the group's returns at the same turn index;
    `advantage` becomes turn 0's (for logs)."""
    returns = [
        [
            turn_returns(episode_turn_rewards(t.turn_rewards, len(t.turn_spans), t.reward), gamma)
            for t in g
        ]
        for g in groups
    ]
    for g, advs in zip(groups, turn_advantages(returns, estimator), strict=True):
        for t, a in zip(g, advs, strict=True):
            t.token_advantages = token_advantages(a, t.turn_spans, len(t.response_ids))
            t.advantage = a[0]


@dataclass
class StepGroups:
    generated: Groups  # every group generated this step, in order (group ids 0..n-1)
    train: Groups  # what the trainer gets: all of `generated`, or the informative ones
    stats: dict[str, float]
    metrics: dict[str, float] = field(default_factory=dict)


async def step_groups(
    source: RolloutSource,
    sampler: TaskSampler,
    params: SamplingParams,
    *,
    prompts: int,
    seed: int,
    refill: bool,
    max_rounds: int,
) -> StepGroups:
    """Sample ``prompts`` tasks and generate their groups; with ``refill``, keep sampling
    until ``prompts`` informative groups are in hand or ``max_rounds`` extra rounds ran."""
    generated: Groups = []
    informative: Groups = []
    stats = {"time_generate_s": 0.0, "time_reward_s": 0.0, "reward_errors": 0.0}
    n, rounds = prompts, 0
    # The rollout stage's wall time (generation and scoring, however a source splits or
    # overlaps them): what the stage model (temper plan) calls the rollout time.
    started = time.perf_counter()
    while True:
        groups, round_stats = await source.groups(
            sampler.sample(n), params, seed=seed + rounds * ROUND_SEED_STRIDE
        )
        for key in stats:
            stats[key] += float(round_stats.get(key, 0.0))
        for g in groups:
            for t in g:
                t.group_id = len(generated)  # unique across rounds (train_only replays by id)
            generated.append(g)
            if is_informative(g):
                informative.append(g)
        if not refill or len(informative) >= prompts or rounds >= max_rounds:
            break
        rounds += 1
        missing = prompts - len(informative)
        frac = len(informative) / len(generated)
        n = min(prompts, math.ceil(missing / frac)) if frac > 0 else prompts
    stats["time_rollout_busy_s"] = time.perf_counter() - started
    if not refill:
        return StepGroups(generated, generated, stats)
    metrics = {
        "refill/rounds": float(rounds),
        "refill/extra_prompts": float(len(generated) - prompts),
        "refill/filtered_frac": (len(generated) - len(informative)) / len(generated),
        "refill/surplus_groups": float(max(len(informative) - prompts, 0)),
        "refill/missing_groups": float(max(prompts - len(informative), 0)),
    }
    return StepGroups(generated, informative[:prompts], stats, metrics)
