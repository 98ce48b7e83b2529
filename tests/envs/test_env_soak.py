"""Hygiene under churn, small: scripts/env_soak.py with servers killed, clients that
vanish mid-episode and sessions left open leaks no session, sandbox, process or
scratch dir, and loses no episode (the full 10,000-episode soak: docs/env_service.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_leaks_nothing():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "env_soak.py"), "--episodes=120",
         "--kill-every=3", "--vanish-every=2", "--leave-open-th=10", "--idle-timeout-s=1",
         "--max-wall-s=300", f"--ports={free_port()},{free_port()}"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["episodes"] >= 120 and r["lost"] == 0 and r["other"] == 0
    assert r["server_kills"] >= 1 and r["client_vanished"] >= 1 and r["left_open"] >= 1
    assert r["infra"] >= 1  # the kills did hit episodes, which were retried
    leaks = ("sessions_left", "processes_left", "bwrap_left", "scratch_dirs_left")
    assert {k: r[k] for k in leaks} == dict.fromkeys(leaks, 0)
    assert r["sandboxes_beyond_warm_pools"] <= 0
