"""Outcome vs turn-level credit on a multi-step env, over several seeds.

Trains the built-in tiny model on `arithmetic_chain` (``--length`` arithmetic
questions per episode, one per turn, 1.0 per right answer: the env's process
reward) twice per seed: ``algo.credit = "outcome"`` (every token of an episode
gets the advantage of its total) and ``algo.credit = "turn"`` with
``algo.turn_discount = --gamma`` (each turn's tokens get the advantage of its
own discounted return, against the group's at the same turn index). Everything
else is the same: seed, tasks, GRPO, learning rate, steps. With ``--advantage
gae`` both arms are PPO with a critic instead: token-level GAE on the episode's
reward (outcome) against turn-level GAE on the per-turn rewards (turn). The questions are
independent, so under outcome credit each answer's advantage also carries the
luck of the other answers of its episode.

Measured per run: the share of right answers in the training batches (sampled,
temperature 1) at each step, and at the end the held-out success (all answers of
a chain right, mean over ``--eval-k`` samples of ``--eval-size`` held-out
chains). Prints one JSON line: per arm the mean and spread (min, max) over
seeds of the held-out success and of the right-answer rate over the last
``--tail`` steps, the steps each run took to reach ``level`` (the outcome
arm's mean final right-answer rate, as a 3-step rolling mean), and the ratios
turn / outcome.

    nice -n 15 .venv/bin/python benchmarks/credit.py [--seeds 0 1 2] [--steps 30] [--gamma 0.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import temper


def make_config(args: argparse.Namespace, out: str, credit: str, seed: int) -> dict:
    algo: dict = {"advantage": args.advantage, "credit": credit}
    if credit == "turn":
        algo["turn_discount"] = args.gamma
    return {
        "run": {"name": credit, "output_dir": out, "seed": seed, "threads": args.threads},
        "model": {"path": "tiny"},
        "env": {
            "type": "arithmetic_chain",
            "options": {"length": args.length, "eval_size": args.eval_size},
            "limits": {"max_turns": args.length},
        },
        "algo": algo,
        "trainer": {"lr": args.lr, "warmup_steps": 1},
        "orchestrator": {
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_response_tokens": 48,
        },
        "eval": {"at_start": False, "at_end": True, "every": 0, "k": args.eval_k},
        "log": {"progress": False, "trajectories_per_step": 0},
        "checkpoint": {"at_end": False},
    }


def run_one(args: argparse.Namespace, credit: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_dir = temper.train(make_config(args, out, credit, seed)).run_dir
        seconds = time.perf_counter() - start
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        final = json.loads((run_dir / "eval" / f"step_{args.steps:06d}.json").read_text())
    per_step = args.prompts * args.group * args.length
    result = {
        "right_rate": [round(m["env/right"] / per_step, 4) for m in metrics],
        "heldout_success": round(final[f"mean@{args.eval_k}"], 4),
        "seconds": round(seconds, 1),
    }
    # One line per run on stderr, so a long benchmark that is stopped keeps what it ran.
    print(json.dumps({"credit": credit, "seed": seed, **result}), file=sys.stderr, flush=True)
    return result


def steps_to(curve: list[float], level: float) -> int | None:
    """First step (1-based) whose 3-step rolling mean of ``curve`` reaches ``level``."""
    for i in range(len(curve)):
        window = curve[max(0, i - 2) : i + 1]
        if len(window) == 3 and statistics.fmean(window) >= level:
            return i + 1
    return None


def spread(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=6)
    parser.add_argument("--length", type=int, default=3, help="questions per episode")
    parser.add_argument("--gamma", type=float, default=0.0, help="turn_discount of the turn arm")
    parser.add_argument(
        "--advantage",
        choices=["grpo", "gae"],
        default="grpo",
        help="grpo: group baselines (per turn index for the turn arm); gae: PPO with a critic, "
        "token-level GAE (outcome arm) against turn-level GAE (turn arm)",
    )
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--tail", type=int, default=10, help="last steps averaged")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    runs = {arm: [run_one(args, arm, s) for s in args.seeds] for arm in ("outcome", "turn")}
    level = statistics.fmean(statistics.fmean(r["right_rate"][-3:]) for r in runs["outcome"])
    summary = {}
    for arm, rs in runs.items():
        summary[arm] = {
            "heldout_success": spread([r["heldout_success"] for r in rs]),
            "right_rate_tail": spread(
                [statistics.fmean(r["right_rate"][-args.tail :]) for r in rs]
            ),
            "steps_to_level": [steps_to(r["right_rate"], level) for r in rs],
            "seconds": [r["seconds"] for r in rs],
            "right_rate_by_seed": [r["right_rate"] for r in rs],
        }
    o, t = summary["outcome"], summary["turn"]
    reached = [s for s in t["steps_to_level"] if s is not None]
    print(
        json.dumps(
            {
                "env": f"arithmetic_chain length {args.length}",
                "gamma": args.gamma,
                "seeds": args.seeds,
                "steps": args.steps,
                "episodes_per_step": args.prompts * args.group,
                "level": round(level, 4),
                "heldout_success_ratio": round(
                    t["heldout_success"]["mean"] / max(o["heldout_success"]["mean"], 1e-9), 3
                ),
                "right_rate_tail_ratio": round(
                    t["right_rate_tail"]["mean"] / max(o["right_rate_tail"]["mean"], 1e-9), 3
                ),
                "turn_runs_reaching_level": len(reached),
                "outcome": o,
                "turn": t,
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
