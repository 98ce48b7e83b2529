"""Warm sandbox claims at a fixed rate: the remote sandbox pool against the local one.

Kubernetes' agent-sandbox gates its CI on warm-sandbox claims of <= 300 ms P50 and
<= 500 ms P99 at 75 claims/s. Here a claim is what an episode waits for when it
needs a sandbox: a request arrives, a warm bubblewrap sandbox of the pool takes it
and runs a trivial snippet (``print(1)``), the result returns. Requests arrive
open-loop at ``--rate`` per second for ``--seconds`` (a late answer does not slow
the arrivals). Measured twice in one run, the same pool size and rate: through
``temper sandbox-serve`` (a separate process, over the wire: `RemoteSandbox`) and
in process (`SandboxPool.arun_python`, the baseline). Prints one JSON line.

    .venv/bin/python benchmarks/sandbox_claims.py [--rate 75] [--seconds 20] [--pool 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def open_loop(call, rate: float, seconds: float) -> dict:
    """Fire ``call()`` coroutines at ``rate``/s for ``seconds``; their latencies."""

    async def go() -> dict:
        latencies: list[float] = []
        failures = 0

        async def one() -> None:
            nonlocal failures
            t0 = time.perf_counter()
            try:
                result = await call()
                if result.stdout.strip() != "1":
                    failures += 1
            except Exception:
                failures += 1
            latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        jobs = []
        n = int(rate * seconds)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            jobs.append(asyncio.create_task(one()))
        await asyncio.gather(*jobs)
        lat = sorted(latencies)

        def q(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 1)

        return {"claims": n, "failures": failures, "p50_ms": q(0.5), "p99_ms": q(0.99),
                "max_ms": round(lat[-1] * 1000, 1)}  # fmt: skip

    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=75.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--pool", type=int, default=4)
    args = p.parse_args()
    from temper.sandbox import SandboxPool
    from temper.sandbox.service import RemoteSandbox

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "temper", "sandbox-serve", f"--port={port}",
           f"--pool-size={args.pool}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        remote = RemoteSandbox([f"ws://127.0.0.1:{port}/v1"])
        remote.run_python("print(1)")  # connect and greet before the clock starts
        over_wire = open_loop(lambda: remote.arun_python("print(1)"), args.rate, args.seconds)
        remote.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    with SandboxPool(pool_size=args.pool, allow_fallback=False) as pool:
        pool.run_python("print(1)")
        local = open_loop(lambda: pool.arun_python("print(1)"), args.rate, args.seconds)
    print(json.dumps({
        "benchmark": "sandbox_claims",
        "rate_per_s": args.rate,
        "pool_size": args.pool,
        "remote": over_wire,
        "local": local,
        "p50_ms_over_local": round(over_wire["p50_ms"] / local["p50_ms"], 2),
        "gate_p50_ms": 300,
        "gate_p99_ms": 500,
        "meets_gate": over_wire["p50_ms"] <= 300 and over_wire["p99_ms"] <= 500
        and over_wire["failures"] == 0,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
