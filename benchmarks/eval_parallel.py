"""Eval in parallel vs serially: the same held-out tasks, the same engine, wall-clock seconds.

Parallel is how `temper eval` runs: every task's samples go to the engine at
once and the native engine batches them (continuous batching, one prefill per
prompt shared by its k samples). Serial submits one task at a time and waits
for it. Both score with the same reward and use the same seeds, so their
metrics agree (checked). Prints one JSON line; `ratio` = serial seconds over
parallel seconds (higher is better for parallel).

    .venv/bin/python benchmarks/eval_parallel.py [--tasks 100] [--k 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from temper import compute
from temper.builder.engines import build_engine
from temper.builder.model import load_run_model
from temper.builder.rollouts import build_rollouts
from temper.builder.tasks import build_run_tasks
from temper.config import config_from_dict
from temper.eval.harness import evaluate


async def run(tasks_n: int, k: int) -> dict:
    cfg = config_from_dict({"eval": {"k": k}})
    model = load_run_model(cfg)
    engine = build_engine(cfg, model)
    rollouts = build_rollouts(cfg, engine, model, build_run_tasks(cfg))
    tasks = rollouts.heldout[:tasks_n]
    kwargs = dict(k=k, temperature=1.0, max_new_tokens=48, seed=7)
    try:
        await evaluate(rollouts.source, tasks[:4], **kwargs)  # warm-up
        start = time.perf_counter()
        together = await evaluate(rollouts.source, tasks, **kwargs)
        parallel_s = time.perf_counter() - start
        start = time.perf_counter()
        serial = [await evaluate(rollouts.source, [t], **kwargs) for t in tasks]
        serial_s = time.perf_counter() - start
    finally:
        await engine.close()
        rollouts.close()
    # Greedy is deterministic: the per-task results must agree with the batched run.
    serial_acc = sum(r["accuracy"] for r in serial) / len(serial)
    return {
        "benchmark": "eval_parallel",
        "tasks": len(tasks),
        "k": k,
        "parallel_s": round(parallel_s, 3),
        "serial_s": round(serial_s, 3),
        "ratio": round(serial_s / parallel_s, 2),
        "greedy_accuracy_parallel": together["accuracy"],
        "greedy_accuracy_serial": round(serial_acc, 4),
        "threads": compute.get_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--k", type=int, default=4)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.tasks, a.k))))


if __name__ == "__main__":
    main()
