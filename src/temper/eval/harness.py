"""Evaluate a policy on held-out tasks: greedy accuracy, pass@k, mean@k, maj@k, and
the mean reward of the greedy and the sampled answers (``reward_mean``,
``reward_mean@k``), overall and per category.

The rollouts come from a `temper.rollout.sources.RolloutSource` (single-turn
prompts or multi-turn env episodes), already scored. Greedy: one
temperature-0 sample per task. Sampled: k samples per task at the
given temperature, seeded, from which pass@j (unbiased, for j = 1, 2, 4 … k)
and mean@k (the average correctness of the k samples) are computed, with a
95% Wilson interval, and maj@k: the most common final ``\\boxed{}`` answer of
the k samples, compared as a string with the task's answer (tasks without an
answer are left out of maj@k). Results are broken down by task category.
Nothing here trains or changes weights.

Correctness is the reward's declared verdict (`Trajectory.correct`); when no
reward component declares one it is reward >= 1, and ``correct_rule`` says so
(`CORRECT_RULES`). ``temperature`` is the sampled rows' temperature (the greedy
rows are temperature 0).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from temper.engine.base import SamplingParams
from temper.eval.metrics import ks_for, majority_vote, pass_at_k, wilson_interval
from temper.records import Task, Trajectory
from temper.rewards.answers import extract_boxed
from temper.rollout.sources import RolloutSource

#: ``correct_rule`` of an eval: where its correctness came from.
CORRECT_RULES = {
    "declared": "declared by the reward",
    "default": "reward >= 1: no reward component declares correctness (set correct_above "
    'on a reward component, or return {"score": x, "correct": bool} from a python reward)',
}
#: The result's settings, not metrics: tables leave them out of their columns.
SETTINGS = ("n_tasks", "k", "temperature", "time_s", "step")


def _final_answer(t: Trajectory) -> str | None:
    """The last ``\\boxed{}`` of the final assistant message (or of the response)."""
    replies = [m.get("content") or "" for m in t.messages if m.get("role") == "assistant"]
    found = extract_boxed(replies[-1] if replies else t.response_text)
    return found.strip() if found is not None else None


def _summarise(groups: list[list[Trajectory]], k: int, gold: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    n_correct = [sum(bool(t.correct) for t in g) for g in groups]
    for j in ks_for(k):
        out[f"pass@{j}"] = sum(pass_at_k(k, c, j) for c in n_correct) / len(groups)
    out[f"mean@{k}"] = sum(c / k for c in n_correct) / len(groups)
    out[f"mean@{k}_ci95"] = list(wilson_interval(sum(n_correct), k * len(groups)))
    out[f"reward_mean@{k}"] = _mean_reward([t for g in groups for t in g])
    with_gold = [g for g in groups if gold.get(g[0].task_id) is not None]
    if k > 1 and with_gold:
        votes = [majority_vote([_final_answer(t) for t in g]) for g in with_gold]
        hits = sum(v == gold[g[0].task_id] for v, g in zip(votes, with_gold, strict=True))
        out[f"maj@{k}"] = hits / len(with_gold)
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
    gold = {t.id: str(t.answer).strip() for t in tasks if t.answer is not None}
    result: dict[str, Any] = {"n_tasks": len(tasks), "k": k, "temperature": temperature}
    by_cat: dict[str, dict[str, Any]] = defaultdict(dict)
    seen: list[Trajectory] = []
    if greedy:
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
        groups, _ = await source.groups(tasks, params)
        flat = [t for g in groups for t in g]
        seen += flat
        n_right = sum(bool(t.correct) for t in flat)
        result["accuracy"] = n_right / len(flat)
        # The held-out reward itself, beside accuracy (a reward model's score in RLHF, or a
        # shaped reward, where "correct" says little); failed samples (NaN) are left out.
        result["reward_mean"] = _mean_reward(flat)
        result["accuracy_ci95"] = list(wilson_interval(n_right, len(flat)))
        result["mean_response_tokens"] = sum(t.num_policy_tokens for t in flat) / len(flat)
        for cat, trajs in _by_category(flat).items():
            by_cat[cat]["accuracy"] = sum(bool(t.correct) for t in trajs) / len(trajs)
            by_cat[cat]["reward_mean"] = _mean_reward(trajs)
            by_cat[cat]["n"] = len(trajs)
    if sampled:
        params = SamplingParams(n=k, temperature=temperature, max_new_tokens=max_new_tokens)
        groups, _ = await source.groups(tasks, params, seed=seed)
        seen += [t for g in groups for t in g]
        result.update(_summarise(groups, k, gold))
        cat_groups: dict[str, list[list[Trajectory]]] = defaultdict(list)
        for g in groups:
            cat_groups[g[0].category].append(g)
        for cat, gs in cat_groups.items():
            by_cat[cat].update(_summarise(gs, k, gold))
            by_cat[cat]["n"] = len(gs)
    # An eval whose episodes all failed reads as accuracy 0; the count says why.
    errors = [t.env_error for t in seen if t.env_error]
    if errors:
        result["episode_errors"] = len(errors)
        result["episodes"] = len(seen)
        result["first_episode_error"] = errors[0]
    rule = correct_rule(seen)
    if rule is not None:
        result["correct_rule"] = rule
    result["by_category"] = dict(sorted(by_cat.items()))
    return result


def correct_rule(trajs: list[Trajectory]) -> str | None:
    """`CORRECT_RULES`' entry for ``trajs``: declared when the reward declared any
    verdict, the default rule when it declared none; None when not recorded (env
    episodes scored by the env)."""
    marks = {t.correct_declared for t in trajs} - {None}
    if not marks:
        return None
    return CORRECT_RULES["declared" if True in marks else "default"]


def _mean_reward(trajs: list[Trajectory]) -> float:
    scored = [t.reward for t in trajs if not math.isnan(t.reward)]
    return sum(scored) / len(scored) if scored else math.nan


def _by_category(trajs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.category].append(t)
    return out
