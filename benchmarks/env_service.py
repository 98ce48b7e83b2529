"""Env servers under load: Temper's ``temper env-serve`` against OpenEnv's own server.

The same env on both: the echo env of ``openenv init``'s template (OpenEnv's code, run
by openenv-core's ``create_app`` under uvicorn) and the same env written for Temper
(benchmarks/env_service_envs.py), then a sleep-bound variant (every step is a 1 s
tool) and a CPU-bound one (every step runs a Python snippet in a warm bubblewrap
sandbox). The same client load drives both, from 2 client processes on this
machine: Temper's clients multiplex their sessions over one connection each (its
protocol); OpenEnv's hold one WebSocket per session (its protocol), sending the JSON
messages its own client sends.

Measured:
- ``wire_overhead_ms``: one session, steps in a row: median step over the wire minus
  the median of the same env's step called in process (echo).
- ``echo``: steps/s, P50/P99 step latency, with ``--sessions`` sessions stepping for
  ``--seconds``; ``steps_per_s_over_openenv`` is Temper's steps/s over OpenEnv's.
- ``sleep``: at each of ``--ramp`` concurrent sessions, every session opens, takes 2
  steps of the 1 s tool and closes; ``sessions_at_full_success`` is the largest count
  at which every step of every session succeeded (per server).
- ``cpu``: steps/s of the sandboxed snippet; Temper also with 2 server processes
  (``fleet_2_over_1``: throughput of two servers over one, at the same load).

    .venv/bin/python benchmarks/env_service.py [--seconds 8] [--sessions 64]
        [--ramp 256,512,1024,2048,4096] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---------------------------------------------------------------- servers


def wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"server on {port} not healthy")


def start_temper(
    kind: str, workers: int = 1, core: int | None = None, options: str | None = None
) -> tuple[subprocess.Popen, list[str]]:
    """``temper env-serve`` of env ``kind``; pinned to CPU ``core`` (its sandboxes too)."""
    port = free_port() if workers == 1 else free_port_block(workers)
    cmd = [
        sys.executable, "-m", "temper", "env-serve", f"--port={port}", f"--workers={workers}",
        f"--env.type={HERE / 'env_service_envs.py'}:{kind}_spec", "--max-sessions=65536",
        "--max-opens-per-s=100000",
    ]  # fmt: skip
    if options:
        cmd.append(f"--env.options={options}")
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    for i in range(workers):
        wait_healthy(port + i, proc)
    return proc, [f"ws://127.0.0.1:{port + i}/v1" for i in range(workers)]


def free_port_block(n: int) -> int:
    while True:
        base = free_port()
        try:
            for i in range(n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue


def start_openenv(kind: str, template: str) -> tuple[subprocess.Popen, list[str]]:
    port = free_port()
    cmd = [sys.executable, str(HERE / "openenv_server.py"), f"--template={template}",
           f"--kind={kind}", f"--port={port}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    wait_healthy(port, proc)
    return proc, [f"ws://127.0.0.1:{port}/ws"]


def stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def make_template(root: str) -> str:
    openenv = Path(sys.executable).with_name("openenv")
    subprocess.run([str(openenv), "init", "echo_env", "-o", root], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return root


# ---------------------------------------------------------------- clients


class TemperSessions:
    """Sessions over one multiplexed connection per server (Temper's client)."""

    def __init__(self, urls: list[str]) -> None:
        from temper.wire.client import WireClient

        self.clients = [WireClient(u, connect_timeout_s=120) for u in urls]
        self.n = 0

    async def start(self) -> None:
        from temper.envs.service.messages import PROTOCOL_VERSION

        for c in self.clients:
            await c.call("hello", timeout_s=120, version=PROTOCOL_VERSION)

    async def session(self, steps: int | None, until: float | None, lat: list, errs: list) -> bool:
        client = self.clients[self.n % len(self.clients)]
        self.n += 1
        turn = {"text": "hello", "token_ids": []}
        try:
            sid = (await client.call("open", timeout_s=120, task={"id": "t", "prompt": "p"}))[
                "session"
            ]
            k = 0
            while (steps is None or k < steps) and (until is None or time.monotonic() < until):
                t0 = time.perf_counter()
                await client.call("step", timeout_s=120, session=sid, turn=turn)
                lat.append(time.perf_counter() - t0)
                k += 1
            await client.call("close", timeout_s=120, session=sid)
            return True
        except Exception as exc:  # the benchmark counts failures, whatever they are
            errs.append(f"{type(exc).__name__}: {exc}"[:200])
            return False

    async def finish(self) -> None:
        for c in self.clients:
            await c.close()


class OpenEnvSessions:
    """One WebSocket per session, OpenEnv's JSON messages (what its EnvClient sends)."""

    def __init__(self, urls: list[str]) -> None:
        self.url = urls[0]

    async def start(self) -> None:
        return None

    async def session(self, steps: int | None, until: float | None, lat: list, errs: list) -> bool:
        from websockets.asyncio.client import connect

        try:
            async with connect(self.url, open_timeout=120, max_size=None) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                reply = json.loads(await ws.recv())
                if reply.get("type") == "error":
                    raise RuntimeError(reply["data"])
                k = 0
                step = json.dumps({"type": "step", "data": {"message": "hello"}})
                while (steps is None or k < steps) and (until is None or time.monotonic() < until):
                    t0 = time.perf_counter()
                    await ws.send(step)
                    reply = json.loads(await ws.recv())
                    if reply.get("type") == "error":
                        raise RuntimeError(reply["data"])
                    lat.append(time.perf_counter() - t0)
                    k += 1
                await ws.send(json.dumps({"type": "close"}))
            return True
        except Exception as exc:
            errs.append(f"{type(exc).__name__}: {exc}"[:200])
            return False

    async def finish(self) -> None:
        return None


def client_process(conn, kind: str, urls: list[str], sessions: int, steps, seconds) -> None:
    raise_fd_limit()

    async def go() -> dict:
        pool = TemperSessions(urls) if kind == "temper" else OpenEnvSessions(urls)
        await pool.start()
        lat: list[float] = []
        errs: list[str] = []
        until = time.monotonic() + seconds if seconds else None
        gate = asyncio.Semaphore(256)  # handshakes in flight, the same for both

        async def one() -> bool:
            async with gate:
                pass
            return await pool.session(steps, until, lat, errs)

        t0 = time.perf_counter()
        ok = await asyncio.gather(*(one() for _ in range(sessions)))
        wall = time.perf_counter() - t0
        await pool.finish()
        return {"lat": lat, "ok": sum(ok), "errors": errs[:3], "n_errors": len(errs), "wall": wall}

    conn.send(asyncio.run(go()))
    conn.close()


def drive(
    kind: str, urls: list[str], sessions: int, steps=None, seconds=None, procs: int = 2
) -> dict:
    ctx = mp.get_context("spawn")
    pipes, children = [], []
    for i in range(procs):
        share = sessions // procs + (i < sessions % procs)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=client_process, args=(child, kind, urls, share, steps, seconds))
        p.start()
        pipes.append(parent)
        children.append(p)
    results = [p.recv() for p in pipes]
    for c in children:
        c.join()
    lat = sorted(x for r in results for x in r["lat"])
    wall = max(r["wall"] for r in results)

    def q(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else float("nan")

    return {
        "sessions": sessions,
        "sessions_ok": sum(r["ok"] for r in results),
        "steps": len(lat),
        "steps_per_s": round(len(lat) / wall, 1),
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "errors": sum(r["n_errors"] for r in results),
        "first_error": next((e for r in results for e in r["errors"]), None),
    }


# ---------------------------------------------------------------- measurements


def in_process_step_ms(n: int = 2000) -> float:
    from env_service_envs import EchoEnv

    from temper.envs.base import AssistantTurn
    from temper.records import Task

    async def go() -> float:
        env = EchoEnv()
        await env.reset(Task("t", "p"))
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await env.step(AssistantTurn("hello", []))
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    return asyncio.run(go())


def run_pair(kind: str, template: str, label: str, fn) -> dict:
    out = {}
    for name, start in (("temper", lambda: start_temper(kind)),
                        ("openenv", lambda: start_openenv(kind, template))):  # fmt: skip
        proc, urls = start()
        try:
            out[name] = fn(name, urls)
        finally:
            stop(proc)
        print(f"[{label}] {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
    return out


def pinned_fleet(n: int, sessions: int, seconds: float) -> dict:
    """``n`` servers of the CPU-bound env, server i and its sandbox pool (1 warm) pinned
    to core i: does throughput grow with each server that adds a core?"""
    started = [start_temper("cpu", core=i, options="{pool_size=1}") for i in range(n)]
    try:
        result = drive("temper", [u for _, urls in started for u in urls], sessions,
                       seconds=seconds)  # fmt: skip
    finally:
        for proc, _ in started:
            stop(proc)
    print(f"[cpu pinned x{n}] temper: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--ramp", default="256,512,1024,2048,4096")
    p.add_argument("--quick", action="store_true", help="a smoke run: short, small")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.sessions, args.ramp = 2.0, 8, "16,64"
    raise_fd_limit()
    ramp = [int(x) for x in args.ramp.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        template = make_template(tmp)
        low = run_pair("echo", template, "low load",
                       lambda name, urls: drive(name, urls, 1, seconds=args.seconds, procs=1))  # fmt: skip
        local_ms = in_process_step_ms()
        echo = run_pair("echo", template, "echo",
                        lambda name, urls: drive(name, urls, args.sessions, seconds=args.seconds))  # fmt: skip

        def ramp_up(name: str, urls: list[str]) -> dict:
            levels = {}
            for n in ramp:
                levels[n] = drive(name, urls, n, steps=2)
                if levels[n]["errors"] or levels[n]["sessions_ok"] < n:
                    break
            full = [n for n, r in levels.items() if not r["errors"] and r["sessions_ok"] == n]
            return {"levels": levels, "sessions_at_full_success": max(full, default=0)}

        sleep = run_pair("sleep", template, "sleep", ramp_up)
        cpu_load = max(8, args.sessions // 4)
        cpu = run_pair("cpu", template, "cpu",
                       lambda name, urls: drive(name, urls, cpu_load, seconds=args.seconds))  # fmt: skip
        proc, urls = start_temper("cpu", workers=2)
        try:
            cpu2 = drive("temper", urls, cpu_load, seconds=args.seconds)
        finally:
            stop(proc)
        pinned = {n: pinned_fleet(n, cpu_load, args.seconds) for n in (1, 2)}
    t, o = echo["temper"], echo["openenv"]
    result = {
        "benchmark": "env_service",
        "steps_per_s_over_openenv": round(t["steps_per_s"] / o["steps_per_s"], 2),
        "sessions_at_full_success": sleep["temper"]["sessions_at_full_success"],
        "openenv_sessions_at_full_success": sleep["openenv"]["sessions_at_full_success"],
        "wire_overhead_ms": round(low["temper"]["p50_ms"] - local_ms, 3),
        "openenv_wire_overhead_ms": round(low["openenv"]["p50_ms"] - local_ms, 3),
        "cpu_steps_per_s_over_openenv": round(
            cpu["temper"]["steps_per_s"] / cpu["openenv"]["steps_per_s"], 2
        ),
        "fleet_2_over_1": round(cpu2["steps_per_s"] / cpu["temper"]["steps_per_s"], 2),
        "pinned_fleet_2_over_1": round(pinned[2]["steps_per_s"] / pinned[1]["steps_per_s"], 2),
        "sleep_steps_per_s_over_openenv_at_max": round(
            sleep["temper"]["levels"][ramp[-1]]["steps_per_s"]
            / sleep["openenv"]["levels"][ramp[-1]]["steps_per_s"],
            2,
        )
        if ramp[-1] in sleep["temper"]["levels"] and ramp[-1] in sleep["openenv"]["levels"]
        else None,
        "echo": echo,
        "sleep": {k: v["levels"] for k, v in sleep.items()},
        "cpu": {**cpu, "temper_2_servers": cpu2, "pinned": pinned},
        "low_load": low,
        "in_process_step_ms": round(local_ms, 4),
        "cores": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
