"""Placement from measurements: `temper plan RUN`, and ``orchestrator.placement = "auto"``.

A run records, every step, the placement it ran under (``placement/*``
metrics: the units the rollout side and the trainer used, and the
staleness). `run_plan` reads a run directory and gives the stage model's plan
(`temper.orchestrator.stage_model`).

`AutoPlacement` does it inside a run with rollout workers (process or Ray
backend) on CPU. For the first ``placement_warmup_steps`` steps it alternates
two probes, all cores taking turns (colocated) and the cores split between
the workers and the trainer, both synchronous, so each stage is measured at
two unit counts. Then it reads those steps back from the run's own
metrics.jsonl, applies the plan's best placement (worker threads, trainer
threads) and starts asynchronous rollouts when the plan chose a staleness. A
resumed run reads the same steps back and so applies the same plan.

On CPU a unit is a core, given to torch as threads, which changes in place.
GPU placements (which devices each side holds) are fixed when the run starts,
so ``auto`` refuses CUDA runs; `temper plan` still prints the table for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper import compute
from temper.config import Config
from temper.errors import ConfigError
from temper.monitor.sinks import read_jsonl
from temper.orchestrator.stage_model import Placement, Plan, make_plan, samples_from_metrics


def fixed_placement(cfg: Config, trainer_threads: int) -> Placement:
    """The placement a run with ``orchestrator.placement = "fixed"`` runs under."""
    o = cfg.orchestrator
    if o.backend == "local":
        return Placement(trainer_threads, trainer_threads, o.max_staleness)
    # As `RolloutWorker` sets its threads.
    share = max(1, compute.cores() // o.rollout_workers)
    per_worker = o.worker_threads or cfg.run.threads or share
    return Placement(
        o.rollout_workers * per_worker, trainer_threads * cfg.trainer.world_size, o.max_staleness
    )


def placement_metrics(
    p: Placement, units: int, worker_threads: int | None = None
) -> dict[str, float]:
    """What each step records (``worker_threads``: as the workers reported, under auto)."""
    extra = {} if worker_threads is None else {"placement/worker_threads": float(worker_threads)}
    return extra | {
        "placement/rollout_units": float(p.rollout_units),
        "placement/trainer_units": float(p.trainer_units),
        "placement/max_staleness": float(p.max_staleness),
        "placement/machine_units": float(units),
    }


def staleness_cap(cfg: Config) -> int:
    """The most staleness a plan may choose for ``cfg`` (refill needs synchronous steps)."""
    o = cfg.orchestrator
    return 0 if o.refill else o.auto_max_staleness


def run_plan(
    run_dir: str | Path, units: int | None = None, max_staleness: int | None = None
) -> Plan:
    """The stage model's plan from a run directory's measured steps."""
    from temper.config.load import load_run_config

    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file() or not (run / "config.toml").is_file():
        raise ConfigError(f"{run} is not a run directory (no metrics.jsonl and config.toml)")
    cfg = load_run_config(run / "config.toml")
    rows = read_jsonl(metrics)
    samples = samples_from_metrics(rows)
    if len(samples) < 2:
        raise ConfigError(
            f"{run}: the plan needs at least 2 measured training steps after the first, found "
            f"{len(samples)} (steps without placement/* metrics or without an update do not count)"
        )
    recorded = [int(r["placement/machine_units"]) for r in rows if "placement/machine_units" in r]
    cap = staleness_cap(cfg) if max_staleness is None else max_staleness
    plan = make_plan(samples, units or max(recorded), cfg.orchestrator.rollout_workers, cap)
    # Each eval/step_N.json holds its eval's wall time (runs before this kept none).
    evals = sum(json.loads(p.read_text()).get("time_s", 0.0) for p in run.glob("eval/step_*.json"))
    plan.eval_s_per_step = evals / max(int(r.get("step", 0)) for r in rows)
    plan.notes.append(f"to run the best option: {apply_flags(plan, cfg)}")
    return plan


def apply_flags(plan: Plan, cfg: Config) -> str:
    """The overrides that run ``plan``'s best option as a fixed placement."""
    p, o = plan.best.placement, cfg.orchestrator
    backend = "process" if o.backend == "local" else o.backend  # a split needs workers
    if p.colocated(plan.units) and o.backend == "local":
        return f"--run.threads={p.trainer_units} --orchestrator.max_staleness=0"
    return (
        f"--orchestrator.backend={backend} --orchestrator.worker_threads="
        f"{max(1, p.rollout_units // plan.workers)} --run.threads={p.trainer_units} "
        f"--orchestrator.max_staleness={p.max_staleness} (or --orchestrator.placement=auto)"
    )


def check_auto_placement(cfg: Config) -> None:
    """Refuse, before any work, a run that ``placement = "auto"`` cannot place."""
    if cfg.orchestrator.placement != "auto":
        return
    if cfg.trainer.world_size != 1:
        raise ConfigError(
            "orchestrator.placement = 'auto' needs trainer.world_size = 1 (it moves cores "
            "between the workers and the in-process trainer); run `temper plan` instead"
        )
    if "cuda" in (cfg.engine.device, cfg.trainer.device):
        raise ConfigError(
            "orchestrator.placement = 'auto' places CPU cores; GPU placements are fixed at "
            "launch: run `temper plan RUN` and set them in the config"
        )


class AutoPlacement:
    """Probe, then apply the plan (``orchestrator.placement = "auto"``; see the module doc)."""

    def __init__(self, cfg: Config, backend: Any, metrics_path: Path) -> None:
        o = cfg.orchestrator
        self.backend, self.metrics_path = backend, metrics_path
        self.units, self.workers = compute.cores(), o.rollout_workers
        self.warmup, self.cap = o.placement_warmup_steps, staleness_cap(cfg)
        self.colocated = Placement(self.units, self.units, 0)
        self.current = self.colocated
        self.worker_threads: int | None = None  # the fewest any worker reported
        self.plan: Plan | None = None

    @property
    def split(self) -> Placement | None:
        """The split probe: about half the cores to the workers (whole threads each)."""
        r = self.workers * max(1, (self.units // 2) // self.workers)
        return Placement(r, self.units - r, 0) if r < self.units else None

    @property
    def probing(self) -> bool:
        return self.plan is None and self.split is not None

    def probe(self, step: int) -> Placement:
        """Step ``step``'s probe: colocated on odd steps, split on even ones."""
        split = self.split
        return self.colocated if split is None or step % 2 else split

    def apply(self, p: Placement) -> None:
        """Give the workers and the trainer their threads."""
        reported = self.backend.set_worker_threads(max(1, p.rollout_units // self.workers))
        self.worker_threads = min((n for n in reported if n is not None), default=None)
        compute.set_threads(p.trainer_units)
        self.current = p

    def decide(self) -> Plan:
        """The plan from the warm-up steps in this run's metrics; its best placement applied."""
        rows = [r for r in read_jsonl(self.metrics_path) if int(r.get("step", 0)) <= self.warmup]
        plan = make_plan(samples_from_metrics(rows), self.units, self.workers, self.cap)
        self.apply(plan.best.placement)
        self.plan = plan
        return plan
