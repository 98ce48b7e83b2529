"""Combine several rewards into one weighted sum; declare a component's verdict by a
threshold on its score (`CorrectAbove`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from temper.errors import ConfigError, TemperError
from temper.rewards.base import Reward, RewardInput, RewardResult, bad_score, format_traceback

OnError = Literal["zero", "drop"]


class WeightedSum:
    """Total score = sum_k w_k * score_k over the component rewards.

    `components` of each result holds every component's own (unweighted) score under
    the component's `name`, plus the components it reports itself as
    `"<name>/<key>"` when they differ from its name. The component rewards are
    scored concurrently. `correct` is True only if every component that judges
    correctness (non-None `correct`) says True, None if none does.

    When a component fails on a sample (its result has `error` set), the errors are
    joined into the result's `error` as `"<name>: <error>; ..."` (their tracebacks
    into `traceback`), and `on_error` decides the score:
      - "zero": that component counts as 0 (its entry in `components` is 0.0) and
        the other components still add up;
      - "drop": the total score is NaN, marking the sample for the caller to drop
        (test with `math.isnan(result.score)`); the failed component's entry is NaN.
    A component score that is NaN or infinite counts as such a failure. A
    component that raises on the batch is scored one input at a time
    (`score_each`), so only the inputs it fails on get errors.

    A component result with `not_applicable` (a TRL function's None) is left
    out: no entry in `components`, nothing added. A sample to which no
    component applies is a failure ("no reward component applies ...").
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
        per_reward = await asyncio.gather(*(score_each(reward, inputs) for reward, _ in self.terms))
        return [self._combine([results[i] for results in per_reward]) for i in range(len(inputs))]

    def close(self) -> None:
        """Close every component (e.g. to stop worker processes)."""
        for reward, _ in self.terms:
            reward.close()

    def __enter__(self) -> WeightedSum:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _combine(self, parts: list[RewardResult]) -> RewardResult:
        total = 0.0
        components: dict[str, float] = {}
        errors: list[str] = []
        traces: list[str] = []
        verdicts: list[bool] = []
        applied = 0
        for (reward, weight), part in zip(self.terms, parts, strict=True):
            if part.not_applicable:
                continue  # a TRL None: this component says nothing about the sample
            applied += 1
            error = part.error
            if error is None and bad_score(part.score) is not None:
                error = f"returned {bad_score(part.score)}; expected a finite number"
            if error is not None:
                errors.append(f"{reward.name}: {error}")
                traces += [part.traceback] if part.traceback else []
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
        if not applied:
            errors.append("no reward component applies to this sample (each returned None)")
            total = 0.0 if self.on_error == "zero" else math.nan
        return RewardResult(
            score=total,
            components=components,
            error="; ".join(errors) or None,
            correct=all(verdicts) if verdicts else None,
            traceback="\n\n".join(traces) or None,
        )


async def score_each(reward: Reward, inputs: list[RewardInput]) -> list[RewardResult]:
    """``reward.score(inputs)``; if that raises or miscounts, each input on its own.

    So one completion that breaks a reward never costs the others in its batch
    their scores: an input on which the reward still fails gets a result with
    `error` set (``"raised ValueError: ..."``, with the exception's `traceback`). A `TemperError` (bad config or
    data, not a bad completion) is raised as is.
    """
    trace: str | None = None
    try:
        results = await reward.score(inputs)
        if len(results) == len(inputs):
            return list(results)
        failure = f"returned {len(results)} results for {len(inputs)} input(s)"
    except TemperError:
        raise
    except Exception as exc:
        failure = f"raised {type(exc).__name__}: {' '.join(str(exc).split())}"
        trace = format_traceback(exc)
    if len(inputs) == 1:
        return [
            RewardResult(score=0.0, components={reward.name: 0.0}, error=failure, traceback=trace)
        ]
    out: list[RewardResult] = []
    for item in inputs:
        out.extend(await score_each(reward, [item]))
    return out


class CorrectAbove:
    """``inner``'s scores, with its verdict declared by a threshold: a sample is correct
    when ``inner``'s (unweighted) score is above ``threshold`` (strictly).

    What ``reward.components[].correct_above`` builds. It replaces any verdict
    ``inner`` gives itself; a sample ``inner`` failed on, or that it does not apply
    to, gets no verdict.
    """

    def __init__(self, inner: Reward, threshold: float) -> None:
        if not math.isfinite(threshold):
            raise ConfigError(f"correct_above must be a finite number, got {threshold}")
        self.inner, self.threshold, self.name = inner, float(threshold), inner.name

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return [self._judge(r) for r in await self.inner.score(inputs)]

    def _judge(self, r: RewardResult) -> RewardResult:
        if r.error is not None or r.not_applicable or bad_score(r.score) is not None:
            return replace(r, correct=None)
        return replace(r, correct=float(r.score) > self.threshold)

    def close(self) -> None:
        self.inner.close()
