"""Reward-model server throughput: dynamic batching vs one request at a time.

Starts `temper.serve.reward_model` in-process on 127.0.0.1 with a small random
reward model (Llama, hidden 256, 4 layers, saved to a temp dir), then has 64
concurrent asyncio+httpx clients each send single-pair ``POST /score``
requests for a fixed time (the clients run in a child process), once with dynamic batching (max_batch_size 64,
max_wait_ms 5) and once with max_batch_size 1; then the same load in process
(coroutines calling the batcher, no HTTP). Prints one JSON line with the rates
and ratios. Texts are short (the built-in tokenizer is nearly character-level,
so long texts make every forward compute-bound on CPU, where batching gains
little); torch runs one thread on the compute thread by default.

    .venv/bin/python benchmarks/rm_server.py [--seconds 6] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx
import torch

from temper import compute
from temper.models import load_tokenizer
from temper.serve.reward_model import load_reward_model, start_rm_server

WORDS = ["the", "a", "model", "reward", "answer", "question", "good", "bad", "seven", "is", "to"]


def build_model(path: str, hidden: int = 256, layers: int = 4) -> None:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = load_tokenizer("tiny")
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)


def make_pairs(n: int) -> list[dict[str, str]]:
    rng = random.Random(0)
    words = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))  # noqa: E731
    return [
        {"prompt": words(rng.randint(2, 4)), "response": words(rng.randint(3, 8))} for _ in range(n)
    ]


def drive_in_child(url: str, clients: int, seconds: float, pairs) -> tuple[int, float]:
    return asyncio.run(drive(url, clients, seconds, pairs))


async def drive(url: str, clients: int, seconds: float, pairs: list[dict[str, str]]) -> int:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        stop = time.monotonic() + seconds
        done = 0

        async def client(i: int) -> None:
            nonlocal done
            k = i
            while time.monotonic() < stop:
                reply = await http.post(f"{url}/score", json={"pairs": [pairs[k % len(pairs)]]})
                reply.raise_for_status()
                done += 1
                k += clients

        # Warm up the connections and the model, then measure.
        await asyncio.gather(
            *(http.post(f"{url}/score", json={"pairs": [pairs[i]]}) for i in range(clients))
        )
        start = time.monotonic()
        stop = start + seconds
        await asyncio.gather(*(client(i) for i in range(clients)))
        return done, time.monotonic() - start


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
    from temper.serve.reward_model import RewardModelBatcher

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the compute thread")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    pairs = make_pairs(512)
    with tempfile.TemporaryDirectory() as tmp:
        compute.set_threads(args.threads)
        build_model(tmp, args.hidden, args.layers)
        loaded = load_reward_model(tmp)
    batched = measure(loaded, args.clients, args.seconds, pairs, 64)
    single = measure(loaded, args.clients, args.seconds, pairs, 1)
    local_batched = measure_in_process(loaded, args.clients, args.seconds, pairs, 64)
    local_single = measure_in_process(loaded, args.clients, args.seconds, pairs, 1)
    print(
        json.dumps(
            {
                "benchmark": "rm_server",
                "clients": args.clients,
                "seconds": args.seconds,
                "model": f"llama hidden={args.hidden} layers={args.layers} (random)",
                "batched_rps": round(batched["rps"], 1),
                "batched_mean_batch": round(batched["mean_batch"], 1),
                "unbatched_rps": round(single["rps"], 1),
                "ratio": round(batched["rps"] / single["rps"], 2),
                "in_process_batched_rps": round(local_batched, 1),
                "in_process_unbatched_rps": round(local_single, 1),
                "in_process_ratio": round(local_batched / local_single, 2),
                "torch_threads": compute.get_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
