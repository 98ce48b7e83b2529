"""Evaluate a policy on held-out tasks: greedy accuracy, pass@k, mean@k.

The rollouts come from a `temper.rollout.sources.RolloutSource` (single-turn
prompts or multi-turn env episodes), already scored. Greedy: one
temperature-0 sample per task. Sampled: k samples per task at the
given temperature, seeded, from which pass@j (unbiased, for j = 1, 2, 4 … k)
and mean@k (the average correctness of the k samples) are computed. Results
are broken down by task category. Nothing here trains or changes weights.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from temper.data.base import Task
from temper.engine.base import SamplingParams
from temper.eval.metrics import ks_for, pass_at_k
from temper.rollout.sources import RolloutSource
from temper.rollout.trajectory import Trajectory


def _summarise(groups: list[list[Trajectory]], k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    n_correct = [sum(bool(t.correct) for t in g) for g in groups]
    for j in ks_for(k):
        out[f"pass@{j}"] = sum(pass_at_k(k, c, j) for c in n_correct) / len(groups)
    out[f"mean@{k}"] = sum(c / k for c in n_correct) / len(groups)
    return out


async def evaluate(
    source: RolloutSource,
    tasks: list[Task],
    k: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 1234,
    greedy: bool = True,
    sampled: bool = True,
) -> dict[str, Any]:
    """Run the eval; returns a JSON-able dict of metrics."""
    result: dict[str, Any] = {"n_tasks": len(tasks), "k": k, "temperature": temperature}
    by_cat: dict[str, dict[str, Any]] = defaultdict(dict)
    if greedy:
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
        groups, _ = await source.groups(tasks, params)
        flat = [t for g in groups for t in g]
        result["accuracy"] = sum(bool(t.correct) for t in flat) / len(flat)
        result["mean_response_tokens"] = sum(t.num_policy_tokens for t in flat) / len(flat)
        for cat, trajs in _by_category(flat).items():
            by_cat[cat]["accuracy"] = sum(bool(t.correct) for t in trajs) / len(trajs)
            by_cat[cat]["n"] = len(trajs)
    if sampled:
        params = SamplingParams(n=k, temperature=temperature, max_new_tokens=max_new_tokens)
        groups, _ = await source.groups(tasks, params, seed=seed)
        result.update(_summarise(groups, k))
        cat_groups: dict[str, list[list[Trajectory]]] = defaultdict(list)
        for g in groups:
            cat_groups[g[0].category].append(g)
        for cat, gs in cat_groups.items():
            by_cat[cat].update(_summarise(gs, k))
            by_cat[cat]["n"] = len(gs)
    result["by_category"] = dict(sorted(by_cat.items()))
    return result


def _by_category(trajs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.category].append(t)
    return out
