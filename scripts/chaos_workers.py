"""Chaos run for the process rollout backend (docs/workers.md).

Trains the tiny model twice with the same seed: once with the local backend,
once with 2 rollout worker processes while a thread sends a random worker
SIGKILL (or, one time in four, SIGSTOP) every 1-8 s (``--gap``), whatever it is doing:
generating, idle, starting, loading weights. Then it checks that every step
trained the same samples as the local run and prints the counts.

    .venv/bin/python scripts/chaos_workers.py --seed 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

from temper.backends.remote import RemoteBackend
from temper.cli.main import main


def _args(steps: int) -> list[str]:
    return [
        f"--orchestrator.steps={steps}",
        "--orchestrator.prompts_per_step=4",
        "--orchestrator.group_size=4",
        "--orchestrator.max_response_tokens=16",
        "--orchestrator.drop_zero_variance_groups=false",
        "--eval.at_start=false",
        "--eval.at_end=false",
        "--eval.every=0",
        "--log.progress=false",
        "--log.trajectories_per_step=16",
        "--checkpoint.at_end=false",
        "--trainer.lr=1e-3",
        "--run.seed=5",
        "--run.threads=1",
    ]


def _chaos(
    seed: int, gap: tuple[float, float], done: threading.Event, hits: list[tuple[str, int, int]]
) -> None:
    rng = random.Random(seed)
    while not done.is_set():
        live = RemoteBackend.live()
        if not live:
            time.sleep(0.1)
            continue
        time.sleep(rng.uniform(*gap))
        pool = live[0].pool
        pid = rng.choice(pool.pids())
        sig = signal.SIGSTOP if rng.random() < 0.25 else signal.SIGKILL
        busy = pool.in_flight().get(pid, 0)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        hits.append((sig.name, pid, busy))


def _samples(run: Path, step: int) -> list[tuple[str, list[int]]]:
    path = run / "trajectories" / f"step_{step:06d}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["task_id"], r["response_ids"]) for r in records]


def run_chaos(seed: int, steps: int, root: Path, gap: tuple[float, float] = (1.0, 8.0)) -> dict:
    def train(name: str, *extra: str) -> Path:
        code = main(
            ["train", f"--run.output_dir={root}", f"--run.name={name}", *_args(steps), *extra]
        )
        assert code == 0, f"{name} run failed"
        return root / name

    local = train("local")
    done, hits = threading.Event(), []
    thread = threading.Thread(target=_chaos, args=(seed, gap, done, hits), daemon=True)
    thread.start()
    started = time.perf_counter()
    try:
        chaos = train(
            "chaos",
            "--orchestrator.backend=process",
            "--orchestrator.rollout_workers=2",
            "--orchestrator.heartbeat_timeout_s=3",
            "--orchestrator.max_retries=20",
        )
    finally:
        done.set()
    wall = time.perf_counter() - started
    last = json.loads((chaos / "metrics.jsonl").read_text().splitlines()[-1])
    same = total = 0
    for step in range(1, steps + 1):
        want, got = _samples(local, step), _samples(chaos, step)
        total += len(want)
        same += sum(a == b for a, b in zip(want, got, strict=True))
    return {
        "signals": len(hits),
        "sigkill": sum(h[0] == "SIGKILL" for h in hits),
        "sigstop": sum(h[0] == "SIGSTOP" for h in hits),
        "hit_while_busy": sum(h[2] > 0 for h in hits),
        **{k: v for k, v in last.items() if k.startswith("workers/") and k != "workers/in_flight"},
        "samples_equal_to_local": f"{same}/{total}",
        "wall_s": round(wall, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2, help="seeds the chaos thread")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--gap", type=float, nargs=2, default=(1.0, 8.0), help="seconds between signals"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run_chaos(args.seed, args.steps, Path(tmp), tuple(args.gap))))
