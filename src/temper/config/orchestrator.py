"""The `[orchestrator]` config section: the loop, its rollouts and where they run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OrchestratorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    steps: int = Field(120, ge=1, description="Training steps.")
    prompts_per_step: int = Field(16, ge=1, description="Prompts sampled per training step.")
    group_size: int = Field(8, ge=1, description="Samples per prompt (the GRPO group).")
    max_response_tokens: int = Field(48, ge=1, description="Generation limit per sample.")
    temperature: float = Field(1.0, ge=0, description="Rollout sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Rollout nucleus sampling (1 = off).")
    top_k: int = Field(0, ge=0, description="Rollout top-k sampling (0 = off).")
    drop_zero_variance_groups: bool = Field(
        True, description="Skip groups where every sample got the same reward (no signal)."
    )
    refill: bool = Field(
        False,
        description="DAPO dynamic sampling: sample more prompts and generate again until the "
        "step holds prompts_per_step groups with differing rewards (needs "
        "drop_zero_variance_groups; synchronous runs only). Logs refill/* metrics.",
    )
    max_refill_rounds: int = Field(
        4,
        ge=1,
        description="refill: extra generation rounds per step at most (each asks for at most "
        "prompts_per_step prompts); a step still short trains on what it has.",
    )
    max_seconds: float | None = Field(
        None, gt=0, description="Stop training after this wall-clock budget."
    )
    mode: Literal["train", "rollout_only", "train_only"] = Field(
        "train",
        description="train: generate, score, update. rollout_only: generate and score, no "
        "update. train_only: update on the trajectories recorded in `train_from`, no "
        "generation. The last two isolate a regression to one side.",
    )
    train_from: str | None = Field(
        None,
        description="For mode=train_only: a run's trajectories/ folder; step N trains on "
        "step_N.jsonl (record every sample with log.trajectories_per_step).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=64,
        description="Asynchronous training: rollouts may run this many policy versions "
        "ahead of the trainer (0 = synchronous).",
    )
    interrupt: Literal["continue", "abort"] = Field(
        "continue",
        description="Async: on a weight update, groups in flight continue with the new "
        "weights (versions recorded per token) or are aborted and restarted.",
    )
    backend: Literal["local", "process", "ray"] = Field(
        "local",
        description="Where rollouts run. local: engine and rollout source in the "
        "orchestrator process. process: `rollout_workers` worker processes, each with its "
        "own engine, fed weights over shared memory (docs/workers.md). ray: "
        "`rollout_workers` Ray actors, weights through the object store (docs/scaling.md).",
    )
    ray_address: str | None = Field(
        None,
        description='backend=ray: cluster to join ("auto", "ray://host:10001"); '
        "unset: start a local Ray cluster for the run.",
    )
    ray_placement: Literal["pack", "spread"] = Field(
        "pack", description="backend=ray: placement-group strategy for the actors' bundles."
    )
    ray_num_cpus: float = Field(
        1.0, gt=0, description="backend=ray: Ray CPUs per rollout actor (its bundle)."
    )
    ray_num_gpus: float = Field(
        0.0,
        ge=0,
        description="backend=ray: Ray GPUs per rollout actor (fractions share one GPU).",
    )
    rollout_workers: int = Field(
        1, ge=1, description="backend=process|ray: number of rollout worker processes or actors."
    )
    worker_threads: int = Field(
        0,
        ge=0,
        description="backend=process|ray: torch threads per rollout worker; 0 = run.threads, "
        "or the cores shared out among the workers (placement=auto sets them itself).",
    )
    heartbeat_timeout_s: float = Field(
        30.0,
        gt=0,
        description="backend=process|ray: a ready worker silent this long is hung: it is "
        "killed and restarted (workers beat every heartbeat_timeout_s / 5).",
    )
    max_retries: int = Field(
        3,
        ge=0,
        description="backend=process|ray: times a group request is resent after its worker "
        "died or hung; one more failure stops the run with an error naming the task.",
    )

    placement: Literal["fixed", "auto"] = Field(
        "fixed",
        description="fixed: run as configured. auto (backend=process|ray, CPU): probe the "
        "machine split between rollout workers and trainer for placement_warmup_steps "
        "steps, then apply the stage model's best placement and staleness "
        "(docs/placement.md; `temper plan RUN` prints the same table).",
    )
    placement_warmup_steps: int = Field(
        6,
        ge=3,
        le=64,
        description="placement=auto: steps run as probes before the plan is applied (the "
        "first is not measured: it pays one-time costs).",
    )
    auto_max_staleness: int = Field(
        2,
        ge=0,
        le=8,
        description="placement=auto: the most staleness the plan may choose (0 keeps the "
        "run synchronous; refill forces 0).",
    )

    @model_validator(mode="after")
    def _train_only_needs_source(self) -> OrchestratorConfig:
        if self.mode == "train_only" and not self.train_from:
            raise ValueError(
                "orchestrator.train_from is required when orchestrator.mode = 'train_only'"
            )
        if self.refill and not self.drop_zero_variance_groups:
            raise ValueError(
                "orchestrator.refill needs orchestrator.drop_zero_variance_groups = true"
            )
        if self.refill and self.max_staleness:
            raise ValueError(
                "orchestrator.refill works in synchronous runs only (max_staleness = 0): async "
                "batches are groups finished in the background (docs/sampling.md)"
            )
        if self.refill and self.mode == "train_only":
            raise ValueError("orchestrator.refill needs generation: not with mode = 'train_only'")
        if self.max_staleness and self.mode != "train":
            raise ValueError("orchestrator.max_staleness > 0 needs orchestrator.mode = 'train'")
        if self.placement == "auto":
            self._check_auto()
        return self

    def _check_auto(self) -> None:
        if self.backend == "local":
            raise ValueError(
                "orchestrator.placement = 'auto' needs backend = 'process' or 'ray' (a local "
                "engine shares the trainer's threads; there is nothing to place)"
            )
        if self.max_staleness:
            raise ValueError(
                "orchestrator.placement = 'auto' chooses the staleness itself: leave "
                "max_staleness at 0 and cap it with auto_max_staleness"
            )
        if self.mode != "train":
            raise ValueError("orchestrator.placement = 'auto' needs orchestrator.mode = 'train'")
        if self.placement_warmup_steps >= self.steps:
            raise ValueError(
                f"orchestrator.placement_warmup_steps ({self.placement_warmup_steps}) must be "
                f"below orchestrator.steps ({self.steps}): the plan applies after the warm-up"
            )
