"""The sandbox as a service (`temper sandbox-serve`, `RemoteSandbox`): the same results
and the same isolation as the local sandbox, failover between servers, bad requests,
and a lost server as an infrastructure error of the episode, never a tool error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random

import pytest

from env_servers import SandboxThread
from ports import dead_url
from temper.envs.base import AssistantTurn
from temper.envs.tool_use import ToolUseEnv, make_task
from temper.errors import InfraError
from temper.models.tool_calls import parse_tool_calls
from temper.sandbox import Sandbox, SandboxError
from temper.sandbox.service import SANDBOX_PROTOCOL_VERSION, RemoteSandbox
from temper.wire.client import WireClient
from temper.wire.codec import WireError

#: What code sees of its sandbox: who it is, what it may read and reach.
PROBE = """
import os, socket
seen = {"uid": os.getuid(), "cwd": os.getcwd(), "shadow": os.path.exists("/etc/shadow")}
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
    seen["net"] = "open"
except OSError as exc:
    seen["net"] = type(exc).__name__
try:
    open("/usr/escape", "w")
    seen["write_usr"] = True
except OSError:
    seen["write_usr"] = False
print(__import__("json").dumps(seen, sort_keys=True))
"""


def test_remote_runs_equal_local_ones_with_the_same_isolation():
    with SandboxThread() as server, Sandbox(allow_fallback=False) as local:
        remote = RemoteSandbox([server.url])
        try:
            there = json.loads(remote.run_python(PROBE).stdout)
            files = remote.run_python(
                "print(open('in.txt').read().upper()); open('out.txt', 'w').write('back')",
                files={"in.txt": "hello"},
                collect=["out.txt"],
            )
            listed = asyncio.run(remote.arun(["ls", "/sandbox"], files={"a.txt": b"x"}))
            failed = asyncio.run(remote.arun_python("raise SystemExit(3)"))
        finally:
            remote.close()
        here = json.loads(local.run_python(PROBE).stdout)
    assert there == here
    assert there["uid"] == 65534 and not there["write_usr"] and there["net"] != "open"
    assert files.stdout.strip() == "HELLO" and files.files == {"out.txt": b"back"}
    assert listed.stdout.split() == ["a.txt"] and failed.exit_code == 3


def test_a_call_fails_over_to_the_next_server_and_infra_error_when_none_answers():
    with SandboxThread(pool_size=1) as server:
        remote = RemoteSandbox([dead_url("ws", "/v1"), server.url])
        try:
            assert remote.run_python("print(6 * 7)").stdout.strip() == "42"
            assert remote.infra_failures == 1
        finally:
            remote.close()
    remote = RemoteSandbox([dead_url("ws", "/v1"), dead_url("ws", "/v1")])
    try:
        with pytest.raises(InfraError, match="no sandbox server answered"):
            remote.run_python("print(1)")
    finally:
        remote.close()


def test_bad_requests_get_their_code_and_the_server_keeps_serving():
    with SandboxThread(pool_size=1) as server:

        async def probe() -> list[str]:
            client = WireClient(server.url)
            codes = []
            for fields in (
                {"op": "hello", "version": SANDBOX_PROTOCOL_VERSION + 1},
                {"op": "run", "code": "print(1)", "cmd": ["ls"]},
                {"op": "run", "cmd": "ls"},
                {"op": "run", "code": "print(1)", "files": {"a": 3}},
                {"op": "format_disk"},
            ):
                op = fields.pop("op")
                with pytest.raises(WireError) as err:
                    await client.call(op, **fields)
                codes.append(err.value.code)
            ok = await client.call("run", code="print('still here')")
            codes.append(ok["result"]["stdout"].strip())
            await client.close()
            return codes

        assert asyncio.run(probe()) == [
            "protocol_version", "bad_request", "bad_request", "bad_request", "bad_request",
            "still here",
        ]  # fmt: skip


def _turn(text: str) -> AssistantTurn:
    calls, errors = parse_tool_calls(text)
    return AssistantTurn(text, [], calls, errors, "stop", 0)


def _python(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


def test_the_python_tool_runs_remotely_and_a_lost_server_is_not_a_tool_error():
    task = make_task("python", random.Random(3))
    n = task.columns["n"]
    with SandboxThread(pool_size=1) as server:
        remote = RemoteSandbox([server.url])

        async def play() -> str:
            env = ToolUseEnv(task, remote)
            await env.reset(task, 0)
            result = await env.step(_turn(_python(f"print(sum(int(d) for d in '{n}'))")))
            return result.observation[0]["content"]

        try:
            assert asyncio.run(play()) == task.answer
        finally:
            remote.close()
    remote = RemoteSandbox([dead_url("ws", "/v1")])

    async def lost() -> None:
        env = ToolUseEnv(task, remote)
        await env.reset(task, 0)
        await env.step(_turn(_python("print(1)")))

    try:
        with pytest.raises(InfraError):  # the rollout loop marks the episode infra_error
            asyncio.run(lost())
    finally:
        remote.close()


def test_a_server_without_isolation_is_refused_by_the_client():
    from env_servers import ServiceThread
    from temper.sandbox.service import SandboxService

    class Unisolated(Sandbox):
        @property
        def isolated(self) -> bool:
            return False

    with ServiceThread(SandboxService(Unisolated(allow_fallback=False))) as server:
        remote = RemoteSandbox([server.url])
        try:
            with pytest.raises(SandboxError, match="without bubblewrap"):
                remote.run_python("print(1)")
        finally:
            remote.close()


def test_dirs_left_by_a_killed_process_are_reclaimed_and_live_ones_kept(tmp_path):
    import os
    import subprocess
    import sys

    from temper.sandbox import SandboxConfig, bwrap

    cfg = SandboxConfig(scratch_root=str(tmp_path))
    # A process that makes a scratch dir and dies without cleaning up (as SIGKILL does).
    code = (
        "import os; from temper.sandbox import SandboxConfig; from temper.sandbox import bwrap;"
        f"print(bwrap.make_scratch(SandboxConfig(scratch_root={str(tmp_path)!r})), flush=True);"
        "os._exit(9)"
    )
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    orphan = dead.stdout.strip()
    assert os.path.isdir(orphan) and dead.returncode == 9
    mine = bwrap.make_scratch(cfg)
    unrelated = tmp_path / "temper-sandbox-notes"  # not named by a pid: never ours to delete
    unrelated.mkdir()
    bwrap._reclaimed.discard(str(tmp_path))
    assert bwrap.reclaim_orphans(cfg) >= 1
    assert not os.path.exists(orphan) and os.path.isdir(mine) and unrelated.is_dir()
    bwrap.remove_tree(mine)


def test_a_sandbox_whose_owner_died_while_starting_it_is_killed():
    """A bwrap adopted by init, whose owner (named in its dirs) is dead, is reclaimed;
    one whose owner lives is not."""
    import os
    import subprocess
    import sys
    import time

    from temper.sandbox import bwrap

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip

    def orphan(owner: str) -> int:
        # sh starts bwrap in the background and exits: bwrap is adopted by init.
        cmd = (f"bwrap --ro-bind / / --dev /dev --setenv OWNER /tmp/temper-sandbox-{owner}-x "
               "sleep 120 > /dev/null 2>&1 & echo $!")  # fmt: skip
        return int(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout)

    def alive(pid: int) -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
        except OSError:
            return False

    lost, kept = orphan(dead), orphan(str(os.getpid()))
    try:
        deadline = time.monotonic() + 30
        while not (alive(lost) and alive(kept)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert bwrap._kill_orphaned_sandboxes() >= 1
        deadline = time.monotonic() + 30
        while alive(lost):
            assert time.monotonic() < deadline, "the orphaned sandbox still runs"
            time.sleep(0.05)
        assert alive(kept)
    finally:
        for pid in (lost, kept):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
