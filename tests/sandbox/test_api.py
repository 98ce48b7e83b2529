"""The calling side: files in and out, exit codes, stdin, async, the warm pool's
worker lifecycle, config validation, and the rlimits-only fallback."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os

import pytest
from pydantic import ValidationError

import temper.sandbox.sandbox as sandbox_module
from temper.sandbox import IsolationUnavailableError, Sandbox, SandboxConfig, SandboxPool

from .conftest import CONFIG, bwrap_problem, marker, wait_gone


def test_files_in_and_out(box):
    result = box.run(
        ["sh", "-c", "cat in.txt data/blob.bin > out.txt && mkdir -p res && echo hi > res/a"],
        files={"in.txt": "text\n", "data/blob.bin": b"\x00\xffbytes"},
        collect=["out.txt", "res/a", "absent.txt"],
    )
    assert result.ok, result
    assert result.files == {"out.txt": b"text\n\x00\xffbytes", "res/a": b"hi\n"}
    assert result.missing_files == ["absent.txt"]


def test_collect_does_not_follow_planted_links(box):
    result = box.run(
        ["sh", "-c", "ln -s /etc/passwd leak && ln -s / root && mkfifo pipe"],
        collect=["leak", "root/etc/passwd", "pipe"],
    )
    assert result.ok, result
    assert result.files == {}
    assert result.missing_files == ["leak", "root/etc/passwd", "pipe"]


def test_bad_file_paths_are_refused(box):
    with pytest.raises(ValueError, match="relative"):
        box.run(["true"], files={"../escape": "x"})
    with pytest.raises(ValueError, match="relative"):
        box.run(["true"], files={"/etc/x": "x"})


def test_exit_codes_and_stderr(box):
    r = box.run(["sh", "-c", "echo oops >&2; exit 7"])
    assert (r.exit_code, r.stderr, r.ok) == (7, "oops\n", False)
    r = box.run_python("raise SystemExit(3)")
    assert r.exit_code == 3
    r = box.run_python("1 / 0")
    assert r.exit_code == 1
    assert r.stderr.startswith("Traceback") and "ZeroDivisionError" in r.stderr
    assert 'File "<string>", line 1' in r.stderr
    r = box.run_python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.exit_code == 128 + 9 and not r.memory_exceeded
    r = box.run(["no-such-command"])
    assert r.exit_code == 127


def test_stdin_is_fed(box):
    data = "line\n" * 50_000  # more than a pipe buffer
    r = box.run_python("import sys; print(len(sys.stdin.read()))", stdin=data)
    assert r.stdout == f"{len(data)}\n"


def test_async_runs_overlap(box):
    # Each snippet reports when it slept (the host's clock: there is no time
    # namespace); run one after another, no two intervals could overlap.
    code = "import time; a = time.time(); time.sleep(0.5); print({}, a, time.time())"

    async def main():
        return await asyncio.gather(
            *(box.arun_python(code.format(i)) for i in range(6)), box.arun(["echo", "cmd"])
        )

    results = asyncio.run(main())
    assert results[-1].stdout == "cmd\n"
    rows = [r.stdout.split() for r in results[:-1]]
    assert [row[0] for row in rows] == [str(i) for i in range(6)], results
    spans = sorted((float(a), float(b)) for _, a, b in rows)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def test_pool_reuses_workers_and_resets_between_calls():
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    # What one call leaves behind: files in /sandbox, /tmp and /dev/shm, a SysV
    # shared memory segment, and a background process.
    code = """
import ctypes, json, os, subprocess
server = open(f"/proc/{os.getppid()}/stat").read().split()[3]
comms = [open(f"/proc/{p}/comm").read().strip() for p in os.listdir("/proc") if p.isdigit()]
print(json.dumps({
    "worker": open(f"/proc/{server}/stat").read().split()[21],
    "here": sorted(os.listdir(".")),
    "left": [p for p in ("/tmp/mark", "/dev/shm/mark") if os.path.exists(p)],
    "shm": len(open("/proc/sysvipc/shm").readlines()) - 1,
    "sleepers": comms.count("sleep"),
}))
for path in ("/tmp/mark", "/dev/shm/mark", "mine"):
    open(path, "w").write("x")
ctypes.CDLL(None).shmget(1234, 4096, 0o1666)
subprocess.Popen(["sleep", "30"], start_new_session=True)
"""
    with SandboxPool(CONFIG.model_copy(update={"pool_size": 1, "pool_max_uses": 3})) as pool:
        workers = []
        for i in range(4):
            r = pool.run_python(code, files={f"in{i}": "x"})
            out = json.loads(r.stdout)
            workers.append(out.pop("worker"))
            assert out == {"here": [f"in{i}"], "left": [], "shm": 0, "sleepers": 0}, out
        assert workers[0] == workers[1] == workers[2] != workers[3]  # reused, then recycled
        assert len(pool._idle) == 1


def test_pool_replaces_a_worker_whose_server_was_killed():
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    with SandboxPool(CONFIG.model_copy(update={"pool_size": 1})) as pool:
        r = pool.run_python(
            "import os\n"
            "server = int(open(f'/proc/{os.getppid()}/stat').read().split()[3])\n"
            "os.kill(server, 9)"
        )
        assert r.error is None or "died" in r.error
        assert pool.run_python("print('fresh')").stdout == "fresh\n"


def test_config_is_validated():
    with pytest.raises(ValidationError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValidationError, match="extra"):
        SandboxConfig(timeout=1)
    with pytest.raises(ValidationError, match="absolute"):
        SandboxConfig(ro_binds=["relative/dir"])
    with pytest.raises(ValueError, match="non-empty list"):
        Sandbox(CONFIG, allow_fallback=True).run("echo hi")


def test_fallback_warns_once_and_still_limits(caplog, monkeypatch):
    monkeypatch.setattr(sandbox_module, "_warned", False)
    # Without a user namespace, RLIMIT_NPROC counts every uid-65534 process on
    # the host (other sandboxes, exited ones not yet reaped): give it room.
    cfg = CONFIG.model_copy(
        update={"bwrap": "/nonexistent/bwrap", "allow_fallback": True, "nproc": 4096}
    )
    with caplog.at_level(logging.WARNING, logger="temper.sandbox"):
        first, second = Sandbox(cfg), SandboxPool(cfg)
    warnings = [r for r in caplog.records if "NOT ISOLATED" in r.getMessage()]
    assert len(warnings) == 1 and "/nonexistent/bwrap" in warnings[0].getMessage()
    assert not first.isolated and not second.isolated
    r = first.run_python("import os; print(os.getcwd() != '/sandbox')")
    assert r.ok and r.stdout == "True\n" and not r.isolated
    assert first.run_python("x = bytearray(10**9)").memory_exceeded  # rlimits still apply
    sleeper = marker()
    r = second.run_python(
        f"import subprocess; subprocess.Popen(['sleep', '{sleeper}'])\nwhile 1: pass"
    )
    assert r.timed_out and not r.isolated, r.stderr
    assert wait_gone(sleeper) == []  # its process group was killed
    if os.geteuid() == 0:
        assert second.run_python("import os; print(os.getuid())").stdout == "65534\n"
    second.close()


def test_fallback_refused_when_isolation_required():
    cfg = CONFIG.model_copy(update={"bwrap": "/nonexistent/bwrap", "allow_fallback": False})
    with pytest.raises(IsolationUnavailableError, match="/nonexistent/bwrap"):
        Sandbox(cfg)
    with pytest.raises(IsolationUnavailableError):
        SandboxPool(cfg)


def test_warm_child_cannot_ptrace_or_read_its_server():
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    with SandboxPool(CONFIG.model_copy(update={"pool_size": 1})) as pool:
        r = pool.run_python(
            "import ctypes, os\n"
            "server = int(open(f'/proc/{os.getppid()}/stat').read().split()[3])\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for pid in (server, os.getppid()):\n"
            "    print(libc.ptrace(16, pid, None, None), os.strerror(ctypes.get_errno()))\n"
            "    try:\n"
            "        open(f'/proc/{pid}/mem', 'rb').read(1)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
        )
        assert r.stdout.splitlines() == ["-1 Operation not permitted", "PermissionError"] * 2, r
        assert pool.run_python("print('fine')").stdout == "fine\n"


def test_runs_from_a_process_holding_over_a_thousand_descriptors(box):
    """A gateway serving hundreds of agent episodes holds a socket each; the sandbox's
    own pipes then get descriptors past 1024, which select() refuses."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(held) >= 1024
        result = box.run(["sh", "-c", "echo fine"])
        assert result.ok, result
        assert result.stdout == "fine\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
