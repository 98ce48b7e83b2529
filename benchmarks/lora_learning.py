"""Does LoRA learn as well as full fine-tuning on the demo task? (`benchmarks/lora.py --learning`)

Each arm is the `make demo` config (the built-in tiny model, GRPO on arithmetic,
``trainer.lr`` 1e-4) cut to ``--steps`` steps with a greedy held-out eval every
``--eval-every`` steps, run as its own ``temper train`` process so that each arm's
peak RSS is its own: full fine-tuning, and LoRA at each ``--ranks`` with the
defaults of ``[lora]`` (every linear layer, alpha 32, the adapters at 10x the full
rate), for each of ``--seeds``. The question is LoRA Without Regret's claim that
for RL even rank 1 matches full fine-tuning.

Prints one JSON line: per arm, the held-out greedy accuracy at each eval step
(mean over seeds, and each seed's), seconds per step (mean of the steps'
``time_step_s``) and peak RSS (the largest ``peak_rss_mb`` any step logged), and
``final_ratio_vs_full`` (the arm's mean final accuracy over full fine-tuning's).

    nice -n 15 .venv/bin/python benchmarks/lora.py --learning [--steps 40] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def arm_args(rank: int | None, seed: int, args: argparse.Namespace, out: str) -> list[str]:
    name = f"{'full' if rank is None else f'r{rank}'}_s{seed}"
    cmd = [
        "train",
        f"--run.name={name}",
        f"--run.output_dir={out}",
        f"--run.seed={seed}",
        f"--orchestrator.steps={args.steps}",
        f"--eval.every={args.eval_every}",
        "--eval.k=1",
        "--checkpoint.at_end=false",
        "--log.progress=false",
    ]
    if rank is not None:
        cmd.append(f"--lora.rank={rank}")
    return cmd


def read_run(run: Path) -> dict:
    """Held-out greedy accuracy per eval step, mean seconds per step, peak RSS (MB)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time_step_s" in r]
    evals = {
        int(p.stem.removeprefix("step_")): json.loads(p.read_text())["accuracy"]
        for p in (run / "eval").glob("step_*.json")
    }
    if len(steps) == 0 or not evals:
        raise SystemExit(f"{run}: the run logged no steps or no evals")
    return {
        "accuracy": dict(sorted(evals.items())),
        "s_per_step": statistics.mean(r["time_step_s"] for r in steps),
        "peak_rss_mb": max(r.get("peak_rss_mb", 0.0) for r in steps),
    }


def run_train(train_args: list[str], out: str) -> Path:
    """``temper train`` with ``train_args`` (its first is ``train``, one is
    ``--run.name=NAME``) in its own process, its output in ``out/NAME.log``; the run's
    directory. A failed run stops the benchmark with the log's path."""
    temper = Path(sys.executable).with_name("temper")
    cmd = [str(temper), *train_args]
    name = next(a for a in train_args if a.startswith("--run.name=")).removeprefix("--run.name=")
    log = Path(out) / f"{name}.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}; see {log}")
    return Path(out) / name


def run_arm(rank: int | None, seed: int, args: argparse.Namespace, out: str) -> dict:
    return read_run(run_train(arm_args(rank, seed, args, out), out))


def accuracy_over_seeds(runs: list[dict]) -> dict:
    """Per eval step: the seeds' mean held-out accuracy, each seed's, and s/step's mean."""
    steps = sorted(runs[0]["accuracy"])
    return {
        "accuracy_mean": {
            s: round(statistics.mean(r["accuracy"][s] for r in runs), 4) for s in steps
        },
        "accuracy_per_seed": {s: [r["accuracy"][s] for r in runs] for s in steps},
        "s_per_step": round(statistics.mean(r["s_per_step"] for r in runs), 3),
    }


def summarise(runs: list[dict]) -> dict:
    last = max(runs[0]["accuracy"])
    return {
        **accuracy_over_seeds(runs),
        "final_accuracy_std": round(statistics.pstdev(r["accuracy"][last] for r in runs), 4),
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
    }


def learning(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="temper_lora_learning_")
    os.makedirs(out, exist_ok=True)
    arms: dict[str, dict] = {}
    for rank in [None, *args.ranks]:
        name = "full" if rank is None else f"rank_{rank}"
        runs = [run_arm(rank, seed, args, out) for seed in args.seeds]
        arms[name] = summarise(runs)
        print(f"{name}: {arms[name]}", file=sys.stderr, flush=True)
    last = max(arms["full"]["accuracy_mean"])
    full_final = arms["full"]["accuracy_mean"][last]
    for arm in arms.values():
        final = arm["accuracy_mean"][last]
        arm["final_ratio_vs_full"] = round(final / full_final, 4) if full_final else None
    print(
        json.dumps(
            {
                "benchmark": "lora_learning",
                "steps": args.steps,
                "seeds": args.seeds,
                "arms": arms,
                "rank_1_final_ratio_vs_full": arms.get("rank_1", {}).get("final_ratio_vs_full"),
                "out": out,
            }
        )
    )
