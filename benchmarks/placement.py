"""The stage scheduler's choice against every fixed placement, on two workload shapes.

Two workloads on the built-in tiny model, both with one rollout worker process
(``orchestrator.backend = "process"``):

- ``generation_bound``: the HF engine (generation several times slower than
  the native engine's) and 48-token answers, one PPO epoch;
- ``training_bound``: the native engine, 24-token answers, four PPO epochs of
  two mini-batches each.

Both train every group (no zero-variance dropping) at a tiny learning rate, so
the workload does not drift as the policy learns and runs compare.
``colocated_stage_s`` gives each workload's rollout and train time in its
colocated run.

For each workload every fixed placement of the machine's C cores runs for
``--steps`` steps: colocated (worker and trainer each use all C cores, taking
turns, synchronous), and the cores split in half between worker and trainer,
synchronous, and asynchronous with staleness 1 and 2. The measured step time
of a run is the mean ``time_step_s`` after its first ``--skip`` steps. Then a
run with ``orchestrator.placement = "auto"`` probes for
``placement_warmup_steps`` steps and applies its plan. Per workload:

- ``choice_ratio``: the fixed run of the placement the plan chose, over the
  fastest fixed run (the issue asks for <= 1.10);
- ``predicted`` vs ``measured``: the plan's expected step time of each fixed
  placement against that fixed run (how well the model held);
- ``auto_after_warmup_s`` and ``auto_ratio``: the auto run's own mean step time
  after it applied the plan, and that over the fastest fixed run (the same
  choice measured again, in the run that made it).

Prints one JSON line; ``ratio`` is the worst ``choice_ratio``.

    .venv/bin/python benchmarks/placement.py [--steps 12] [--skip 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import temper
from temper import compute

# Every group is trained and the learning rate is tiny, so the policy (and with it the
# answer lengths and the train tokens) stays put: a step late in one run costs what a
# step early in another does, and the runs compare.
COMMON = {
    "orchestrator": {"prompts_per_step": 8, "group_size": 8, "drop_zero_variance_groups": False},
    "trainer": {"lr": 1e-7},
}
WORKLOADS = {
    "generation_bound": {
        "engine": {"type": "hf"},
        "orchestrator": {"max_response_tokens": 48},
    },
    "training_bound": {
        "orchestrator": {"max_response_tokens": 24},
        "trainer": {"ppo_epochs": 4, "mini_batches": 2},
    },
}


def fixed_placements(cores: int) -> dict[str, tuple[int, int, int]]:
    half = max(1, cores // 2)
    return {
        "colocated_sync": (cores, cores, 0),
        "split_sync": (half, cores - half, 0),
        "split_async_s1": (half, cores - half, 1),
        "split_async_s2": (half, cores - half, 2),
    }


def make_config(workload: dict, out: str, name: str, steps: int, placement: dict) -> dict:
    cfg = {
        "run": {"name": name, "output_dir": out, "seed": 0},
        "eval": {"at_start": False, "at_end": False},
        "log": {"progress": False, "trajectories_per_step": 0},
        "checkpoint": {"at_end": False},
    }
    for part in (COMMON, workload):
        for section, values in part.items():
            cfg.setdefault(section, {}).update(values)
    o = cfg.setdefault("orchestrator", {})
    o.update({"steps": steps, "backend": "process", "rollout_workers": 1, **placement})
    return cfg


def run(cfg: dict) -> tuple[list[dict], list[dict]]:
    """The run's metrics rows and events."""
    run_dir = temper.train(cfg).run_dir
    read = lambda p: [json.loads(x) for x in p.read_text().splitlines() if x.strip()]  # noqa: E731
    return read(run_dir / "metrics.jsonl"), read(run_dir / "events.jsonl")


def mean_step(rows: list[dict], after: int) -> float:
    return statistics.fmean(
        r["time_step_s"] for r in rows if r.get("step", 0) > after and "time_step_s" in r
    )


def bench_workload(name: str, workload: dict, args: argparse.Namespace, out: str) -> dict:
    cores = compute.cores()
    measured: dict[str, float] = {}
    shares: dict[str, float] = {}
    by_placement: dict[tuple[int, int, int], str] = {}
    for label, (r, t, s) in fixed_placements(cores).items():
        placement = {"worker_threads": r, "max_staleness": s}
        cfg = make_config(workload, out, f"{name}_{label}", args.steps, placement)
        cfg["run"]["threads"] = t
        rows, _ = run(cfg)
        measured[label] = mean_step(rows, args.skip)
        if label == "colocated_sync":
            timed = [r for r in rows if r.get("step", 0) > args.skip and "time_step_s" in r]
            for key in ("time_rollout_busy_s", "time_train_s"):
                shares[key] = round(statistics.fmean(r[key] for r in timed), 3)
        by_placement[(r, t, s)] = label
        print(f"{name} {label}: {measured[label]:.3f} s/step", file=sys.stderr, flush=True)
    warm = args.warmup
    cfg = make_config(
        workload, out, f"{name}_auto", warm + args.steps,
        {"placement": "auto", "placement_warmup_steps": warm},
    )  # fmt: skip
    rows, events = run(cfg)
    plan = next(e["plan"] for e in events if e.get("kind") == "placement")
    best = plan["best"]
    choice = by_placement[(best["rollout_units"], best["trainer_units"], best["max_staleness"])]
    predicted = {
        by_placement[(o["rollout_units"], o["trainer_units"], o["max_staleness"])]: o[
            "expected_step_s"
        ]
        for o in plan["options"]
        if (o["rollout_units"], o["trainer_units"], o["max_staleness"]) in by_placement
    }
    fastest = min(measured, key=measured.__getitem__)
    auto_s = mean_step(rows, warm + args.skip)
    return {
        "choice": choice,
        "fastest_fixed": fastest,
        "choice_ratio": round(measured[choice] / measured[fastest], 3),
        "measured_s": {k: round(v, 3) for k, v in measured.items()},
        "predicted_s": {k: round(v, 3) for k, v in predicted.items()},
        "prediction_error": {
            k: round(predicted[k] / measured[k] - 1, 3) for k in predicted if k in measured
        },
        "auto_after_warmup_s": round(auto_s, 3),
        # The auto run itself after it applied its plan, over the fastest fixed run:
        # the same choice measured in another run (runs of one placement vary by ~10%).
        "auto_ratio": round(auto_s / measured[fastest], 3),
        "colocated_stage_s": shares,
        "exponents": {"rollout": plan["rollout_exponent"], "train": plan["train_exponent"]},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="steps per fixed run (and after warm-up)")
    p.add_argument("--skip", type=int, default=2, help="first steps of a run not timed")
    p.add_argument("--warmup", type=int, default=6, help="placement_warmup_steps of the auto run")
    p.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for name in args.workloads:
            results[name] = bench_workload(name, WORKLOADS[name], args, out)
    ratio = max(r["choice_ratio"] for r in results.values())
    print(
        json.dumps(
            {
                "benchmark": "placement",
                "cores": compute.cores(),
                "steps": args.steps,
                "ratio": ratio,
                "within_10pct": ratio <= 1.10,
                "workloads": results,
            }
        )
    )


if __name__ == "__main__":
    main()
