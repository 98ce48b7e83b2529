"""Server memory stays bounded under large bodies and slow clients, measured.

Each server runs as `temper serve` / `temper serve-rm tiny-rm` in its own
process with the default limits (8 MiB bodies), so its peak resident memory
(VmHWM in /proc/PID/status) is its own. After a warm-up, the server gets: a
50 MB body (413 from its Content-Length), a 50 MB chunked body (413 once past
the limit), a body just under the limit holding one 8-million-character text
(`temper serve`: refused as too long for the context without tokenizing it;
`serve-rm`: scored, the text cut before tokenizing), and 100 half-sent
requests. The peak may grow by at most `GROWTH_MB` over the warm baseline;
before the limits, a 50 MB body took `temper serve` from 0.4 to 7 GB.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ports import free_port

GROWTH_MB = 200
BIG = 50_000_000


def _memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def _wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 600  # a generous cap: a loaded machine starts slowly
    while True:
        try:
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
            return
        except httpx.TransportError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)


def _half_sent(port: int, path: str, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        if i % 2:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n{{".encode()
            )
        else:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode())
        socks.append(sock)
    return socks


def _closed_by_server(sock: socket.socket) -> bool:
    with sock:
        while chunk := sock.recv(65536):
            del chunk
    return True


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "serve-rm"])
def test_peak_memory_stays_bounded(command: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    model = ["tiny-rm"] if command == "serve-rm" else []
    cmd = [sys.executable, "-m", "temper.cli.main", command, *model, "--port", str(port)]
    cmd += ["--header-timeout-s", "1", "--body-timeout-s", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if command == "serve":
        path = "/v1/chat/completions"

        def body(text: str) -> dict:
            return {
                "model": "tiny",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": text}],
            }
    else:
        path = "/score"

        def body(text: str) -> dict:
            return {"pairs": [{"prompt": text, "response": "ok"}]}

    try:
        _wait_up(url, proc)
        with httpx.Client(timeout=120) as http:
            for _ in range(3):  # warm up: allocator pools, first forward
                assert http.post(f"{url}{path}", json=body("What is 2+3?")).status_code == 200
            base = _memory_mb(proc.pid)

            def chunks():
                for _ in range(BIG // 2**20):
                    yield b"y" * 2**20

            for content in (b"x" * BIG, chunks()):  # declared length, then chunked
                assert _refused(http, f"{url}{path}", content)

            text = "word " * (8 * 2**20 // 5 - 40)  # the body is just under 8 MiB
            raw = json.dumps(body(text)).encode()
            assert len(raw) < 8 * 2**20
            near = http.post(f"{url}{path}", content=raw)
            if command == "serve":
                assert near.status_code == 400
                assert near.json()["error"]["code"] == "context_length_exceeded"
            else:
                assert near.status_code == 200 and len(near.json()["scores"]) == 1

        socks = _half_sent(port, path, 100)
        assert all(_closed_by_server(s) for s in socks)
        peak = _memory_mb(proc.pid)
        assert http_ok(url, path, body("What is 2+3?"))
    finally:
        proc.terminate()
        proc.wait(30)
    growth = peak["VmHWM"] - base["VmHWM"]
    print(
        f"{command}: warm peak RSS {base['VmHWM']:.0f} MiB, after the hostile requests "
        f"{peak['VmHWM']:.0f} MiB (+{growth:.0f})"
    )
    assert growth < GROWTH_MB, f"peak RSS grew by {growth:.0f} MiB (base {base})"


def http_ok(url: str, path: str, payload: dict) -> bool:
    return httpx.post(f"{url}{path}", json=payload, timeout=60).status_code == 200


def _refused(http: httpx.Client, url: str, content) -> bool:
    """An oversized body is refused with a 413 the client gets to read, even while it
    is still sending (the server lingers on close; `temper.serve.limits`)."""
    return http.post(url, content=content).status_code == 413
