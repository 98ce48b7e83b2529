"""Which transport for the env protocol: the numbers behind Temper's choice.

The same `EnvService` (the echo env of benchmarks/env_service_envs.py) behind four
transports, each server in a process of its own, driven by the same client load
(``--sessions`` sessions stepping for ``--seconds``, in one client process):

- ``ws_msgpack``: Temper's wire, msgpack frames over one multiplexed WebSocket;
- ``ws_json``: the same server and client with JSON text frames;
- ``ws_per_session``: msgpack, but one WebSocket per session (OpenEnv's layout);
- ``grpc_http2``: gRPC (HTTP/2 streams over one connection), msgpack bodies.

Also the codec alone: microseconds to encode and decode a step answer with msgpack
and with JSON. Prints one JSON line with ``steps_per_s_over`` (ws_msgpack's rate over
each other's).

    .venv/bin/python benchmarks/wire_transport.py [--seconds 6] [--sessions 64]
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
ECHO = f"{HERE / 'env_service_envs.py'}:echo_spec"
TURN = {"text": "hello", "token_ids": [1, 2, 3]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service() -> Any:
    from temper.builder.tasks import build_env_spec
    from temper.envs.service.messages import env_fingerprint
    from temper.envs.service.server import EnvService, ServiceLimits

    spec = build_env_spec(ECHO, {}, 0)
    return EnvService(spec, ECHO, env_fingerprint(ECHO, {}), ServiceLimits(max_sessions=65536))


# ---------------------------------------------------------------- servers (child processes)


def json_encode(frame: dict[str, Any]) -> str:
    return json.dumps(frame)


def json_decode(data: bytes | str) -> dict[str, Any]:
    return json.loads(data)


async def serve_wire(port: int, codec: str) -> None:
    """Temper's own `WireServer` of the echo env; ``codec`` "json": JSON text frames."""
    from temper.wire.server import WireServer

    server = WireServer(service(), "127.0.0.1", port)
    if codec == "json":
        server.encode, server.decode = json_encode, json_decode
    await server.start()
    await asyncio.Future()


async def serve_grpc(port: int) -> None:
    import grpc

    from temper.wire.codec import decode, encode

    svc = service()
    peer = svc.connected()

    async def call(request: bytes, context: Any) -> bytes:
        frame = decode(request)
        return encode({"ok": True, **await svc.call(peer, frame)})

    handler = grpc.method_handlers_generic_handler(
        "temper.Env", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def start(kind: str) -> tuple[subprocess.Popen, str]:
    """A server process for ``kind``; every WebSocket kind runs the same `WireServer`."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    served = "grpc_http2" if kind == "grpc_http2" else "ws_json" if kind == "ws_json" else "ws"
    cmd = [sys.executable, __file__, "--serve", served, "--port", str(port)]
    url = f"127.0.0.1:{port}" if kind == "grpc_http2" else f"ws://127.0.0.1:{port}/v1"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return proc, url
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{kind} server did not start")


# ---------------------------------------------------------------- clients


class GRPCClient:
    def __init__(self, target: str) -> None:
        self.target = target

    async def open(self) -> None:
        import grpc

        from temper.wire.codec import decode, encode

        self.channel = grpc.aio.insecure_channel(self.target)
        self.method = self.channel.unary_unary("/temper.Env/Call")
        self.encode, self.decode = encode, decode

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.decode(await self.method(self.encode({"op": op, **fields})))


class WireClientAdapter:
    def __init__(self, url: str, codec: str = "msgpack") -> None:
        self.url, self.codec = url, codec

    async def open(self) -> None:
        from temper.wire.client import WireClient

        self.client = WireClient(self.url)
        if self.codec == "json":
            self.client.encode, self.client.decode = json_encode, json_decode

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return await self.client.call(op, **fields)


async def drive(kind: str, url: str, sessions: int, seconds: float) -> dict[str, Any]:
    from temper.envs.service.messages import PROTOCOL_VERSION

    async def make() -> Any:
        if kind == "grpc_http2":
            client = GRPCClient(url)
        else:
            client = WireClientAdapter(url, "json" if kind == "ws_json" else "msgpack")
        await client.open()
        await client.call("hello", version=PROTOCOL_VERSION)
        return client

    shared = await make() if kind != "ws_per_session" else None
    latencies: list[float] = []
    until = time.monotonic() + seconds

    async def session() -> None:
        client = shared or await make()
        sid = (await client.call("open", task={"id": "t", "prompt": "p"}))["session"]
        while time.monotonic() < until:
            t0 = time.perf_counter()
            await client.call("step", session=sid, turn=TURN)
            latencies.append(time.perf_counter() - t0)
        await client.call("close", session=sid)

    t0 = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(sessions)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"steps_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 3),
            "p99_ms": round(lat[int(0.99 * len(lat))] * 1000, 3)}  # fmt: skip


def codec_us(n: int = 20000) -> dict[str, float]:
    from temper.wire.codec import decode, encode

    answer = {"id": 7, "ok": True, "observation": [{"role": "user", "content": "x" * 200}],
              "reward": 0.5, "done": False, "info": {"success": None}, "metrics": {"calls": 1.0}}  # fmt: skip
    out = {}
    for name, enc, dec in (("msgpack", encode, decode),
                           ("json", lambda f: json.dumps(f).encode(), json.loads)):  # fmt: skip
        t0 = time.perf_counter()
        for _ in range(n):
            dec(enc(answer))
        out[f"{name}_roundtrip_us"] = round((time.perf_counter() - t0) / n * 1e6, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--serve", choices=["ws", "ws_json", "grpc_http2"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        if args.serve == "grpc_http2":
            asyncio.run(serve_grpc(args.port))
        else:
            asyncio.run(serve_wire(args.port, "json" if args.serve == "ws_json" else "msgpack"))
        return
    results = {}
    for kind in ("ws_msgpack", "ws_json", "ws_per_session", "grpc_http2"):
        proc, url = start(kind)
        try:
            results[kind] = asyncio.run(drive(kind, url, args.sessions, args.seconds))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        print(f"[{kind}] {json.dumps(results[kind])}", file=sys.stderr, flush=True)
    base = results["ws_msgpack"]["steps_per_s"]
    print(json.dumps({
        "benchmark": "wire_transport",
        "sessions": args.sessions,
        "steps_per_s_over": {k: round(base / v["steps_per_s"], 2) for k, v in results.items()
                             if k != "ws_msgpack"},
        **results,
        **codec_us(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
