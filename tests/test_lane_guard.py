"""The in-process lane's guard (tests/conftest.py): under TEMPER_TEST_LANE=in-process a
test that opens a TCP socket fails with a message naming the Makefile list; a Unix
socket and the same test outside the lane pass."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = """
import socket

def test_tcp():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))

def test_unix():
    a, b = socket.socketpair()
    a.close(); b.close()
"""


def _run(tmp_path: Path, lane: str | None) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_sockets.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "TEMPER_TEST_LANE"}
    if lane:
        env["TEMPER_TEST_LANE"] = lane
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip


def test_a_tcp_socket_fails_in_the_in_process_lane_only(tmp_path):
    inside = _run(tmp_path, "in-process")
    assert inside.returncode == 1, inside.stdout
    assert "1 failed, 1 passed" in inside.stdout
    assert "take its file out of IN_PROCESS_TESTS" in inside.stdout
    outside = _run(tmp_path, None)
    assert outside.returncode == 0 and "2 passed" in outside.stdout, outside.stdout
