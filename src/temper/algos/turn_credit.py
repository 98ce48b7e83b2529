"""Turn-level credit assignment for multi-turn episodes, as pure functions on lists.

With outcome credit (the default) every policy token of an episode gets the
episode's one advantage, so a good early turn in an episode that later goes
wrong is pushed down with the rest. Turn-level credit gives each turn the
return from that turn on, compared with what the group's other episodes got
from the same turn index on.

For one episode with K assistant turns and per-turn rewards r_0 .. r_{K-1}
(`episode_turn_rewards`), the return of turn k is

    G_k = sum_{j >= k} gamma^(j - k) * r_j                  (`turn_returns`)

With gamma = 1, G_0 is the episode's whole reward, so turn 0 sees what outcome
credit sees; later turns no longer answer for rewards earned before them.
With gamma = 0 each turn answers only for its own reward.

The baseline is per turn index: at index k it is taken over the episodes of
the group that reached turn k (had at least k + 1 turns). `turn_advantages`
normalises as the run's `algo.advantage` does for outcome rewards:

- ``grpo``: A_k = (G_k - mean_k) / (std_k + eps), std unbiased (n - 1);
- ``grpo_no_std`` / ``dr_grpo``: A_k = G_k - mean_k;
- ``rloo``: A_k = G_k - mean of the other episodes' G_k at index k;
- ``reinforce_pp_baseline``: G_k - mean_k, then divided by one unbiased std
  over every (episode, turn) value of the batch.

A turn index that only one episode of its group reached has nothing to be
compared with: its advantage is 0 (all estimators).
`token_advantages` lays the per-turn values out over the response tokens:
every token of turn k's span gets A_k, every other token (observations,
end-of-turn tokens the loop closed a turn with) gets 0 and is masked out of
the loss anyway. Turn-level GAE against a learned value is not here: Temper
has no critic yet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: `algo.advantage` values whose normalisation `turn_advantages` knows.
TURN_ESTIMATORS = ("grpo", "grpo_no_std", "dr_grpo", "rloo", "reinforce_pp_baseline")


def episode_turn_rewards(
    turn_rewards: Sequence[float], num_turns: int, total_reward: float
) -> list[float]:
    """The reward of each of an episode's ``num_turns`` assistant turns, summing to
    ``total_reward``.

    ``turn_rewards`` are the env's rewards per stepped turn (`StepResult.reward`,
    0.0 for None). The last turn may have no env reward (the episode ended on a
    limit before the env stepped it): it counts 0. Whatever of ``total_reward``
    the env's rewards do not account for (the `reward` section's score with
    `env.add_reward`, which judges the final answer) is added to the last turn.
    An env that already pays its outcome in its last turn reward (the games,
    the code env) is therefore counted once: the remainder is then 0.
    """
    k = max(num_turns, 1)
    rewards = [float(r) for r in turn_rewards[:k]] + [0.0] * (k - len(turn_rewards))
    rewards[-1] += float(total_reward) - sum(float(r) for r in turn_rewards)
    return rewards


def turn_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """G_k = sum_{j >= k} gamma^(j - k) * rewards[j], for every k (discounted reward-to-go)."""
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out


def _unbiased_std(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _group_turn_advantages(returns: list[list[float]], estimator: str, eps: float) -> None:
    """Replace each G_k of one group by its advantage at index k, in place."""
    longest = max((len(r) for r in returns), default=0)
    for k in range(longest):
        at_k = [r for r in returns if len(r) > k]
        values = [r[k] for r in at_k]
        n = len(values)
        if n < 2:
            for r in at_k:
                r[k] = 0.0
            continue
        mean = sum(values) / n
        std = _unbiased_std(values) if estimator == "grpo" else 0.0
        for r, g in zip(at_k, values, strict=True):
            if estimator == "rloo":
                r[k] = g - (n * mean - g) / (n - 1)
            elif estimator == "grpo":
                r[k] = (g - mean) / (std + eps)
            else:  # grpo_no_std, dr_grpo, and reinforce_pp_baseline before its batch scale
                r[k] = g - mean


def turn_advantages(
    groups: Sequence[Sequence[Sequence[float]]], estimator: str = "grpo", eps: float = 1e-6
) -> list[list[list[float]]]:
    """Per-turn advantages from per-turn returns ``groups[g][i][k]`` (group g, episode i,
    turn k; episodes may have different numbers of turns). Same layout out.

    See the module doc for each estimator. Raises ValueError for an estimator
    it has no turn-level form for.
    """
    if estimator not in TURN_ESTIMATORS:
        raise ValueError(
            f"turn-level credit has no form for advantage estimator {estimator!r}; "
            f"expected one of {TURN_ESTIMATORS}"
        )
    out = [[[float(g) for g in episode] for episode in group] for group in groups]
    for group in out:
        _group_turn_advantages(group, estimator, eps)
    if estimator == "reinforce_pp_baseline":
        flat = [a for group in out for episode in group for a in episode]
        scale = _unbiased_std(flat) + eps if len(flat) >= 2 else math.inf
        for group in out:
            for episode in group:
                episode[:] = [a / scale for a in episode]
    return out


def token_advantages(
    advantages: Sequence[float], turn_spans: Sequence[Sequence[int]], length: int
) -> list[float]:
    """A per-response-token list of ``length``: ``advantages[k]`` on turn k's span
    ``[start, end)``, 0.0 elsewhere. An episode without spans is one turn over all tokens."""
    out = [0.0] * length
    spans = list(turn_spans) or [(0, length)]
    if len(spans) != len(advantages):
        raise ValueError(f"{len(advantages)} turn advantages for {len(spans)} turn spans")
    for a, (start, end) in zip(advantages, spans, strict=True):
        out[start:end] = [float(a)] * (end - start)
    return out
