"""Combine several rewards into one weighted sum."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Literal

from temper.errors import ConfigError
from temper.rewards.base import Reward, RewardInput, RewardResult

OnError = Literal["zero", "drop"]


class WeightedSum:
    """Total score = sum_k w_k * score_k over the component rewards.

    `components` of each result holds every component's own (unweighted) score under
    the component's `name`, plus the components it reports itself as
    `"<name>/<key>"` when they differ from its name. The component rewards are
    scored concurrently. `correct` is True only if every component that judges
    correctness (non-None `correct`) says True, None if none does.

    When a component fails on a sample (its result has `error` set), the errors are
    joined into the result's `error` as `"<name>: <error>; ..."`, and `on_error`
    decides the score:
      - "zero": that component counts as 0 (its entry in `components` is 0.0) and
        the other components still add up;
      - "drop": the total score is NaN, marking the sample for the caller to drop
        (test with `math.isnan(result.score)`); the failed component's entry is NaN.
    """

    def __init__(
        self,
        terms: Sequence[tuple[Reward, float]],
        *,
        on_error: OnError = "zero",
        name: str = "weighted_sum",
    ) -> None:
        if not terms:
            raise ConfigError("WeightedSum needs at least one (reward, weight) term")
        if on_error not in ("zero", "drop"):
            raise ConfigError(f"on_error must be 'zero' or 'drop', got {on_error!r}")
        names = [reward.name for reward, _ in terms]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"WeightedSum: component names must be unique, repeated: {duplicates}"
            )
        for reward, weight in terms:
            if not isinstance(weight, int | float) or not math.isfinite(weight):
                raise ConfigError(
                    f"WeightedSum: weight for {reward.name!r} must be a finite number"
                )
        self.terms = [(reward, float(weight)) for reward, weight in terms]
        self.on_error = on_error
        self.name = name

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        """Score every component on the batch and combine them per sample."""
        per_reward = await asyncio.gather(*(reward.score(inputs) for reward, _ in self.terms))
        for (reward, _), results in zip(self.terms, per_reward, strict=True):
            if len(results) != len(inputs):
                raise RuntimeError(
                    f"reward {reward.name!r} returned {len(results)} results for {len(inputs)} inputs"
                )
        return [self._combine([results[i] for results in per_reward]) for i in range(len(inputs))]

    def close(self) -> None:
        """Close every component that has a `close()` (e.g. to stop worker processes)."""
        for reward, _ in self.terms:
            close = getattr(reward, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> WeightedSum:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _combine(self, parts: list[RewardResult]) -> RewardResult:
        total = 0.0
        components: dict[str, float] = {}
        errors: list[str] = []
        verdicts: list[bool] = []
        for (reward, weight), part in zip(self.terms, parts, strict=True):
            if part.error is not None:
                errors.append(f"{reward.name}: {part.error}")
                value = 0.0 if self.on_error == "zero" else math.nan
            else:
                value = part.score
                if part.correct is not None:
                    verdicts.append(part.correct)
            components[reward.name] = value
            total += weight * value
            for key, sub in part.components.items():
                if key != reward.name:
                    components[f"{reward.name}/{key}"] = sub
        return RewardResult(
            score=total,
            components=components,
            error="; ".join(errors) or None,
            correct=all(verdicts) if verdicts else None,
        )
