"""The advantage stage: each kept trajectory's advantage from its group's rewards.

`assign_advantages` drops the groups that cannot teach (failed samples removed
first; a group of one or of equal rewards has zero advantage under a group
baseline), runs the configured estimator (`temper.algos.compute_advantages`)
per group size, and with ``algo.credit = "turn"`` spreads turn-level advantages
over each turn's tokens (`temper.algos.turn_credit`). PPO's critic is its own
baseline (``estimator = "gae"``): its groups are never dropped for size or
equal rewards, and the trainer computes the advantages itself. So does on-policy
distillation (``"distill"``): the teacher gives every sampled token its own
advantage, whatever the rewards; here each trajectory gets GRPO's group advantage
of its reward, which the trainer mixes in (``distill.reward_weight``).
"""

from __future__ import annotations

import math

import torch

from temper.algos import compute_advantages
from temper.algos.turn_credit import (
    episode_turn_rewards,
    token_advantages,
    turn_advantages,
    turn_returns,
)
from temper.records import Trajectory


def usable(group: list[Trajectory]) -> list[Trajectory]:
    """The group without samples that failed scoring or the infrastructure (NaN reward)
    or the env (no tokens)."""
    return [
        t
        for t in group
        if not math.isnan(t.reward) and t.num_tokens > 0 and t.finish_reason != "infra_error"
    ]


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
    # PPO's critic is the baseline (the trainer computes GAE), and a teacher scores every
    # token: a group of one, or of equal rewards, still gets non-zero advantages.
    group_baseline = estimator not in ("gae", "distill")
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
        adv = compute_advantages("grpo" if estimator == "distill" else estimator, rewards)
        for gi, g in enumerate(gs):
            for ti, t in enumerate(g):
                t.advantage = float(adv[gi, ti])
                t.token_advantages = None
                kept.append(t)
    if credit == "turn" and estimator != "gae":  # gae: turn-level GAE, in the trainer
        assign_turn_advantages(good, estimator, turn_discount)
    # An agent episode's earlier rows (`Trajectory.extra_rows`) train with its advantage.
    for t in list(kept):
        for row in t.extra_rows:
            row.advantage, row.token_advantages = t.advantage, None
            kept.append(row)
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
