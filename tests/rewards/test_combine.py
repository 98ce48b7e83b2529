"""WeightedSum: weighting, component logging, error policies."""

import asyncio
import math

import pytest

from temper.errors import ConfigError
from temper.records import Task
from temper.rewards import BoxedFormatReward, RewardInput, RewardResult, WeightedSum
from temper.rewards.base import RewardDefaults


class Scripted(RewardDefaults):
    """A reward that returns the given results, one per input."""

    def __init__(self, name: str, results: list[RewardResult]) -> None:
        self.name = name
        self.results = results

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return self.results[: len(inputs)]


INPUTS = [
    RewardInput(Task(id="a", prompt="q"), "q", "\\boxed{1}"),
    RewardInput(Task(id="b", prompt="q"), "q", "no box"),
]
ACC = Scripted(
    "accuracy",
    [
        RewardResult(score=1.0, components={"accuracy": 1.0}, correct=True),
        RewardResult(score=0.0, components={"accuracy": 0.0}, error="timeout after 10s"),
    ],
)


def test_weighted_total_and_components():
    out = asyncio.run(WeightedSum([(ACC, 1.0), (BoxedFormatReward(), 0.5)]).score(INPUTS))
    assert out[0].score == 1.5
    assert out[0].components == {"accuracy": 1.0, "boxed_format": 1.0}
    assert out[0].correct is True and out[0].error is None


def test_on_error_zero_records_and_counts_zero():
    out = asyncio.run(WeightedSum([(ACC, 2.0), (BoxedFormatReward(), 0.5)]).score(INPUTS))[1]
    assert out.score == 0.0
    assert out.error == "accuracy: timeout after 10s"
    assert out.components == {"accuracy": 0.0, "boxed_format": 0.0}
    assert out.correct is None


def test_on_error_drop_gives_nan_and_joins_errors():
    other = Scripted(
        "judge", [RewardResult(score=0.3), RewardResult(score=0.0, error="judge unreachable")]
    )
    out = asyncio.run(WeightedSum([(ACC, 1.0), (other, 1.0)], on_error="drop").score(INPUTS))
    assert out[0].score == pytest.approx(1.3) and out[0].error is None
    assert math.isnan(out[1].score)
    assert out[1].error == "accuracy: timeout after 10s; judge: judge unreachable"
    assert math.isnan(out[1].components["accuracy"])


def test_nested_components_are_prefixed():
    inner = WeightedSum([(ACC, 1.0), (BoxedFormatReward(), 1.0)], name="inner")
    out = asyncio.run(WeightedSum([(inner, 0.5)]).score(INPUTS))[0]
    assert out.score == 1.0
    assert out.components == {"inner": 2.0, "inner/accuracy": 1.0, "inner/boxed_format": 1.0}


def test_bad_configuration():
    with pytest.raises(ConfigError, match="unique"):
        WeightedSum([(ACC, 1.0), (ACC, 1.0)])
    with pytest.raises(ConfigError, match="on_error"):
        WeightedSum([(ACC, 1.0)], on_error="skip")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite"):
        WeightedSum([(ACC, math.inf)])
    with pytest.raises(ConfigError, match="at least one"):
        WeightedSum([])


def test_close_reaches_components():
    closed = []

    class Closable(Scripted):
        def close(self) -> None:
            closed.append(self.name)

    with WeightedSum([(Closable("a", []), 1.0), (BoxedFormatReward(), 1.0)]):
        pass
    assert closed == ["a"]


def _trl(fn, name):
    from temper.rewards import TRLRewardFunction

    return TRLRewardFunction(fn, name=name)


def test_none_is_skipped_by_the_weighted_sum():
    # TRL semantics: None = "this function does not apply here"; the sum skips it.
    only_b = _trl(lambda completions, **kw: [None, 2.0], "only_b")
    always = _trl(lambda completions, **kw: [1.0, 1.0], "always")
    out = asyncio.run(WeightedSum([(only_b, 1.0), (always, 0.5)]).score(INPUTS))
    assert [r.score for r in out] == [0.5, 2.5]
    assert out[0].components == {"always": 1.0} and out[0].error is None
    assert out[1].components == {"only_b": 2.0, "always": 1.0}


def test_a_sample_no_component_applies_to_is_an_error():
    nothing = _trl(lambda completions, **kw: [None, None], "nothing")
    out = asyncio.run(WeightedSum([(nothing, 1.0)]).score(INPUTS))
    assert all("no reward component applies" in r.error for r in out)


def test_nan_or_inf_component_scores_are_errors():
    bad = Scripted("bad", [RewardResult(score=math.nan), RewardResult(score=math.inf)])
    out = asyncio.run(WeightedSum([(bad, 1.0), (BoxedFormatReward(), 1.0)]).score(INPUTS))
    assert [r.score for r in out] == [1.0, 0.0]  # the format component still counts
    assert out[0].error == "bad: returned nan; expected a finite number"
    assert out[1].error == "bad: returned inf; expected a finite number"


class RaisesOnEmpty(RewardDefaults):
    """A batched reward that raises for the whole batch when one completion is empty."""

    name = "length"

    async def score(self, inputs):
        return [RewardResult(score=1.0 / len(i.completion_text)) for i in inputs]


def test_a_component_that_raises_is_scored_one_by_one():
    inputs = [*INPUTS, RewardInput(Task(id="c", prompt="q"), "q", "")]
    out = asyncio.run(WeightedSum([(RaisesOnEmpty(), 1.0)]).score(inputs))
    assert out[0].score == pytest.approx(1 / 9) and out[0].error is None
    assert out[1].score == pytest.approx(1 / 6) and out[1].error is None
    assert out[2].score == 0.0
    assert out[2].error == "length: raised ZeroDivisionError: float division by zero"
