"""Does on-policy distillation reach RL's accuracy with fewer generated tokens?

The teacher is the demo run's trained checkpoint (``--teacher PATH``, or this script
trains it first: the `make demo` config for ``--teacher-steps`` steps). The student
is the built-in tiny model, untrained. Two arms on the demo task (arithmetic), each
a ``temper train`` process, for each of ``--seeds``:

- **grpo**: the demo config itself (GRPO, 16 prompts x 8 samples a step);
- **distill**: ``algo.advantage = "distill"`` from the teacher, with
  ``--distill-group-size`` samples per prompt (a teacher scores every token, so a
  group needs no second sample to compare with) and the same prompts per step;
  ``--teacher-temperature`` (``distill.teacher_temperature``),
  ``--distill-estimator`` (``distill.estimator``) and
  ``--distill-reward-weight`` (``distill.reward_weight``), ``--distill-lr`` and
  ``--distill-schedule`` (its ``trainer.lr`` and ``trainer.schedule``) set the rest.

Both evaluate greedily on the same held-out tasks every ``--eval-every`` steps. The
measure is held-out accuracy against the student tokens generated so far (the sum
of the steps' ``tokens_generated``). Prints one JSON line: per arm, accuracy and
generated tokens at each eval step (mean over seeds, and each seed's); the teacher's
own accuracy; GRPO's final mean accuracy; for it and for ``--threshold``, the
tokens each arm generated up to its first eval at or above it, and GRPO's over
distillation's (``token_ratio``, for GRPO's final accuracy: the goal is >= 5).
Distillation runs ``--distill-steps`` (default 80), so that it has the chance to
reach GRPO's final accuracy. The evals' own generations are not counted.

    nice -n 15 .venv/bin/python benchmarks/distill.py [--steps 40] [--distill-steps 80]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from lora_learning import accuracy_over_seeds, run_train


def common(name: str, seed: int, args: argparse.Namespace, out: str) -> list[str]:
    return [
        "train",
        f"--run.name={name}",
        f"--run.output_dir={out}",
        f"--run.seed={seed}",
        f"--eval.every={args.eval_every}",
        "--eval.k=1",
        "--log.progress=false",
    ]


def train_teacher(args: argparse.Namespace, out: str) -> str:
    """The demo config for ``--teacher-steps`` steps; its final checkpoint."""
    cmd = common("teacher", 0, args, out)
    cmd += [f"--orchestrator.steps={args.teacher_steps}", "--checkpoint.keep_best=false"]
    run = run_train(cmd, out)
    return str(run / "checkpoints" / f"step_{args.teacher_steps}")


def arm_args(arm: str, seed: int, teacher: str, args: argparse.Namespace, out: str) -> list[str]:
    cmd = common(f"{arm}_s{seed}", seed, args, out)
    steps = args.distill_steps if arm == "distill" else args.steps
    cmd += [f"--orchestrator.steps={steps}", "--checkpoint.at_end=false"]
    if arm == "distill":
        cmd += [
            "--algo.advantage=distill",
            f"--distill.teacher={teacher}",
            f"--orchestrator.group_size={args.distill_group_size}",
            f"--distill.teacher_temperature={args.teacher_temperature}",
            f"--distill.estimator={args.distill_estimator}",
            f"--distill.reward_weight={args.distill_reward_weight}",
            f"--trainer.schedule={args.distill_schedule}",
            *([f"--trainer.lr={args.distill_lr}"] if args.distill_lr else []),
            # The teacher's accuracy is measured once, by the teacher run's own eval.
            "--distill.teacher_eval=false",
        ]
    return cmd


def read_run(run: Path) -> dict:
    """Held-out greedy accuracy and the generated tokens so far, per eval step."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if "tokens_generated" in r}
    evals = {
        int(p.stem.removeprefix("step_")): json.loads(p.read_text())["accuracy"]
        for p in (run / "eval").glob("step_*.json")
    }
    if not steps or not evals:
        raise SystemExit(f"{run}: the run logged no steps or no evals")
    tokens = {s: sum(r["tokens_generated"] for k, r in steps.items() if k <= s) for s in evals}
    kl = [r["distill_reverse_kl"] for r in steps.values() if "distill_reverse_kl" in r]
    return {
        "accuracy": dict(sorted(evals.items())),
        "tokens": dict(sorted(tokens.items())),
        "s_per_step": statistics.mean(r["time_step_s"] for r in steps.values()),
        "reverse_kl_first_last": [kl[0], kl[-1]] if kl else None,
    }


def summarise(runs: list[dict]) -> dict:
    steps = sorted(runs[0]["accuracy"])
    return {
        **accuracy_over_seeds(runs),
        "tokens_mean": {s: round(statistics.mean(r["tokens"][s] for r in runs)) for s in steps},
        "reverse_kl_first_last": [r["reverse_kl_first_last"] for r in runs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=None, help="a trained checkpoint (default: train one)")
    ap.add_argument("--teacher-steps", type=int, default=40)
    ap.add_argument("--steps", type=int, default=40, help="GRPO's steps")
    ap.add_argument("--distill-steps", type=int, default=80)
    ap.add_argument("--threshold", type=float, default=0.9, help="a second accuracy to reach")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--distill-group-size", type=int, default=1)
    ap.add_argument(
        "--teacher-temperature", type=float, default=1.0, help="distill.teacher_temperature"
    )
    ap.add_argument(
        "--distill-estimator",
        choices=["sampled", "full"],
        default="sampled",
        help="distill.estimator: one sampled token's term, or the KL over the vocabulary",
    )
    ap.add_argument("--distill-reward-weight", type=float, default=0.0, help="needs a group >= 2")
    ap.add_argument(
        "--distill-lr", type=float, default=None, help="its trainer.lr (default: the demo's)"
    )
    ap.add_argument(
        "--distill-schedule",
        choices=["constant", "cosine", "linear"],
        default="constant",
        help="its trainer.schedule (the demo's: constant)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="temper_distill_")
    os.makedirs(out, exist_ok=True)
    teacher = args.teacher or train_teacher(args, out)
    teacher_accuracy = None
    if args.teacher is None:
        last = json.loads(
            (Path(out) / "teacher" / "eval" / f"step_{args.teacher_steps:06d}.json").read_text()
        )
        teacher_accuracy = last["accuracy"]
    arms = {}
    for arm in ("grpo", "distill"):
        runs = [read_run(run_train(arm_args(arm, s, teacher, args, out), out)) for s in args.seeds]
        arms[arm] = summarise(runs)
        print(f"{arm}: {arms[arm]}", file=sys.stderr, flush=True)
    grpo, distill = arms["grpo"], arms["distill"]
    final_step = max(grpo["accuracy_mean"])
    target = grpo["accuracy_mean"][final_step]
    reach = {
        "grpo_final": tokens_to_reach(grpo, distill, target),
        f"accuracy_{args.threshold}": tokens_to_reach(grpo, distill, args.threshold),
    }
    print(
        json.dumps(
            {
                "benchmark": "distill",
                "teacher": teacher,
                "teacher_accuracy": teacher_accuracy,
                "steps": {"grpo": args.steps, "distill": args.distill_steps},
                "distill": {
                    "group_size": args.distill_group_size,
                    "teacher_temperature": args.teacher_temperature,
                    "estimator": args.distill_estimator,
                    "reward_weight": args.distill_reward_weight,
                    "lr": args.distill_lr,
                    "schedule": args.distill_schedule,
                },
                "seeds": args.seeds,
                "arms": arms,
                "grpo_final_accuracy": target,
                "reach": reach,
                "token_ratio": reach["grpo_final"]["token_ratio"],
                "out": out,
            }
        )
    )


def tokens_to_reach(grpo: dict, distill: dict, accuracy: float) -> dict:
    """The generated tokens each arm's mean accuracy first reached ``accuracy`` at (an
    eval step after 0), and GRPO's over distillation's."""

    def first(arm: dict) -> tuple[int | None, int | None]:
        steps = [s for s, a in arm["accuracy_mean"].items() if s > 0 and a >= accuracy]
        return (steps[0], arm["tokens_mean"][steps[0]]) if steps else (None, None)

    (g_step, g_tokens), (d_step, d_tokens) = first(grpo), first(distill)
    ratio = round(g_tokens / d_tokens, 2) if g_tokens and d_tokens else None
    return {
        "accuracy": accuracy,
        "grpo_step": g_step,
        "grpo_tokens": g_tokens,
        "distill_step": d_step,
        "distill_tokens": d_tokens,
        "token_ratio": ratio,
    }


if __name__ == "__main__":
    main()
