"""The `[sampler]` config section: how training tasks are chosen (docs/sampling.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CurriculumPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    step: int = Field(ge=0, description="Training step this point applies from.")
    weights: dict[str, float] = Field(
        min_length=1,
        description="Category -> weight, e.g. {level1 = 1.0, level2 = 0.5} (arithmetic levels "
        'are "level1".."level4"); categories left out weigh 0.',
    )

    @model_validator(mode="after")
    def _weights_usable(self) -> CurriculumPoint:
        if any(not (w >= 0) for w in self.weights.values()) or not sum(self.weights.values()) > 0:
            raise ValueError(
                f"sampler.schedule point at step {self.step}: weights must be >= 0 with a "
                "positive sum"
            )
        return self


class SamplerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    type: Literal["uniform", "targeted", "curriculum", "weighted"] = Field(
        "uniform",
        description="uniform: shuffled epochs over a dataset, the generator's own mix for "
        "procedural tasks. targeted: prefer tasks whose pass rate is near `target` (Thompson "
        "draws from each one's Beta posterior). curriculum: category weights over steps "
        "(`schedule`). weighted: your `function` weighs tasks from their statistics.",
    )
    stats_by: Literal["auto", "task", "category"] = Field(
        "auto",
        description="What pass rates are kept for: each task id, or each category (level, "
        "kind, category_field). auto: tasks for a dataset, categories for procedural tasks "
        "(an endless stream; curriculum always uses categories).",
    )
    target: float = Field(
        0.5, gt=0, lt=1, description="targeted: the pass rate to aim for (0.5: most GRPO signal)."
    )
    explore: float = Field(
        0.1,
        ge=0,
        le=1,
        description="targeted: share of draws made uniformly over tasks (or categories), so "
        "that sure statistics are still refreshed while the policy learns.",
    )
    decay: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Per-step discount of old outcomes in the pass-rate statistics (1 = keep all "
        "equally); an unseen key drifts back to the uniform prior, so it is explored again.",
    )
    schedule: list[CurriculumPoint] = Field(
        default_factory=list,
        description="curriculum: points [[sampler.schedule]] step = N, weights = {...}; weights "
        "are interpolated linearly between points and held before the first and after the last.",
    )
    function: str | None = Field(
        None,
        description='weighted: "module:function" or "path/file.py:function" called as '
        "fn(arms, step) -> list of weights >= 0, one per arm; each arm is a dict with key, "
        "category, pass_rate, stddev, alpha, beta, seen, last_step.",
    )

    @model_validator(mode="after")
    def _options_match_type(self) -> SamplerConfig:
        if self.type == "curriculum" and not self.schedule:
            raise ValueError("sampler.type = 'curriculum' needs sampler.schedule")
        if self.type != "curriculum" and self.schedule:
            raise ValueError("sampler.schedule is only used by sampler.type = 'curriculum'")
        if self.type == "weighted" and not self.function:
            raise ValueError("sampler.type = 'weighted' needs sampler.function")
        if self.type != "weighted" and self.function:
            raise ValueError("sampler.function is only used by sampler.type = 'weighted'")
        steps = [p.step for p in self.schedule]
        if steps != sorted(set(steps)):
            raise ValueError(f"sampler.schedule steps must be strictly increasing, got {steps}")
        if self.type == "curriculum" and self.stats_by == "task":
            raise ValueError("sampler.type = 'curriculum' weighs categories: stats_by = 'task' "
                             "does not apply")  # fmt: skip
        return self
