"""`temper serve-rm tiny-rm` serves the shipped reward model: same scores as in process."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from ports import free_port
from temper import compute
from temper.data.preferences import make_pairs
from temper.rewards.rm_batcher import load_reward_model
from temper.rewards.rm_scoring import score_pairs


def _wait_for(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
            return
        except httpx.TransportError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "serve-rm did not come up"
            time.sleep(0.2)


def test_cli_serves_tiny_rm_with_in_process_scores() -> None:
    heldout = make_pairs(24, heldout=True, seed=0)
    pairs = [(p.prompt, r) for p in heldout for r in (p.chosen, p.rejected)]
    model, tok = load_reward_model("tiny-rm")
    expected = compute.run(score_pairs, model, tok, pairs)

    port = free_port()
    cmd = [sys.executable, "-m", "temper.cli.main", "serve-rm", "tiny-rm", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url, proc)
        body = {"pairs": [{"prompt": p, "response": r} for p, r in pairs]}
        reply = httpx.post(f"{url}/score", json=body, timeout=60)
        assert reply.status_code == 200
        scores = reply.json()["scores"]
        health = httpx.get(f"{url}/health", timeout=5).json()
    finally:
        proc.terminate()
        proc.wait(20)
    assert scores == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert health["model"] == "tiny-rm" and health["scored"] == len(pairs)
    # The served model prefers the chosen response on most held-out pairs (a
    # 24-pair slice is noisy; tests/models/test_tiny_rm.py checks the rate).
    wins = sum(scores[i] > scores[i + 1] for i in range(0, len(scores), 2))
    assert wins >= 0.75 * len(heldout)
