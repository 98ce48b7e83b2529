"""The algorithm table: each policy-gradient algorithm on the demo task and the tool-use
task, over seeds, at fixed steps.

Every run trains the built-in tiny model with the same config apart from the
algorithm's own keys (``ALGORITHMS``): the demo task is arithmetic levels 1-3
(single turn), the tool-use task is the ``tool_use`` env (calculator, price
lookup, python in the sandbox; up to 4 turns). Held-out greedy accuracy is
measured at step 0 and every ``--eval-every`` steps on ``--eval-size`` tasks;
seconds per step is the mean ``time_step_s``.

Per (task, algorithm): held-out accuracy at each eval step, as the mean over
seeds with the min and max (the spread), and seconds per step.

Prints one JSON line. The full table (3 seeds, both tasks, 7 algorithms) takes
hours on 2 cores; ``--tasks`` and ``--algorithms`` pick a part of it.

    nice -n 15 .venv/bin/python benchmarks/algorithms.py [--seeds 0 1 2] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import temper

#: Each algorithm's config sections, over the shared config.
ALGORITHMS: dict[str, dict] = {
    "grpo": {"algo": {"advantage": "grpo"}},
    "dr_grpo": {"algo": {"advantage": "dr_grpo"}},
    "rloo": {"algo": {"advantage": "rloo"}},
    "reinforce_pp": {"algo": {"advantage": "reinforce_pp", "reward_kl_coef": 0.01}},
    "gspo": {"algo": {"policy_loss": "gspo", "loss_agg": "seq-mean-token-mean"}},
    "cispo": {"algo": {"policy_loss": "cispo"}},
    "ppo_critic": {"algo": {"advantage": "gae"}, "critic": {"kind": "model"}},
}
TASKS = {
    "demo": {"data": {"type": "arithmetic", "levels": [1, 2, 3]}},
    "tool_use": {
        "env": {"type": "tool_use", "options": {"eval_size": 200}},
        "orchestrator": {"max_response_tokens": 64},
    },
}


def make_config(args: argparse.Namespace, out: str, task: str, algo: str, seed: int) -> dict:
    cfg: dict = {
        "run": {"name": f"{task}_{algo}_{seed}", "output_dir": out, "seed": seed},
        "trainer": {"lr": args.lr},
        "orchestrator": {
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
        },
        "eval": {"every": args.eval_every, "size": args.eval_size, "k": 1},
        "log": {"progress": False, "trajectories_per_step": 0},
        "checkpoint": {"at_end": False},
    }
    for section, values in [*ALGORITHMS[algo].items(), *TASKS[task].items()]:
        cfg.setdefault(section, {}).update(values)
    return cfg


def run_one(args: argparse.Namespace, task: str, algo: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_dir = temper.train(make_config(args, out, task, algo, seed)).run_dir
        seconds = time.perf_counter() - start
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = {}
        for path in sorted((Path(run_dir) / "eval").glob("step_*.json")):
            evals[int(path.stem.split("_")[1])] = json.loads(path.read_text())["accuracy"]
    steps = [r["time_step_s"] for r in rows if "time_step_s" in r]
    return {"accuracy": evals, "s_per_step": statistics.fmean(steps), "seconds": seconds}


def summarise(runs: list[dict]) -> dict:
    steps = sorted(runs[0]["accuracy"])
    accuracy = {}
    for step in steps:
        values = [r["accuracy"][step] for r in runs]
        accuracy[str(step)] = {
            "mean": round(statistics.fmean(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
        }
    return {
        "accuracy": accuracy,
        "s_per_step": round(statistics.fmean(r["s_per_step"] for r in runs), 3),
        "seeds": len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=100)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument(
        "--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS)
    )
    args = parser.parse_args()
    table: dict[str, dict] = {}
    for task in args.tasks:
        table[task] = {}
        for algo in args.algorithms:
            runs = []
            for seed in args.seeds:
                runs.append(run_one(args, task, algo, seed))
                line = {"task": task, "algorithm": algo, "seed": seed, **runs[-1]}
                print(json.dumps(line), file=sys.stderr, flush=True)
            table[task][algo] = summarise(runs)
    print(
        json.dumps(
            {
                "benchmark": "algorithms",
                "table": table,
                "config": vars(args),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
