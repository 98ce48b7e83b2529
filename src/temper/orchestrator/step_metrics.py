"""What one step logs about its rollouts (rewards, lengths, truncation, components)."""

from __future__ import annotations

import math

import torch

from temper.rollout.trajectory import Trajectory


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    rewards = torch.tensor([t.reward for t in trajs if not math.isnan(t.reward)] or [0.0])
    lengths = [t.num_policy_tokens for t in trajs]
    out = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(unbiased=False)),
        "accuracy": sum(bool(t.correct) for t in trajs) / max(len(trajs), 1),
        "response_len_mean": sum(lengths) / max(len(lengths), 1),
        "response_len_max": float(max(lengths, default=0)),
        "truncated_frac": sum(t.truncated for t in trajs) / max(len(trajs), 1),
        "tokens_generated": float(sum(lengths)),
    }
    names = {n for t in trajs for n in t.reward_components}
    for name in sorted(names):
        vals = [t.reward_components[name] for t in trajs if name in t.reward_components]
        out[f"reward/{name}"] = sum(vals) / len(vals)
    return out
