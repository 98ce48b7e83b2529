"""Reward-model server throughput: dynamic batching vs one request at a time.

Serves the shipped tiny reward model (`tiny-rm`: Llama, hidden 128, 4 layers;
or ``--model PATH``) with `temper.serve.reward_model` in-process on
127.0.0.1, then has 64 concurrent asyncio+httpx clients (in a child process)
each send single-pair ``POST /score`` requests for a fixed time: once with
dynamic batching (max_batch_size 64, max_wait_ms 5) and once with
max_batch_size 1 (the same server, model, clients and texts). Then the same
load in process (coroutines calling the batcher, no HTTP). The texts are
held-out pairs of `temper.data.preferences` (prompt plus chosen or rejected
response), i.e. what the model was trained to score. Prints one JSON line with
the rates and ratios; torch runs one thread on the compute thread by default.

    .venv/bin/python benchmarks/rm_server.py [--seconds 6] [--clients 64] [--model tiny-rm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx

from temper import compute
from temper.rewards.rm_batcher import load_reward_model
from temper.rewards.rm_scoring import score_pairs
from temper.serve.reward_model import start_rm_server


def make_pairs(n: int) -> list[dict[str, str]]:
    """``n`` request bodies' pairs: held-out prompts with their chosen or rejected response."""
    from temper.data.preferences import make_pairs as preference_pairs

    out = []
    for i, p in enumerate(preference_pairs(n, heldout=True, seed=0)):
        out.append({"prompt": p.prompt, "response": p.chosen if i % 2 else p.rejected})
    return out


def drive_in_child(url: str, clients: int, seconds: float, pairs) -> tuple[int, float]:
    return asyncio.run(drive(url, clients, seconds, pairs))


async def drive(
    url: str, clients: int, seconds: float, pairs: list[dict[str, str]]
) -> tuple[int, float]:
    """``clients`` loops of single-pair requests for ``seconds``: (requests done, elapsed)."""
    # One AsyncClient (one keep-alive connection) per simulated client: a
    # single httpx pool shared by 64 connections spent about 10 ms of CPU per
    # request here (its pool bookkeeping grows with the connection count), so
    # the clients, not the server, set the rate.
    https = [httpx.AsyncClient(timeout=60) for _ in range(clients)]
    bodies = [json.dumps({"pairs": [p]}).encode() for p in pairs]
    headers = {"content-type": "application/json"}
    done = 0
    stop = 0.0

    async def client(i: int) -> None:
        nonlocal done
        k = i
        while time.monotonic() < stop:
            reply = await https[i].post(
                f"{url}/score", content=bodies[k % len(bodies)], headers=headers
            )
            reply.raise_for_status()
            done += 1
            k += clients

    try:
        # Warm up the connections and the model, then measure.
        await asyncio.gather(
            *(
                h.post(f"{url}/score", content=bodies[i], headers=headers)
                for i, h in enumerate(https)
            )
        )
        start = time.monotonic()
        stop = start + seconds
        await asyncio.gather(*(client(i) for i in range(clients)))
        return done, time.monotonic() - start
    finally:
        await asyncio.gather(*(h.aclose() for h in https))


def measure(loaded, clients: int, seconds: float, pairs, max_batch_size: int) -> dict:
    handle, batcher = start_rm_server(
        loaded, max_batch_size=max_batch_size, max_wait_ms=5.0, max_queue=4096
    )
    try:
        f0, s0 = batcher.forwards, batcher.scored
        # Clients run in a child process: in this one they would hold the GIL
        # the compute thread needs between torch ops.
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            done, elapsed = pool.apply(drive_in_child, (handle.url, clients, seconds, pairs))
        forwards = batcher.forwards - f0
        scored = batcher.scored - s0
    finally:
        handle.stop()
    return {"rps": done / elapsed, "mean_batch": scored / max(forwards, 1)}


def measure_in_process(loaded, clients: int, seconds: float, pairs, max_batch_size: int) -> float:
    """The same load without HTTP: ``clients`` coroutines calling the batcher directly."""
    from temper.rewards.rm_batcher import RewardModelBatcher

    async def go() -> float:
        batcher = RewardModelBatcher(*loaded, max_batch_size=max_batch_size, max_wait_ms=5.0)
        done = 0
        stop = time.monotonic() + seconds

        async def client(i: int) -> None:
            nonlocal done
            k = i
            while time.monotonic() < stop:
                pair = pairs[k % len(pairs)]
                await batcher.score([(pair["prompt"], pair["response"])])
                done += 1
                k += clients

        start = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.monotonic() - start
        await batcher.close()
        return done / elapsed

    return asyncio.run(go())


def forward_rate(loaded, pairs, batch_size: int, seconds: float) -> float:
    """Pairs/s of back-to-back `score_pairs` calls of ``batch_size`` on the compute thread.

    No server, queue or event loop: the ceiling that batching can reach.
    """
    texts = [(p["prompt"], p["response"]) for p in pairs]

    def loop() -> float:
        done, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            k = done % (len(texts) - batch_size)
            score_pairs(*loaded, texts[k : k + batch_size])
            done += batch_size
        return done / (time.monotonic() - start)

    return compute.run(loop)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--model", default="tiny-rm", help='reward model directory or "tiny-rm"')
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the compute thread")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    pairs = make_pairs(512)
    compute.set_threads(args.threads)
    loaded = load_reward_model(args.model)
    batched = measure(loaded, args.clients, args.seconds, pairs, 64)
    single = measure(loaded, args.clients, args.seconds, pairs, 1)
    local_batched = measure_in_process(loaded, args.clients, args.seconds, pairs, 64)
    local_single = measure_in_process(loaded, args.clients, args.seconds, pairs, 1)
    forward_64 = forward_rate(loaded, pairs, 64, args.seconds / 2)
    forward_1 = forward_rate(loaded, pairs, 1, args.seconds / 2)
    print(
        json.dumps(
            {
                "benchmark": "rm_server",
                "clients": args.clients,
                "seconds": args.seconds,
                "model": args.model,
                "batched_rps": round(batched["rps"], 1),
                "batched_mean_batch": round(batched["mean_batch"], 1),
                "unbatched_rps": round(single["rps"], 1),
                "ratio": round(batched["rps"] / single["rps"], 2),
                "in_process_batched_rps": round(local_batched, 1),
                "in_process_unbatched_rps": round(local_single, 1),
                "in_process_ratio": round(local_batched / local_single, 2),
                "forward_64_pairs_per_s": round(forward_64, 1),
                "forward_1_pairs_per_s": round(forward_1, 1),
                "forward_ratio": round(forward_64 / forward_1, 2),
                "torch_threads": compute.get_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
