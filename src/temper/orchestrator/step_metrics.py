"""What one step logs about its rollouts (rewards, lengths, truncation, components), its
stage times (docs/placement.md) and the staleness of what it trained on."""

from __future__ import annotations

import math

import torch

from temper.records import Trajectory


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


def rollout_seconds(stats: dict[str, float]) -> float:
    """The rollout side's busy time (async: not the time the trainer waited)."""
    return stats.get("time_rollout_busy_s", stats["time_generate_s"])


def stage_times(
    stats: dict[str, float], started: float, rolled_out: float, trained: float, synced: float
) -> dict[str, float]:
    """A step's stage times from its clock readings (perf_counter) and rollout stats."""
    step_s, train_s = synced - started, trained - rolled_out
    # train_only steps generate nothing: their rollout stage is reading the records.
    busy = stats.get("time_rollout_busy_s", 0.0)
    return {
        "time_generate_s": stats["time_generate_s"],
        "time_reward_s": stats["time_reward_s"],
        "time_rollout_busy_s": busy,
        "time_train_s": train_s,
        "time_weight_sync_s": synced - trained,
        "time_step_s": step_s,
        "time_idle_trainer_s": max(0.0, step_s - train_s),
        "time_idle_rollout_s": max(0.0, step_s - busy),
    }


def staleness_metrics(trajs: list[Trajectory], version: int) -> dict[str, float]:
    """The trained-on policy ``version`` minus the version that sampled each policy token."""
    sampled = [v for t in trajs for v, mask in zip(t.versions, t.loss_mask, strict=True) if mask]
    return {
        "staleness_max": float(max((version - v for v in sampled), default=0)),
        "staleness_mean": sum(version - v for v in sampled) / max(len(sampled), 1),
    }
