"""The collect stage: one synchronous step's groups, with DAPO dynamic sampling (refill).

A group whose rewards are all equal has zero advantage everywhere: it costs
generation and teaches nothing, so the advantage stage
(`temper.orchestrator.advantages`) drops it. Without refill the step then
trains on fewer groups than ``prompts_per_step``. With
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

from temper.data.sampler import TaskSampler
from temper.engine.base import SamplingParams
from temper.orchestrator.advantages import is_informative
from temper.rollout.sources import Groups, RolloutSource

#: Seed offset between refill rounds (far from the per-step stride of 1).
ROUND_SEED_STRIDE = 500_000_009


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
