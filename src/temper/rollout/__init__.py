"""Rollouts: drive an engine (and an env) into trajectories."""

from temper.records import Trajectory

__all__ = ["Trajectory"]
