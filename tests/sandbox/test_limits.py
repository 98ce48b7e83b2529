"""Resource limits and the wall-clock timeout: hostile snippets are stopped,
their whole process tree is gone afterwards, and the host stays usable. Each
test runs on the cold path and on the warm pool (limits from conftest.CONFIG:
3 s timeout, 256 MB address space, 32 processes, 64 KiB of output kept)."""

from __future__ import annotations

import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from temper.sandbox import Sandbox

from .conftest import CONFIG, bwrap_problem, host_pids_with, marker, wait_gone


def test_fork_bomb_is_contained(box):
    tag = f"forkbomb-{uuid.uuid4().hex}"
    code = f"""
# {tag}
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    start = time.monotonic()
    result = box.run([CONFIG.python, "-c", code])
    assert time.monotonic() - start < CONFIG.timeout_s + 30  # killed, not hung
    assert result.timed_out and result.exit_code is None
    assert wait_gone(tag) == []  # no bomb process survived anywhere on the host
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    assert box.run_python("print('ok')").stdout == "ok\n"


def test_memory_bomb_is_stopped(box):
    result = box.run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert result.memory_exceeded, result
    assert not result.timed_out
    assert result.exit_code == 1
    assert "MemoryError" in result.stderr


def test_infinite_loop_is_killed_with_its_children(box):
    sleeper = marker()
    code = f"""
import subprocess
subprocess.Popen(["sleep", "{sleeper}"], start_new_session=True)
print("spawned", flush=True)
while True:
    pass
"""
    start = time.monotonic()
    result = box.run_python(code)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "spawned\n"  # output before the kill is kept
    assert CONFIG.timeout_s <= elapsed < CONFIG.timeout_s + 30  # killed, not hung
    assert wait_gone(sleeper) == []


def test_background_processes_die_when_main_exits(box):
    sleeper = marker()
    result = box.run(["sh", "-c", f"setsid sleep {sleeper} > /dev/null 2>&1 & echo started"])
    assert result.ok and result.stdout == "started\n"  # not held up by the sleeper
    assert wait_gone(sleeper) == []


def test_closed_stdio_does_not_dodge_the_timeout(box):
    result = box.run_python("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)")
    assert result.timed_out  # before the 30 s sleep could end


def test_huge_output_is_truncated_promptly(box):
    result = box.run(["sh", "-c", "head -c 100000000 /dev/zero; echo done >&2"])
    assert result.ok  # the writer never blocked on a full pipe
    assert result.stdout_truncated and len(result.stdout) == CONFIG.max_output_bytes
    assert result.stderr == "done\n" and not result.stderr_truncated


def test_file_size_limit(box):
    result = box.run_python("open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert result.exit_code != 0
    assert "File too large" in result.stderr


def test_open_files_limit(box):
    result = box.run_python("fs = [open('/dev/null') for _ in range(100)]")
    assert result.exit_code == 1
    assert "Too many open files" in result.stderr


def test_process_limit(box):
    code = """
import os
children = 0
try:
    for _ in range(100):
        if os.fork() == 0:
            import time; time.sleep(5); os._exit(0)
        children += 1
except OSError as e:
    print(children, e.strerror)
"""
    result = box.run_python(code)
    count, _, reason = result.stdout.partition(" ")
    assert int(count) < CONFIG.nproc
    assert "Resource temporarily unavailable" in reason


def test_cpu_time_limit():
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    # The wall-clock limit only guards against a hang: on a busy machine one
    # CPU second can take many wall seconds.
    sandbox = Sandbox(CONFIG.model_copy(update={"cpu_s": 1, "timeout_s": 60}))
    result = sandbox.run_python("while True:\n    pass")
    assert not result.timed_out
    assert result.exit_code == 128 + 24  # SIGXCPU at the soft limit


def test_process_limit_is_per_sandbox():
    """RLIMIT_NPROC is counted per user namespace (Linux >= 5.14): a sandbox full
    of processes does not make fork fail in another one."""
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    sandbox = Sandbox(CONFIG.model_copy(update={"timeout_s": 30}))
    with ThreadPoolExecutor(1) as pool:
        crowded = pool.submit(
            sandbox.run, ["sh", "-c", "for i in $(seq 25); do sleep 3.017 & done; echo up; wait"]
        )
        # The first sandbox fills up to ~27 of its 32 processes before the second starts.
        deadline = time.monotonic() + 30
        while len(host_pids_with("3.017\0")) < 25:  # the sleeps: "sleep\03.017\0"
            assert time.monotonic() < deadline, "the first sandbox never filled up"
            time.sleep(0.02)
        other = sandbox.run(["sh", "-c", "for i in $(seq 12); do sleep 0.1 & done; wait; echo ok"])
        assert other.ok and other.stdout == "ok\n", other
        assert crowded.result().stdout == "up\n"
