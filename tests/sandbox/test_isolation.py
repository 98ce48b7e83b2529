"""What sandboxed code cannot reach: network, host files, host processes, and
the filesystem outside its scratch dir. Each test runs on the cold path and on
the warm pool."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_json(box, code: str) -> dict:
    """Run a snippet that prints one JSON object; return it."""
    result = box.run_python(code)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def test_network_is_blocked(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        out = run_json(
            box,
            f"""
import json, socket
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return type(e).__name__
def connect(addr):
    s = socket.socket()
    s.settimeout(1)
    s.connect(addr)
print(json.dumps({{
    "host_port": attempt(lambda: connect(("127.0.0.1", {port}))),
    "external": attempt(lambda: connect(("1.1.1.1", 53))),
    "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
}}))
""",
        )
        assert out["host_port"] == "ConnectionRefusedError"  # its own empty loopback
        assert out["external"] != "ok"
        assert out["dns"] != "ok"
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the host's listener
    finally:
        listener.close()


def test_writes_outside_scratch_fail(box):
    out = run_json(
        box,
        """
import json
res = {}
for path in ["/usr/x", "/etc/x", "/x", "/proc/x", "/dev/x", "/sandbox/ok", "/tmp/ok"]:
    try:
        open(path, "w").write("x")
        res[path] = "ok"
    except OSError as e:
        res[path] = type(e).__name__
print(json.dumps(res))
""",
    )
    assert out.pop("/sandbox/ok") == "ok"
    assert out.pop("/tmp/ok") == "ok"
    assert all(v != "ok" for v in out.values()), out


def test_host_secrets_and_repo_are_invisible(box, tmp_path):
    secret_dir = Path("/root") if os.geteuid() == 0 else Path.home()
    secret = secret_dir / f".temper-sandbox-secret-{uuid.uuid4().hex}"
    secret.write_text("TOPSECRET")
    (tmp_path / "secret.txt").write_text("TOPSECRET")
    paths = [str(secret), str(tmp_path / "secret.txt"), str(REPO / "pyproject.toml"), "/etc/shadow"]
    try:
        out = run_json(
            box,
            f"""
import json, os
res = {{}}
for path in {paths!r}:
    try:
        res[path] = open(path).read()
    except OSError as e:
        res[path] = type(e).__name__
res["listing"] = sorted(os.listdir("/"))
print(json.dumps(res))
""",
        )
    finally:
        secret.unlink()
    for path in paths:
        assert out[path] in ("FileNotFoundError", "PermissionError"), (path, out[path])
    assert not {"root", "home", "work"} & set(out["listing"]), out["listing"]


def test_cannot_signal_or_ptrace_host_processes(box):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        out = run_json(
            box,
            f"""
import ctypes, json, os, signal
res = {{}}
try:
    os.kill({victim.pid}, signal.SIGKILL)
    res["kill"] = "ok"
except OSError as e:
    res["kill"] = type(e).__name__
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.ptrace(16, {victim.pid}, None, None)  # PTRACE_ATTACH
res["ptrace"] = "ok" if rc == 0 else os.strerror(ctypes.get_errno())
res["visible"] = os.path.exists("/proc/{victim.pid}/cmdline") and b"sleep" in open("/proc/{victim.pid}/cmdline", "rb").read()
print(json.dumps(res))
""",
        )
        assert out["kill"] == "ProcessLookupError"
        assert out["ptrace"] != "ok"
        assert not out["visible"]
        # Signal everything it may: only its own sandbox is hit.
        box.run_python("import os, signal; os.kill(-1, signal.SIGKILL)")
        assert victim.poll() is None
        assert box.run_python("print('still works')").stdout == "still works\n"
    finally:
        victim.kill()
        victim.wait()


def test_runs_as_unprivileged_uid_without_capabilities(box):
    out = run_json(
        box,
        """
import json, os
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")]
print(json.dumps({"uid": os.getuid(), "caps": caps[0], "cwd": os.getcwd(), "env": sorted(os.environ)}))
""",
    )
    assert out["uid"] == 65534
    assert int(out["caps"], 16) == 0
    assert out["cwd"] == "/sandbox"
    assert set(out["env"]) <= {"PATH", "HOME", "LANG", "TMPDIR", "PWD", "LC_CTYPE"}


def test_no_state_carries_between_calls(box):
    first = box.run_python(
        "open('/tmp/leak', 'w').write('x'); open('/dev/shm/leak', 'w').write('x');"
        "open('leak', 'w').write('x'); import subprocess; subprocess.Popen(['sleep', '30'])"
    )
    assert first.exit_code == 0, first
    out = run_json(
        box,
        """
import json, os
names = [open(f"/proc/{p}/comm").read().strip() for p in os.listdir("/proc") if p.isdigit()]
print(json.dumps({
    "files": [p for p in ("/tmp/leak", "/dev/shm/leak", "leak") if os.path.exists(p)],
    "sleepers": names.count("sleep"),
}))
""",
    )
    assert out == {"files": [], "sleepers": 0}


def test_a_read_only_bind_under_tmp_is_seen_and_cannot_be_written():
    """ro_binds are mounted after the sandbox's own /tmp, so a host folder under /tmp
    (an MCP server's script, say) is visible, read-only, beside the private tmpfs."""
    import shutil
    import tempfile

    from temper.sandbox import Sandbox

    from .conftest import CONFIG, bwrap_problem

    if bwrap_problem():
        pytest.skip(bwrap_problem())
    shared = tempfile.mkdtemp(prefix="temper-ro-bind-test-")
    try:
        os.chmod(shared, 0o755)
        with open(os.path.join(shared, "hello.txt"), "w") as f:
            f.write("from the host")
        os.chmod(os.path.join(shared, "hello.txt"), 0o644)
        box = Sandbox(CONFIG.model_copy(update={"ro_binds": [shared]}))
        script = f"cat {shared}/hello.txt; echo; touch {shared}/x 2>/dev/null || echo refused"
        result = box.run(["sh", "-c", script])
        box.close()
        lines = result.stdout.splitlines()
        assert result.ok, result
        assert lines[0] == "from the host" and lines[1] == "refused"
        assert not os.path.exists(os.path.join(shared, "x"))
    finally:
        shutil.rmtree(shared, ignore_errors=True)
