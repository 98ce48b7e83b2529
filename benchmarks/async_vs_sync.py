"""Asynchronous vs synchronous training on an env with long-tailed tool latency.

Both runs train the built-in tiny model on the built-in tool-use env (calc and
lookup tasks) whose tool calls each wait 50-500 ms (a truncated Pareto:
median ~91 ms, a few near 500 ms; `temper.envs.tool_use.tool_latency_s`), for
the same number of trained samples: ``--steps`` x ``--prompts`` x ``--group``.
Sync waits every step for its slowest episode; async
(``orchestrator.max_staleness``) keeps episodes in flight while the trainer
trains and takes the first groups to finish, correcting with decoupled PPO.
Both use the same backend (default ``process``: ``--workers`` rollout worker
processes beside the trainer, one torch thread each, as a disaggregated run
would; the default of one worker gives trainer and rollouts a core each on a
2-core machine; with ``--backend local`` trainer and engine share one compute thread,
so async hides only the waiting). Same seed and hyperparameters, one run after
the other. The clock covers the training loop only (no eval, no model load).

Prints one JSON line: wall-clock seconds of each, ``speedup`` (sync / async),
the mean reward over the last half of the steps of each (the "equal samples"
comparison, with its standard error over steps), the mean seconds per step the
trainer waited for rollouts, trained and synced weights, and the async run's
staleness histogram (trained groups by staleness in policy versions).

    .venv/bin/python benchmarks/async_vs_sync.py [--steps 24] [--max-staleness 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from temper.config import config_from_dict
from temper.orchestrator.loop import Orchestrator


def make_config(args: argparse.Namespace, out: str, staleness: int) -> dict:
    return {
        "run": {
            "name": f"staleness_{staleness}",
            "output_dir": out,
            "seed": args.seed,
            # One torch thread per process: trainer and rollout worker then use one core
            # each instead of fighting over both (OpenMP teams larger than the free cores
            # spin against each other).
            "threads": args.threads,
        },
        "model": {"path": "tiny"},
        "env": {
            "type": "tool_use",
            "options": {
                "categories": ["calc", "lookup"],
                "eval_size": 8,
                "tool_latency_ms": [50, 500],
            },
            "limits": {"max_turns": 4, "timeout_s": 60},
        },
        "algo": {"off_policy_correction": "decoupled" if staleness else "none"},
        "trainer": {"lr": 1e-4},
        "orchestrator": {
            "backend": args.backend,
            "rollout_workers": args.workers,
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_response_tokens": 48,
            "max_staleness": staleness,
            "drop_zero_variance_groups": False,
        },
        "eval": {"at_start": False, "at_end": False, "every": 0},
        "log": {"progress": False, "trajectories_per_step": 0},
        "checkpoint": {"at_end": False},
    }


def run_one(args: argparse.Namespace, staleness: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = config_from_dict(make_config(args, out, staleness))
        orch = Orchestrator(cfg)

        async def go() -> float:
            start = time.perf_counter()
            try:
                await orch.run()
                return time.perf_counter() - start
            finally:
                await orch.close()  # stops rollout workers (backend = "process")

        seconds = asyncio.run(go())
        metrics = [json.loads(x) for x in orch.run_dir.metrics.read_text().splitlines()]
    tail = [m["reward_mean"] for m in metrics[len(metrics) // 2 :]]
    result = {
        "seconds": round(seconds, 2),
        "reward_last_half": round(statistics.fmean(tail), 4),
        "reward_last_half_se": round(statistics.stdev(tail) / len(tail) ** 0.5, 4)
        if len(tail) > 1
        else 0.0,
        "staleness_max": max(m["staleness_max"] for m in metrics),
        # Mean seconds per step the trainer waited for rollouts, trained, and synced weights.
        "per_step_s": {
            stage: round(statistics.fmean(m[f"time_{stage}_s"] for m in metrics), 3)
            for stage in ("generate", "train", "weight_sync")
        },
        "samples": sum(m["groups_kept"] for m in metrics) * args.group,
    }
    if orch.async_rollouts is not None:
        hist = orch.async_rollouts.stats.staleness
        result["staleness_histogram"] = {str(k): hist[k] for k in sorted(hist)}
        result["expired_groups"] = orch.async_rollouts.stats.expired
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    # One rollout worker: with the trainer that is one process per core on a 2-core
    # machine; a second worker makes three processes share two cores.
    parser.add_argument("--workers", type=int, default=1, help="rollout worker processes")
    parser.add_argument(
        "--backend",
        choices=["local", "process"],
        default="process",
        help="process: rollouts in a worker process beside the trainer (both modes)",
    )
    args = parser.parse_args()
    sync = run_one(args, 0)
    asynchronous = run_one(args, args.max_staleness)
    print(
        json.dumps(
            {
                "speedup": round(sync["seconds"] / asynchronous["seconds"], 3),
                "max_staleness": args.max_staleness,
                "backend": args.backend,
                "rollout_workers": args.workers,
                "sync": sync,
                "async": asynchronous,
                "trained_samples": args.steps * args.prompts * args.group,
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
