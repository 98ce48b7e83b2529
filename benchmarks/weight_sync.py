"""Weight sync: each WeightTransport's publish + receive vs a plain copy.

A state dict of about 100M float32 parameters (4 tensors of 25M) is published
and received by each transport; the baseline is `Tensor.copy_` of the same
bytes into preallocated tensors (a warm in-memory copy, the lower bound).
Shared memory is timed with and without checksum verification (the writer
always computes checksums), and as a ring of reused slots (`shm_ring`:
double-buffered, no checksums). Safetensors files go to a directory on /dev/shm
so disk speed does not enter. `broadcast` sends over a gloo process group to a
spawned receiver process that writes into its preallocated tensors; the time
is one `publish`, which returns once the receiver has acknowledged the version.
Prints one JSON line: median seconds over `--reps` and each transport's ratio
to the copy (goal: shared memory <= 2x).

    .venv/bin/python benchmarks/weight_sync.py [--params 100_000_000] [--reps 3]

``--sharded`` measures the sharded trainer's weight sync instead: a random
Llama of about 134M parameters (``--hidden``, ``--layers``) on two FSDP2 ranks
(gloo), synced to the run's CPU copy once by gathering the whole state dict on
rank 0 and sending it through a pipe (``trainer.weight_sync_bucket_mb = 0``,
the old way) and once streamed in buckets (64 MiB, `temper.trainer.weight_stream`).
A thread samples each process's ``/proc/<pid>/status`` every 2 ms during the
sync: the peak growth of private memory (RssAnon) and of shared memory
(RssShmem) per rank and in the run's process. Prints one JSON line with rank
0's peak private growth, gather / stream.

    .venv/bin/python benchmarks/weight_sync.py --sharded
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from temper.weights import (
    BroadcastTransport,
    InProcessTransport,
    SafetensorsFileTransport,
    SharedMemoryTransport,
)
from temper.weights.shm_ring import SharedMemoryRingTransport


def _init_group(rank: int, port: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
    )


def _receiver(port: int, shapes: dict[str, tuple[int, ...]], rounds: int) -> None:
    """Rank 1: receive `rounds` versions into preallocated tensors."""
    torch.set_num_threads(1)
    _init_group(1, port)
    own = {k: torch.empty(s) for k, s in shapes.items()}
    transport = BroadcastTransport()
    for _ in range(rounds):
        transport.receive(into=own)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss(pid: int) -> dict[str, int]:
    """RssAnon and RssShmem of ``pid`` in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("RssAnon", "RssShmem"):
            out[key] = int(line.split()[1]) * 1024
    return out


def _peak_growth(pids: dict[str, int], action) -> tuple[dict, float]:
    """Run ``action`` while sampling ``pids``; each one's peak growth over its start (MiB)."""
    start = {name: _rss(pid) for name, pid in pids.items()}
    peak = {name: dict(v) for name, v in start.items()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for name, pid in pids.items():
                for key, value in _rss(pid).items():
                    peak[name][key] = max(peak[name][key], value)
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    action()
    seconds = time.perf_counter() - t0
    stop.set()
    thread.join()
    growth = {
        name: {k: round((peak[name][k] - start[name][k]) / 2**20, 1) for k in start[name]}
        for name in pids
    }
    return growth, seconds


def _sync_once(trainer) -> None:
    """One weight sync, as after a training step: the ranks send, the run adopts."""
    trainer._adopt(trainer._request("sync_weights")[0]["weights"])


def sharded_sync(args: argparse.Namespace) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from temper.config.algo import AlgoConfig
    from temper.config.trainer import TrainerConfig
    from temper.models import load_model
    from temper.trainer.distributed import DistributedTrainer

    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3, num_hidden_layers=args.layers,
        num_attention_heads=12, num_key_value_heads=12, vocab_size=32000, tie_word_embeddings=False,
    )  # fmt: skip
    directory = tempfile.mkdtemp(prefix="temper-bench-model-")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    params = sum(p.numel() for p in load_model(directory).parameters())
    out: dict = {"benchmark": "weight_sync_sharded", "params": params, "world_size": 2}
    try:
        for name, bucket_mb in (("gather_and_pipe", 0.0), ("stream", 64.0)):
            cfg = TrainerConfig(world_size=2, weight_sync_bucket_mb=bucket_mb)
            trainer = DistributedTrainer(load_model(directory), directory, cfg, AlgoConfig(), 1, 0)
            try:
                pids = {
                    "run": os.getpid(),
                    **{f"rank{r}": p.pid for r, p in enumerate(trainer._procs)},
                }

                sync = functools.partial(_sync_once, trainer)
                sync()  # warm: first-touch of buffers and shared memory
                growth, seconds = _peak_growth(pids, sync)
                out[name] = {"seconds": round(seconds, 3), "peak_growth_mib": growth}
            finally:
                trainer.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    full_mib = params * 4 / 2**20
    g = out["gather_and_pipe"]["peak_growth_mib"]["rank0"]["RssAnon"]
    st = out["stream"]["peak_growth_mib"]["rank0"]["RssAnon"]
    out["model_mib"] = round(full_mib, 1)
    out["ratio_rank0_private_growth_gather_vs_stream"] = round(g / max(st, 1.0), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sharded", action="store_true", help="the sharded trainer's sync")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    if args.sharded:
        print(json.dumps(sharded_sync(args)))
        return
    n = args.params // args.tensors
    state = {f"layer{i}.weight": torch.randn(n) for i in range(args.tensors)}
    dest = {k: torch.empty_like(v) for k, v in state.items()}

    def copy_baseline(version: int) -> None:
        for k, v in state.items():
            dest[k].copy_(v)

    def run(transport):
        def step(version: int) -> None:
            transport.publish(state, version)
            got, v = transport.receive()
            assert v == version
            for t in got.values():  # make sure the data is really there
                t[-1].item()

        return step

    port = _free_port()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    receiver = tmp.get_context("spawn").Process(
        target=_receiver, args=(port, shapes, args.reps + 1)
    )
    receiver.start()
    _init_group(0, port)
    bcast = BroadcastTransport()

    def broadcast(version: int) -> None:
        bcast.publish(state, version)

    shm_v = SharedMemoryTransport.create(f"bench-{uuid.uuid4().hex[:8]}", keep=1)
    shm_nv = SharedMemoryTransport.create(f"bench-{uuid.uuid4().hex[:8]}", keep=1, verify=False)
    ring = SharedMemoryRingTransport.create(f"bench-{uuid.uuid4().hex[:8]}")
    st_dir = tempfile.mkdtemp(dir="/dev/shm", prefix="temper-bench-st-")
    cases = {
        "copy": copy_baseline,
        "inprocess": run(InProcessTransport(keep=1)),
        "shm": run(shm_v),
        "shm_noverify": run(shm_nv),
        "shm_ring": run(ring),
        "safetensors": run(SafetensorsFileTransport(st_dir, keep=1)),
        "broadcast": broadcast,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for rep in range(args.reps + 1):  # rep 0 warms up
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn(rep + 1)
                dt = time.perf_counter() - t0
                if rep > 0:
                    times[name].append(dt)
    finally:
        shm_v.destroy()
        shm_nv.destroy()
        ring.destroy()
        receiver.join(timeout=60)
        dist.destroy_process_group()
        shutil.rmtree(st_dir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "params": n * args.tensors,
        "bytes": n * args.tensors * 4,
        "reps": args.reps,
        "seconds": {k: round(v, 4) for k, v in med.items()},
        "ratio_vs_copy": {k: round(v / med["copy"], 2) for k, v in med.items() if k != "copy"},
        "shm_goal_le_2x": med["shm"] / med["copy"] <= 2.0,
        "shm_ring_goal_le_2x": med["shm_ring"] / med["copy"] <= 2.0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
