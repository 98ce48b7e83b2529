"""Difficulty-targeted vs uniform task sampling: held-out accuracy per generated token.

Trains the built-in tiny model with GRPO on arithmetic levels 1-4 (a wide
difficulty spread: at the start the model solves about 95% of one-digit sums
and about 15% of three-digit ones) once with ``sampler.type = "uniform"`` and
once with ``"targeted"`` (Thompson draws towards a 50% pass rate, statistics
per level), for each seed, same config otherwise. Held-out greedy accuracy (all
four levels, ``--eval-size`` problems) is measured every ``--eval-every`` steps,
and the generated tokens of training rollouts are summed up to each eval.

For each seed: uniform's final accuracy A at T tokens; the targeted run's
first eval with accuracy >= A is at t tokens; ``token_ratio`` = t / T (None if
it never gets there). The headline compares the seed-mean curves the same way
(and reports the per-seed ratios and their median). ``saving`` = 1 - ratio; the
issue asks for >= 30%.

Prints one JSON line.

    .venv/bin/python benchmarks/sampling.py [--seeds 0 1 2] [--steps 40]
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


def make_config(args: argparse.Namespace, out: str, sampler: str, seed: int) -> dict:
    return {
        "run": {"name": f"{sampler}_{seed}", "output_dir": out, "seed": seed},
        "data": {"type": "arithmetic", "levels": [1, 2, 3, 4], "eval_size": args.eval_size},
        "sampler": {"type": sampler},
        "trainer": {"lr": args.lr, "warmup_steps": 2},
        "orchestrator": {
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_response_tokens": args.max_tokens,
        },
        "eval": {"every": args.eval_every, "k": 1, "temperature": 1.0},
        "log": {"progress": False, "trajectories_per_step": 0},
        "checkpoint": {"at_end": False},
    }


def run_one(args: argparse.Namespace, sampler: str, seed: int) -> dict:
    """(step -> cumulative training tokens, step -> held-out greedy accuracy)."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_dir = temper.train(make_config(args, out, sampler, seed)).run_dir
        seconds = time.perf_counter() - start
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = {}
        for path in sorted((Path(out) / f"{sampler}_{seed}" / "eval").glob("step_*.json")):
            evals[int(path.stem.split("_")[1])] = json.loads(path.read_text())["accuracy"]
    tokens, total = {0: 0.0}, 0.0
    for r in rows:
        if "tokens_generated" in r:  # eval extras rows have no training keys
            total += r["tokens_generated"]
            tokens[r["step"]] = total
    informative = [r["groups_kept"] / args.prompts for r in rows if "groups_kept" in r]
    return {
        "seconds": round(seconds, 1),
        "tokens": {s: tokens[s] for s in evals},
        "accuracy": evals,
        "informative_frac": round(statistics.fmean(informative), 3),
    }


def tokens_to_reach(run: dict, goal: float) -> float | None:
    for step in sorted(run["accuracy"]):
        if run["accuracy"][step] >= goal - 1e-9:
            return run["tokens"][step]
    return None


def mean_curve(runs: list[dict]) -> dict:
    steps = sorted(runs[0]["accuracy"])
    return {
        "accuracy": {s: statistics.fmean(r["accuracy"][s] for r in runs) for s in steps},
        "tokens": {s: statistics.fmean(r["tokens"][s] for r in runs) for s in steps},
    }


def ratio(uniform: dict, targeted: dict) -> float | None:
    """Targeted's tokens to reach uniform's final accuracy over uniform's tokens; None
    when targeted never gets there, or when uniform did not improve on its start (then
    there is no level to reach, and a 0-token "saving" would be meaningless)."""
    final, start = max(uniform["accuracy"]), min(uniform["accuracy"])
    if uniform["accuracy"][final] <= uniform["accuracy"][start]:
        return None
    reached = tokens_to_reach(targeted, uniform["accuracy"][final])
    return None if reached is None else round(reached / uniform["tokens"][final], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=200)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"uniform": [], "targeted": []}
    for seed in args.seeds:  # interleaved, each run's result on stderr as it ends
        for sampler, done in runs.items():
            done.append(run_one(args, sampler, seed))
            print(json.dumps({"sampler": sampler, "seed": seed, **done[-1]}), file=sys.stderr)
    per_seed = [ratio(u, t) for u, t in zip(runs["uniform"], runs["targeted"], strict=True)]
    mean_u, mean_t = mean_curve(runs["uniform"]), mean_curve(runs["targeted"])
    headline = ratio(mean_u, mean_t)
    reached = [r for r in per_seed if r is not None]
    print(
        json.dumps(
            {
                "token_ratio": headline,
                "saving": None if headline is None else round(1 - headline, 3),
                "target_met": headline is not None and headline <= 0.7,
                "per_seed_token_ratio": per_seed,
                "per_seed_median": statistics.median(reached) if reached else None,
                "uniform_final_accuracy": [r["accuracy"][args.steps] for r in runs["uniform"]],
                "targeted_final_accuracy": [r["accuracy"][args.steps] for r in runs["targeted"]],
                "mean_curves": {
                    "uniform": {str(k): round(v, 4) for k, v in mean_u["accuracy"].items()},
                    "targeted": {str(k): round(v, 4) for k, v in mean_t["accuracy"].items()},
                    "uniform_tokens": {str(k): v for k, v in mean_u["tokens"].items()},
                    "targeted_tokens": {str(k): v for k, v in mean_t["tokens"].items()},
                },
                "informative_frac": {
                    s: [r["informative_frac"] for r in rs] for s, rs in runs.items()
                },
                "seconds": {s: [r["seconds"] for r in rs] for s, rs in runs.items()},
                "config": vars(args),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
