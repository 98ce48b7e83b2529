"""The stage model: each placement's expected step time, from a run's measured steps.

`temper plan RUN` and ``orchestrator.placement = "auto"`` both use it. The
full derivation, its assumptions and how well it held on measured runs are in
docs/placement.md; in short:

A step has three stages that placement changes:

- **rollout** R: generating and scoring the step's groups (``time_generate_s +
  time_reward_s`` in a synchronous step; the rollout side's busy time
  ``time_rollout_busy_s`` in an asynchronous one);
- **train** T: the policy update (``time_train_s``);
- **weight sync** W: publishing the new weights and the engines loading them.

Everything else in a step (task sampling, advantages, logging) is an overhead
O that no placement changes, and eval is an occasional stage of its own,
reported beside the options.

The machine has ``units`` compute units (CPU cores: torch threads). A
placement gives the rollout side r of them and the trainer t, and a staleness s:

- colocated (r = t = units): the sides take turns, so the step is synchronous:
  ``R(units) + T(units) + W + O``;
- disaggregated (r + t <= units), synchronous: ``R(r) + T(t) + W + O``;
- disaggregated, asynchronous: the next step's rollouts run while the trainer
  trains, syncs weights and does its bookkeeping, so the trainer side of a step
  is ``T(t) + W + O``. With s = 1 each step still waits for its own slower
  side: ``mean_i max(R_i(r), T_i(t) + W_i + O_i)``; with s >= 2 a quick step
  banks time for a slow one: ``max(mean R(r), mean (T(t) + W + O))``.

A placement whose unit split some steps ran with is predicted from those steps
alone. Otherwise a stage measured on u0 units takes ``time * (u0 / u) ** e`` on
u units. The exponent e is fitted per stage (least squares in log space, per token so long
and short steps compare) when the steps were measured at two or more unit
counts, clipped to [-0.5, 1]; otherwise it is `ASSUMED_EXPONENT`, and the plan
says it assumed it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Speed-up exponent used when every measured step ran on one unit count.
ASSUMED_EXPONENT = 0.7
#: Fitted exponents are clipped to this range. Below 0, more threads are slower: small
#: ops on a CPU can lose more to OpenMP start-up and spinning than they gain.
MIN_EXPONENT, MAX_EXPONENT = -0.5, 1.0
#: An option at most this much slower than the fastest wins if it is simpler
#: (lower staleness first): the model is not more accurate than that.
TIE_MARGIN = 0.03
#: Metric names the orchestrator records per step for the model.
UNIT_KEYS = ("placement/rollout_units", "placement/trainer_units", "placement/max_staleness")


@dataclass(frozen=True, order=True)
class Placement:
    """How the machine's units are split, and how far rollouts may run ahead."""

    rollout_units: int
    trainer_units: int
    max_staleness: int

    def colocated(self, units: int) -> bool:
        return self.rollout_units + self.trainer_units > units

    def describe(self, units: int) -> str:
        if self.colocated(units):
            return f"colocated, {units} units taking turns, sync"
        mode = f"async s={self.max_staleness}" if self.max_staleness else "sync"
        return f"split {self.rollout_units} rollout / {self.trainer_units} train, {mode}"


@dataclass(frozen=True)
class StepSample:
    """One measured step: its stage times and the placement it ran under."""

    placement: Placement
    rollout_s: float
    train_s: float
    sync_s: float
    other_s: float
    step_s: float
    gen_tokens: float
    train_tokens: float


@dataclass(frozen=True)
class Scaling:
    exponent: float
    fitted: bool

    def factor(self, measured_units: int, units: int) -> float:
        """What a stage's time is multiplied by, moving from ``measured_units`` to ``units``."""
        return (measured_units / units) ** self.exponent


@dataclass(frozen=True)
class Option:
    placement: Placement
    step_s: float
    rollout_s: float
    train_s: float
    measured_step_s: float | None  # the mean over the steps that ran this placement


@dataclass
class Plan:
    units: int
    workers: int
    options: list[Option]
    best: Option
    rollout_scaling: Scaling
    train_scaling: Scaling
    steps_used: int
    eval_s_per_step: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def opt(o: Option) -> dict[str, Any]:
            p = o.placement
            return {
                "rollout_units": p.rollout_units,
                "trainer_units": p.trainer_units,
                "max_staleness": p.max_staleness,
                "colocated": p.colocated(self.units),
                "expected_step_s": round(o.step_s, 4),
                "measured_step_s": None
                if o.measured_step_s is None
                else round(o.measured_step_s, 4),
            }

        return {
            "units": self.units,
            "workers": self.workers,
            "best": opt(self.best),
            "options": [opt(o) for o in self.options],
            "rollout_exponent": round(self.rollout_scaling.exponent, 3),
            "rollout_exponent_fitted": self.rollout_scaling.fitted,
            "train_exponent": round(self.train_scaling.exponent, 3),
            "train_exponent_fitted": self.train_scaling.fitted,
            "steps_used": self.steps_used,
            "eval_s_per_step": round(self.eval_s_per_step, 4),
        }


def samples_from_metrics(rows: Iterable[Mapping[str, Any]], skip: int = 1) -> list[StepSample]:
    """The steps of a run's metrics rows usable by the model (steps <= ``skip`` pay
    one-time costs and are left out; so are rows without placement or train data)."""
    samples = []
    for row in rows:
        if int(row.get("step", 0)) <= skip or any(k not in row for k in UNIT_KEYS):
            continue
        if "train_tokens" not in row or "time_train_s" not in row:
            continue  # no update this step (all groups dropped): no train time to learn from
        rollout = row.get("time_rollout_busy_s")
        if rollout is None:
            rollout = row["time_generate_s"] + row.get("time_reward_s", 0.0)
        placement = Placement(*(int(row[k]) for k in UNIT_KEYS))
        waited = row["time_generate_s"] + row.get("time_reward_s", 0.0)
        stages = waited + row["time_train_s"] + row["time_weight_sync_s"]
        samples.append(
            StepSample(
                placement=placement,
                rollout_s=float(rollout),
                train_s=float(row["time_train_s"]),
                sync_s=float(row["time_weight_sync_s"]),
                other_s=max(0.0, float(row["time_step_s"]) - stages),
                step_s=float(row["time_step_s"]),
                gen_tokens=max(float(row.get("tokens_generated", 1.0)), 1.0),
                train_tokens=max(float(row["train_tokens"]), 1.0),
            )
        )
    return samples


def fit_scaling(points: list[tuple[int, float]]) -> Scaling:
    """The exponent e of ``time ~ units ** -e`` through (units, seconds per token) points."""
    xs = [math.log(u) for u, _ in points]
    if len(set(xs)) < 2:
        return Scaling(ASSUMED_EXPONENT, fitted=False)
    ys = [math.log(max(rate, 1e-12)) for _, rate in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return Scaling(min(MAX_EXPONENT, max(MIN_EXPONENT, -slope)), fitted=True)


def candidates(units: int, workers: int, max_staleness: int) -> list[Placement]:
    """Colocated-synchronous, and every split the workers can take, synchronous and with
    each staleness up to ``max_staleness`` (each worker gets rollout_units / workers
    threads). A synchronous split is never faster in the model than colocation with
    linear scaling, but it is what the probe runs, so its prediction is checked."""
    out = [Placement(units, units, 0)]
    for r in range(workers, units, workers):
        for s in range(min(max_staleness, 2) + 1):  # s > 2 adds nothing in the model
            out.append(Placement(r, units - r, s))
    return out


def predict(
    samples: list[StepSample], p: Placement, units: int, rs: Scaling, ts: Scaling
) -> Option:
    """``p``'s expected step time (see the module doc) over the measured ``samples``.

    The closest measurements are used as they are: steps that ran ``p`` itself, else
    steps with its unit split (any staleness: a synchronous probe predicts an
    asynchronous split); only when there are none are all steps scaled to ``p`` by the
    fitted exponents (a clipped exponent would otherwise pull a measured split towards
    the other steps)."""
    ran = [s for s in samples if s.placement == p]
    split = [s for s in samples if s.placement.rollout_units == p.rollout_units
             and s.placement.trainer_units == p.trainer_units]  # fmt: skip
    samples = ran or split or samples
    r = [s.rollout_s * rs.factor(s.placement.rollout_units, p.rollout_units) for s in samples]
    t = [s.train_s * ts.factor(s.placement.trainer_units, p.trainer_units) for s in samples]
    # The trainer side of a step: train, weight sync and the loop's own bookkeeping.
    side = [a + s.sync_s + s.other_s for a, s in zip(t, samples, strict=True)]
    if p.colocated(units) or p.max_staleness == 0:
        step = statistics.fmean(a + b for a, b in zip(r, side, strict=True))
    elif p.max_staleness == 1:
        step = statistics.fmean(max(a, b) for a, b in zip(r, side, strict=True))
    else:
        step = max(statistics.fmean(r), statistics.fmean(side))
    mean_ran = statistics.fmean(s.step_s for s in ran) if ran else None
    return Option(p, step, statistics.fmean(r), statistics.fmean(t), mean_ran)


def make_plan(
    samples: list[StepSample], units: int, workers: int = 1, max_staleness: int = 2
) -> Plan:
    """Every candidate placement's expected step time; the best first."""
    if len(samples) < 2:
        raise ValueError(f"the plan needs at least 2 measured steps, found {len(samples)}")
    if units < 1 or workers < 1:
        raise ValueError("units and workers must be at least 1")
    rs = fit_scaling([(s.placement.rollout_units, s.rollout_s / s.gen_tokens) for s in samples])
    ts = fit_scaling([(s.placement.trainer_units, s.train_s / s.train_tokens) for s in samples])
    options = sorted(
        (predict(samples, p, units, rs, ts) for p in candidates(units, workers, max_staleness)),
        key=lambda o: o.step_s,
    )
    fastest = options[0].step_s
    near = [o for o in options if o.step_s <= fastest * (1 + TIE_MARGIN)]
    best = min(near, key=lambda o: (o.placement.max_staleness, o.step_s))
    plan = Plan(units, workers, options, best, rs, ts, len(samples))
    for name, sc in (("rollout", rs), ("train", ts)):
        if not sc.fitted:
            plan.notes.append(
                f"{name} speed-up exponent assumed ({ASSUMED_EXPONENT}): every measured step "
                "used one unit count (placement = 'auto' probes two)"
            )
    return plan


def format_plan(plan: Plan) -> str:
    """The plan as the table `temper plan` prints."""
    lines = [
        f"placement plan: {plan.units} units, {plan.workers} rollout worker(s), "
        f"from {plan.steps_used} measured steps",
        f"  speed-up exponent e (stage time x (u0/u)^e): rollout {_exponent(plan.rollout_scaling)}"
        f", train {_exponent(plan.train_scaling)}",
        f"  {'option':<46} {'expected s/step':>15} {'measured':>9}",
    ]
    for o in plan.options:
        mark = "*" if o is plan.best else " "
        measured = "-" if o.measured_step_s is None else f"{o.measured_step_s:.3f}"
        lines.append(
            f"{mark} {o.placement.describe(plan.units):<46} {o.step_s:>15.3f} {measured:>9}"
        )
    if plan.eval_s_per_step:
        lines.append(
            f"  eval adds {plan.eval_s_per_step:.3f} s per step on average, under any option"
        )
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _exponent(scaling: Scaling) -> str:
    return f"{scaling.exponent:.2f}" + ("" if scaling.fitted else " (assumed)")
