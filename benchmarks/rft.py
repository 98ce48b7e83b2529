"""Rejection-sampling fine-tuning (RFT) against GRPO at equal generated tokens.

Both runs train the built-in tiny model on the default arithmetic task from
the same seed, with the same prompts per step, samples per prompt, response
limit, learning rate and optimizer steps per step, one after the other in
this process. GRPO (``trainer.mode = "rl"``) updates on every informative
group; RFT (``trainer.mode = "rft"``) keeps up to ``--keep`` distinct correct
samples per prompt and takes a supervised step on them. Each run evaluates
the same held-out tasks (greedy accuracy) at the start and every
``--eval-every`` steps.

The comparison is at equal generated tokens: the budget is the smaller of the
two runs' total generated tokens, and each run's accuracy is read at its last
eval within that budget (rollout tokens only; eval tokens are not counted).

Prints one JSON line: the start accuracy, each run's accuracy at the budget
and at its end, their gains over the start, ``ratio`` (RFT's accuracy over
GRPO's at the budget), the tokens each generated, each run's curve of
(cumulative generated tokens, accuracy) at its evals, and seconds per step.

    nice -n 15 .venv/bin/python benchmarks/rft.py [--steps 16] [--prompts 8] [--group 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from temper.config import config_from_dict
from temper.orchestrator.loop import Orchestrator


def make_config(args: argparse.Namespace, out: str, mode: str) -> dict:
    return {
        "run": {"name": mode, "output_dir": out, "seed": args.seed, "threads": args.threads},
        "trainer": {"mode": mode, "lr": args.lr, "warmup_steps": 2, "packing": True},
        "orchestrator": {
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_response_tokens": 48,
        },
        "rft": {"keep": "correct", "max_per_prompt": args.keep},
        "eval": {"every": args.eval_every, "size": args.eval_size, "k": 1},
        "checkpoint": {"at_end": False},
        "log": {"progress": False, "trajectories_per_step": 0},
    }


async def train(cfg: dict) -> None:
    orch = Orchestrator(config_from_dict(cfg))
    try:
        await orch.run()
    finally:
        await orch.close()


def curve(run: Path) -> tuple[list[tuple[float, float]], list[float], float]:
    """(cumulative generated tokens, held-out accuracy) at each eval; tokens per step;
    mean seconds per step."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "tokens_generated" in r]
    tokens = [float(r["tokens_generated"]) for r in rows]
    cumulative = {0: 0.0}
    for r, t in zip(rows, tokens, strict=True):
        cumulative[r["step"]] = cumulative[r["step"] - 1] + t
    points = []
    for path in sorted((run / "eval").glob("step_*.json")):
        step = int(path.stem.removeprefix("step_"))
        points.append((cumulative[step], json.loads(path.read_text())["accuracy"]))
    seconds = sum(r["time_step_s"] for r in rows) / max(len(rows), 1)
    return points, tokens, seconds


def at_budget(points: list[tuple[float, float]], budget: float) -> float:
    """Accuracy at the last eval whose run had generated at most ``budget`` tokens."""
    return [acc for tokens, acc in points if tokens <= budget][-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--keep", type=int, default=2, help="RFT: correct samples kept per prompt")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    out = tempfile.mkdtemp(prefix="temper_rft_")
    result: dict = {"steps": args.steps, "prompts": args.prompts, "group": args.group}
    curves = {}
    for mode, name in (("rl", "grpo"), ("rft", "rft")):
        asyncio.run(train(make_config(args, out, mode)))
        curves[name] = curve(Path(out) / mode)
    budget = min(sum(tokens) for _, tokens, _ in curves.values())
    start = curves["rft"][0][0][1]
    result["start_accuracy"] = start
    result["token_budget"] = budget
    for name, (points, tokens, seconds) in curves.items():
        result[f"{name}_tokens"] = sum(tokens)
        result[f"{name}_accuracy_at_budget"] = at_budget(points, budget)
        result[f"{name}_accuracy_end"] = points[-1][1]
        result[f"{name}_gain_at_budget"] = round(at_budget(points, budget) - start, 4)
        result[f"{name}_curve"] = [[int(t), acc] for t, acc in points]
        result[f"{name}_s_per_step"] = round(seconds, 2)
    grpo = result["grpo_accuracy_at_budget"]
    result["ratio"] = round(result["rft_accuracy_at_budget"] / grpo, 4) if grpo else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
