"""The `[health]` config section: each guardrail's threshold and action.

How each check measures, and what its actions do, is `temper.monitor.health`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Action = Literal["warn", "stop", "skip"]


class HealthCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Run this check.")
    threshold: float = Field(description="The check's limit (see temper.monitor.health).")
    action: Action = Field(
        "warn",
        description="warn: log it; stop: checkpoint and stop; skip: undo this step's update.",
    )


def _check(threshold: float, action: Action, description: str) -> Any:
    return Field(
        default_factory=lambda: HealthCheck(threshold=threshold, action=action),
        description=description,
    )


class HealthConfig(BaseModel):
    """Thresholds and actions of the health guardrails."""

    model_config = ConfigDict(extra="forbid")
    nan: HealthCheck = _check(0.0, "stop", "The loss or grad norm is NaN or infinite.")
    entropy_collapse: HealthCheck = _check(0.01, "warn", "Mean token entropy below the threshold.")
    kl_blowup: HealthCheck = _check(1.0, "warn", "KL to the reference above the threshold.")
    length_explosion: HealthCheck = _check(
        3.0, "warn", "Mean response length above threshold x its mean over the warm-up steps."
    )
    mismatch: HealthCheck = _check(
        0.05, "warn", "Mean |trainer - engine logprob| on sampled tokens above the threshold."
    )
    throughput: HealthCheck = _check(
        0.3,
        "warn",
        "Generation tokens/s below threshold x its moving average for throughput_steps "
        "steps in a row (once per sustained drop).",
    )
    reward_hacking: HealthCheck = _check(
        0.1,
        "warn",
        "After an eval: train reward rose by more than the threshold since the last eval "
        "while held-out accuracy did not.",
    )
    reward_errors: HealthCheck = _check(
        0.5, "stop", "The share of a step's samples whose reward failed above the threshold."
    )
    episode_errors: HealthCheck = _check(
        0.5,
        "stop",
        "The share of a step's episodes that ended in an error of their own above the "
        "threshold: the env or the agent raised, hung or returned a bad reward (each kind "
        "is printed once).",
    )
    infra_errors: HealthCheck = _check(
        0.5,
        "stop",
        "The share of a step's episodes the infrastructure failed (after retries) above "
        "the threshold: env servers lost or overloaded (a checkpoint, then exit 3).",
    )
    all_groups_dropped: HealthCheck = _check(
        5, "stop", "Every group dropped (equal rewards) for this many steps in a row."
    )
    no_update: HealthCheck = _check(10, "stop", "No policy update for this many steps in a row.")
    warmup: int = Field(5, ge=1, description="Steps that set the response-length baseline.")
    window: int = Field(10, ge=1, description="Steps in the throughput moving average.")
    throughput_steps: int = Field(
        3,
        ge=1,
        description="Steps in a row the throughput must stay low before its check fires "
        "(a slow step on a shared machine is noise).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_partial_checks(cls, data: Any) -> Any:
        """`--health.no_update.action=warn` keeps that check's default threshold (and so on)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            info = cls.model_fields.get(name)
            if isinstance(value, dict) and info is not None and info.default_factory is not None:
                default = info.default_factory()  # type: ignore[call-arg]
                if isinstance(default, HealthCheck):
                    out[name] = {**default.model_dump(), **value}
        return out
