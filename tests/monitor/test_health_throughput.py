"""The throughput check on a shared machine: slow steps that come and go are noise; a
drop that lasts `health.throughput_steps` steps fires once."""

from __future__ import annotations

from temper.config.health import HealthConfig
from temper.monitor.health import HealthMonitor

BASE = 1000.0


def _alert_steps(rates: list[float], **cfg: int) -> list[int]:
    mon = HealthMonitor(HealthConfig(window=4, **cfg))
    steps = []
    for step, rate in enumerate(rates, start=1):
        steps += [a.step for a in mon.check(step, {"gen_tokens_per_s": rate})]
    return steps


def test_slow_steps_that_come_and_go_do_not_alert():
    """A neighbour's job slows one step, or two in a row, now and then."""
    dips = [BASE] * 4
    for _ in range(10):
        dips += [0.1 * BASE, BASE, 0.1 * BASE, 0.1 * BASE, BASE]
    assert _alert_steps(dips) == []


def test_a_lasting_drop_alerts_once_on_its_third_step():
    rates = [BASE] * 4 + [0.1 * BASE] * 20
    assert _alert_steps(rates) == [7]


def test_slow_steps_do_not_lower_the_average_they_are_measured_against():
    """A drop to a fifth: still low after many steps of it (the average stays the
    healthy rate), so it fires even with a long throughput_steps."""
    rates = [BASE] * 4 + [0.2 * BASE] * 12
    assert _alert_steps(rates, throughput_steps=10) == [14]


def test_a_new_drop_after_recovery_alerts_again():
    rates = [BASE] * 4 + [0.1 * BASE] * 3 + [BASE] * 4 + [0.1 * BASE] * 3
    assert _alert_steps(rates) == [7, 14]


def test_throughput_steps_one_alerts_on_the_first_slow_step():
    assert _alert_steps([BASE] * 4 + [0.1 * BASE], throughput_steps=1) == [5]
