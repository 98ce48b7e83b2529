"""Hygiene under churn: thousands of episodes against env servers that get killed, from
clients that vanish mid-episode and sessions left open; then count what leaked.

Servers are ``temper env-serve`` processes of a soak env whose first step runs a
snippet in a warm bubblewrap sandbox pool (so sandboxes and scratch dirs are at
stake too); server 0 is SIGKILLed every ``--kill-every`` seconds and started again on
its port. Client processes play episodes through `EnvFleet`/`RemoteEnv`, retrying
an infra failure up to 3 times; one client is SIGKILLed every ``--vanish-every``
seconds (its sessions are mid-episode) and replaced; every ``--leave-open-th``
episode never calls close (the idle reaper must end it). It plays at least
``--episodes``, and on until one client has been killed and one server kill has
failed an episode (which was retried), or ``--max-wall-s`` passed.

Afterwards (clients gone, one idle timeout and a reaper pass later), it checks:
sessions still open on the servers, sandboxes beyond the warm pools, then (servers
stopped) processes of the servers' sessions, bubblewrap processes and scratch dirs
left, and the RSS growth of the server never killed. Prints one JSON line; exits 1
if anything leaked.

    .venv/bin/python scripts/env_soak.py [--episodes 10000] [--servers 2] [--clients 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOAK_ENV = f"{Path(__file__).resolve()}:soak_spec"
POOL_SIZE = 2
FIELDS = ("done", "left_open", "infra", "other", "lost")


# ---------------------------------------------------------------- the env served


def soak_spec(options: dict[str, Any], seed: int) -> Any:
    """Two steps; the first runs ``print(1)`` in the server's warm sandbox pool."""
    from temper.envs.base import StepResult
    from temper.envs.registry import EnvSpec
    from temper.records import Task
    from temper.sandbox import SandboxPool

    box: list[Any] = []

    class SoakEnv:
        tools: list[Any] = []  # noqa: RUF012 (read-only)

        def __init__(self) -> None:
            self.turn = 0

        async def reset(self, task: Any, seed: int | None = None) -> list[dict[str, Any]]:
            return [{"role": "user", "content": f"soak {task.id}"}]

        async def step(self, turn: Any) -> StepResult:
            self.turn += 1
            text = "ok"
            if self.turn == 1:
                if not box:
                    box.append(SandboxPool(pool_size=POOL_SIZE, allow_fallback=False))
                text = (await box[0].arun_python("print(1)")).stdout.strip()
            return StepResult([{"role": "user", "content": text}], 1.0, self.turn >= 2)

        async def close(self) -> None:
            return None

    def close() -> None:
        for pool in box:
            pool.close()

    return EnvSpec(make_env=lambda task: SoakEnv(), heldout=[Task("soak", "p")], close=close)


# ---------------------------------------------------------------- servers


class Server:
    def __init__(self, port: int, idle_s: float) -> None:
        self.port, self.idle_s = port, idle_s
        self.proc: subprocess.Popen | None = None
        self.pids: set[int] = set()  # every incarnation's
        self.start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "temper", "env-serve", f"--port={self.port}",
               f"--env.type={SOAK_ENV}", f"--idle-timeout-s={self.idle_s}", "--lifetime-s=120"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     start_new_session=True)  # fmt: skip
        self.pids.add(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the server's whole session (bwrap included) and wait until it is gone."""
        assert self.proc is not None
        with_session(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 30
        while session_pids(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def get(self, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return None

    def sessions(self) -> int:
        text = self.get("/metrics") or ""
        return next((int(line.split()[1]) for line in text.splitlines()
                     if line.startswith("temper_env_sessions ")), -1)  # fmt: skip

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] not in ("Z", "X") and int(stat[3]) == sid:
            found.append(int(entry.name))
    return found


def with_session(sid: int, sig: int) -> None:
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def bwrap_sandboxes(owners: set[int]) -> int:
    """Running sandboxes of the soak's own servers (any incarnation): bwrap processes
    whose parent is not bwrap (each sandbox is two) and whose scratch or /etc dir is
    named by one of ``owners``; another run's sandboxes on the machine are not counted."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if "(bwrap)" not in stat or "(bwrap)" in Path(f"/proc/{parent}/stat").read_text():
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if any(f"temper-sandbox-{pid}-" in argv or f"temper-sandbox-etc-{pid}-" in argv
               for pid in owners):  # fmt: skip
            count += 1
    return count


def scratch_dirs(owners: set[int] | None = None) -> list[str]:
    """Sandbox scratch and /etc dirs; with ``owners``, only those these pids made (each
    is named by its process), so another program's sandboxes meanwhile do not count."""
    roots = [tempfile.gettempdir(), "/dev/shm"]
    found = [os.path.join(r, n) for r in roots if os.path.isdir(r)
             for n in os.listdir(r) if n.startswith("temper-sandbox-")]  # fmt: skip
    if owners is None:
        return found
    named = ((d, re.match(r"temper-sandbox-(?:etc-)?(\d+)-", os.path.basename(d))) for d in found)
    return [d for d, m in named if m is not None and int(m.group(1)) in owners]


# ---------------------------------------------------------------- clients


def client(slot: int, urls: list[str], counters: Any, concurrency: int, leave_open_th: int) -> None:
    from temper.envs.base import AssistantTurn
    from temper.envs.service.client import EnvFleet, RemoteEnv
    from temper.envs.service.messages import env_fingerprint
    from temper.errors import InfraError
    from temper.records import Task

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    base = slot * len(FIELDS)

    def count(field: str) -> None:
        counters[base + FIELDS.index(field)] += 1

    async def episode(fleet: EnvFleet, k: int) -> None:
        task = Task(f"soak-{slot}-{k}", "p")
        for _ in range(4):
            env = RemoteEnv(fleet)
            try:
                await env.reset(task, k)
                done = False
                while not done:
                    done = (await env.step(AssistantTurn("go", []))).done
            except InfraError:
                count("infra")
                await env.close()
                continue
            except Exception:
                count("other")
                await env.close()
                return
            if k % leave_open_th == 0:
                env.session = None  # forget it: the server's reaper must end it
                count("left_open")
            else:
                count("done")
            await env.close()
            return
        count("lost")

    async def main() -> None:
        fleet = EnvFleet(urls, env_fingerprint(SOAK_ENV, {}), call_timeout_s=30, down_for_s=1)
        gate = asyncio.Semaphore(concurrency)
        k = 0
        running: set[asyncio.Task] = set()
        while True:
            await gate.acquire()
            k += 1
            t = asyncio.create_task(episode(fleet, k))
            running.add(t)
            t.add_done_callback(lambda t: (running.discard(t), gate.release()))

    asyncio.run(main())


# ---------------------------------------------------------------- the soak


def free_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def wait_healthy(servers: list[Server], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while any(s.get("/health") is None for s in servers):
        if time.monotonic() > deadline:
            raise TimeoutError("servers not healthy")
        time.sleep(0.2)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32, help="episodes in flight per client")
    p.add_argument("--kill-every", type=float, default=10.0, help="seconds between server kills")
    p.add_argument("--vanish-every", type=float, default=4.0, help="seconds between client kills")
    p.add_argument("--leave-open-th", type=int, default=50, help="every Nth episode not closed")
    p.add_argument("--idle-timeout-s", type=float, default=3.0)
    p.add_argument(
        "--ports",
        type=lambda text: [int(x) for x in text.split(",")],
        help="the servers' ports, comma-separated (default: free ones; a killed server "
        "comes back on its own port)",
    )
    p.add_argument(
        "--max-wall-s", type=float, default=3600.0, help="stop waiting for the episodes and churn"
    )
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dirs_before = set(scratch_dirs())  # another run's are not this soak's to count
    ctx = mp.get_context("spawn")
    counters = ctx.RawArray("d", 64 * len(FIELDS))  # one slot per client process ever started
    ports = args.ports or free_ports(args.servers)
    if len(ports) != args.servers:
        p.error(f"--ports gives {len(ports)} ports for --servers={args.servers}")
    servers = [Server(port, args.idle_timeout_s) for port in ports]
    clients: list[Any] = []
    survivor = servers[-1]
    events = {"server_kills": 0, "client_vanished": 0}
    rss: list[float] = []
    t0 = time.monotonic()
    try:
        wait_healthy(servers)
        urls = [s.url for s in servers]

        def spawn(slot: int) -> Any:
            proc = ctx.Process(target=client, args=(slot, urls, counters, args.concurrency,
                                                    args.leave_open_th), daemon=True)  # fmt: skip
            proc.start()
            return proc

        clients = [spawn(i) for i in range(args.clients)]
        next_slot = args.clients
        last_kill = last_vanish = time.monotonic()

        def total(field: str) -> int:
            return int(sum(counters[i * len(FIELDS) + FIELDS.index(field)] for i in range(64)))

        def churned() -> bool:  # at least one of each event, however fast the episodes
            # A kill counts once a client saw it (an infra failure, retried): a kill
            # between two checks may otherwise land before any client noticed it.
            killed = args.servers < 2 or (events["server_kills"] > 0 and total("infra") > 0)
            return killed and events["client_vanished"] > 0

        while total("done") + total("left_open") < args.episodes or not churned():
            time.sleep(0.2)
            now = time.monotonic()
            if now - t0 > args.max_wall_s:
                print(f"env_soak: no churn seen in {args.max_wall_s:g}s", file=sys.stderr)
                break
            if not rss and total("done") > args.episodes // 5:
                rss.append(survivor.rss_mb())  # after warm-up
            if args.servers > 1 and now - last_kill > args.kill_every:
                servers[0].kill()
                servers[0].start()
                events["server_kills"] += 1
                last_kill = now
            if now - last_vanish > args.vanish_every and next_slot < 64:
                victim = clients.pop(0)
                os.kill(victim.pid, signal.SIGKILL)
                victim.join()
                clients.append(spawn(next_slot))
                next_slot += 1
                events["client_vanished"] += 1
                last_vanish = now
        wall = time.monotonic() - t0
        for proc in clients:
            proc.terminate()
        for proc in clients:
            proc.join(timeout=30)
        wait_healthy(servers)  # a server killed last must be back to be counted
        time.sleep(args.idle_timeout_s * 2 + 1)  # an idle timeout and a reaper pass
        rss.append(survivor.rss_mb())
        sessions_left = sum(max(0, s.sessions()) for s in servers)
        owners = {pid for s in servers for pid in s.pids}
        sandboxes_beyond_pools = bwrap_sandboxes(owners) - POOL_SIZE * len(servers)
        counts = {f: total(f) for f in FIELDS}
    finally:
        for proc in clients:
            if proc.is_alive():
                proc.kill()
        sids = [s.proc.pid for s in servers if s.proc is not None]
        for s in servers:
            s.stop()
    time.sleep(1)
    processes_left = sum(len(session_pids(sid)) for sid in sids)
    dirs = sorted(set(scratch_dirs({pid for s in servers for pid in s.pids})) - dirs_before)
    result = {
        "script": "env_soak",
        "episodes": counts["done"] + counts["left_open"],
        **counts,
        **events,
        "wall_s": round(wall, 1),
        "sessions_left": sessions_left,
        "sandboxes_beyond_warm_pools": sandboxes_beyond_pools,
        "processes_left": processes_left,
        "bwrap_left": bwrap_sandboxes({pid for s in servers for pid in s.pids}),
        "scratch_dirs_left": len(dirs),
        "survivor_rss_mb": [round(x, 1) for x in rss],
        "survivor_rss_growth_mb": round(rss[-1] - rss[0], 1) if len(rss) == 2 else None,
    }
    print(json.dumps(result), flush=True)
    leaked = (sessions_left, max(0, sandboxes_beyond_pools), processes_left,
              result["bwrap_left"], len(dirs), counts["lost"])  # fmt: skip
    return 1 if any(leaked) else 0


if __name__ == "__main__":
    sys.exit(main())
