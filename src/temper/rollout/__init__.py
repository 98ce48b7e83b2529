"""Rollouts: drive an engine (and an env) into trajectories."""

from temper.rollout.trajectory import Trajectory

__all__ = ["Trajectory"]
