"""The stage model behind `temper plan` and placement = "auto", on hand-made measurements."""

from __future__ import annotations

import pytest

from temper.orchestrator.stage_model import (
    ASSUMED_EXPONENT,
    Placement,
    Scaling,
    StepSample,
    candidates,
    fit_scaling,
    make_plan,
    predict,
    samples_from_metrics,
)


def sample(r_units, t_units, rollout, train, sync=0.1, other=0.05, s=0, tokens=100.0):
    p = Placement(r_units, t_units, s)
    step = rollout + train + sync + other
    return StepSample(p, rollout, train, sync, other, step, tokens, tokens)


def test_fit_recovers_the_speedup_exponent():
    points = [(u, 3.0 * u**-0.8) for u in (1, 2, 4, 8)]
    assert fit_scaling(points).exponent == pytest.approx(0.8, rel=1e-9)
    assert fit_scaling(points).fitted
    slower = [(u, 3.0 * u**0.3) for u in (1, 2)]  # more threads made it slower
    assert fit_scaling(slower).exponent == pytest.approx(-0.3, rel=1e-9)
    one_count = fit_scaling([(2, 1.0), (2, 1.5)])
    assert (one_count.exponent, one_count.fitted) == (ASSUMED_EXPONENT, False)
    assert fit_scaling([(1, 10.0), (2, 1.0)]).exponent == 1.0  # clipped


def test_predictions_follow_the_documented_formulas():
    # Two steps measured colocated on 2 cores; exponents are given, not fitted.
    samples = [sample(2, 2, rollout=1.0, train=3.0), sample(2, 2, rollout=3.0, train=1.0)]
    linear = Scaling(1.0, True)
    fixed = 0.1 + 0.05
    coloc = predict(samples, Placement(2, 2, 0), 2, linear, linear)
    assert coloc.step_s == pytest.approx(4.0 + fixed)
    assert coloc.measured_step_s == pytest.approx(4.15)
    # Split 1/1: each stage twice as long (exponent 1); the next step's rollouts overlap
    # the trainer side (train, weight sync, bookkeeping).
    s1 = predict(samples, Placement(1, 1, 1), 2, linear, linear)
    assert s1.step_s == pytest.approx((6.0 + fixed + 6.0) / 2)  # each waits for its slower side
    s2 = predict(samples, Placement(1, 1, 2), 2, linear, linear)
    assert s2.step_s == pytest.approx(max(4.0, 4.0 + fixed))
    sync_split = predict(samples, Placement(1, 1, 0), 2, linear, linear)
    assert sync_split.step_s == pytest.approx(8.0 + fixed)
    assert s1.measured_step_s is None


def test_the_plan_overlaps_stages_that_do_not_speed_up_with_threads():
    # Rollout and train each take 1 s whatever the thread count: splitting the cores and
    # overlapping them halves the step; with linear speed-up colocation is as fast and
    # synchronous, so it wins the tie.
    flat = [sample(u, u, 1.0, 1.0) for u in (2, 1, 2, 1)]
    plan = make_plan(flat, units=2, workers=1, max_staleness=2)
    assert plan.best.placement == Placement(1, 1, 1)
    assert plan.best.step_s == pytest.approx(1.0 + 0.15)  # the trainer side is the longer
    linear = [sample(u, u, 2.0 / u, 2.0 / u) for u in (2, 1, 2, 1)]
    plan = make_plan(linear, units=2, workers=1, max_staleness=2)
    assert plan.rollout_scaling.exponent == pytest.approx(1.0)
    assert plan.best.placement == Placement(2, 2, 0)
    # A cap of 0 keeps every option synchronous.
    plan = make_plan(flat, units=2, workers=1, max_staleness=0)
    assert {o.placement.max_staleness for o in plan.options} == {0}


def test_candidates_respect_the_workers_and_the_cap():
    assert candidates(2, 2, 2) == [Placement(2, 2, 0)]  # 2 workers on 2 cores: no split
    got = candidates(8, 2, 1)
    assert Placement(8, 8, 0) in got and Placement(6, 2, 1) in got
    assert all(p.rollout_units % 2 == 0 for p in got)
    assert max(p.max_staleness for p in got) == 1


def test_metrics_rows_become_samples():
    base = {
        "time_generate_s": 1.0, "time_reward_s": 0.5, "time_train_s": 2.0,
        "time_weight_sync_s": 0.1, "time_step_s": 4.0, "tokens_generated": 50.0,
        "train_tokens": 40.0, "placement/rollout_units": 2.0,
        "placement/trainer_units": 2.0, "placement/max_staleness": 0.0,
    }  # fmt: skip
    rows = [
        {"step": 1, **base},  # one-time costs: skipped
        {"step": 2, **base},
        {"step": 3, **base, "time_rollout_busy_s": 1.2},
        {"step": 4, "eval/accuracy": 0.5},  # an eval extras row
        {"step": 5, **{k: v for k, v in base.items() if k != "train_tokens"}},  # no update
        {"step": 6, **{k: v for k, v in base.items() if not k.startswith("placement")}},
    ]
    got = samples_from_metrics(rows)
    assert [s.rollout_s for s in got] == [1.5, 1.2]
    assert got[0].other_s == pytest.approx(4.0 - 1.5 - 2.0 - 0.1)
    assert got[0].placement == Placement(2, 2, 0)
    with pytest.raises(ValueError, match="at least 2 measured steps"):
        make_plan(got[:1], units=2)
    plan = make_plan(got, units=2)
    coloc = next(o for o in plan.options if o.placement == Placement(2, 2, 0))
    # mean(R + T) + mean(sync + other): (3.5 + 3.2) / 2 + 0.1 + 0.4
    assert coloc.step_s == pytest.approx(3.85)
    assert not plan.rollout_scaling.fitted and "assumed" in plan.notes[0]
