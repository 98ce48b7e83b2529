"""MCP tools: real MCP servers (the example server over stdio and streamable HTTP, and a
flaky one) as `tool_use` tools; same prompts and rewards as the built-in tools; failures
become error observations and the episode goes on."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")
pytest.importorskip("fastmcp")

from ports import free_port
from scripted_engine import ScriptedEngine
from temper.builder.tasks import build_env_spec
from temper.config.env import EpisodeLimits
from temper.envs.base import AssistantTurn
from temper.envs.mcp_tools import MCPServer, MCPToolEnv
from temper.envs.tool_use import tool_schemas
from temper.errors import ConfigError
from temper.models import load_tokenizer
from temper.models.tool_calls import parse_tool_calls
from temper.rollout.multi_turn import run_episodes

ROOT = Path(__file__).resolve().parents[2]
SERVER = str(ROOT / "examples" / "mcp" / "tool_server.py")
MCP_SPEC = "temper.envs.mcp_tools:mcp_tool_use_spec"

FLAKY_SERVER = """
import asyncio, os
from fastmcp import FastMCP

server = FastMCP("flaky")

@server.tool
def echo(text: str) -> str:
    \"\"\"Echo the text.\"\"\"
    return text

@server.tool
def crash() -> str:
    \"\"\"Exit the server process.\"\"\"
    os._exit(3)

@server.tool
async def hang(seconds: float) -> str:
    \"\"\"Sleep, then answer.\"\"\"
    await asyncio.sleep(seconds)
    return "woke"

@server.tool
def fail() -> str:
    \"\"\"Raise (an isError result).\"\"\"
    raise RuntimeError("deliberate failure")

@server.tool
def garbage() -> str:
    \"\"\"Write a malformed line into the protocol stream, then answer.\"\"\"
    import sys
    sys.__stdout__.write("this is not JSON-RPC\\n")
    sys.__stdout__.flush()
    return "answered after garbage"

@server.tool
def picture():
    \"\"\"Answer with an image and no text.\"\"\"
    from fastmcp.utilities.types import Image
    return Image(data=b"png", format="png")

server.run(transport="stdio", show_banner=False)
"""

# Reports what a server process can see and do: run in the sandbox, it is nobody, with
# no network, its script's folder read-only and no /root.
PROBE_SERVER = """
import os, socket
from fastmcp import FastMCP

server = FastMCP("probe")

@server.tool
def probe() -> dict:
    \"\"\"What this process is and may do.\"\"\"
    try:
        socket.create_connection(("127.0.0.1", int(os.environ["PROBE_PORT"])), timeout=2).close()
        net = "connected"
    except OSError as exc:
        net = type(exc).__name__
    try:  # its own folder: bound read-only in the sandbox
        open(os.path.join(os.path.dirname(__file__), "written"), "w").close()
        wrote = True
    except OSError:
        wrote = False
    return {"uid": os.getuid(), "pid": os.getpid(), "net": net, "wrote_own_folder": wrote,
            "sees_root_home": os.path.exists("/root"), "cwd": os.getcwd()}

server.run(transport="stdio", show_banner=False)
"""

# A hand-written stdio server (no SDK) whose `bad` tool answers with a malformed result.
RAW_SERVER = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg.get("method"), msg.get("params") or {}
    schema = {"type": "object", "properties": {}}
    if method == "initialize":
        result = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "raw", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": n, "inputSchema": schema} for n in ("bad", "good")]}
    elif method == "tools/call" and params["name"] == "bad":
        result = {"content": "not a list", "isError": "maybe"}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "fine"}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def _turn(text: str, index: int = 0) -> AssistantTurn:
    calls, errors = parse_tool_calls(text)
    return AssistantTurn(text, [], calls, errors, "stop", index)


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def http_url():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 40
    try:
        while True:  # ready when the port accepts connections
            assert proc.poll() is None, "the HTTP MCP server exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def _play(spec, tokenizer):
    """One scripted lookup_calc episode on spec's first held-out task."""
    task = spec.heldout[0]
    item, count = task.columns["item"], task.columns["count"]
    price = task.columns["table"][item]
    replies = [
        _call("lookup", key=item),
        _call("calculator", expression=f"{count}*{price}"),
        f"{count} {item}s cost {task.answer}. \\boxed{{{task.answer}}}",
    ]
    engine = ScriptedEngine(tokenizer, replies)
    from temper.engine.base import SamplingParams

    [[traj]] = asyncio.run(
        run_episodes(
            engine,
            spec.make_env,
            [task],
            tokenizer,
            SamplingParams(max_new_tokens=64),
            EpisodeLimits(max_turns=4),
            11,
        )
    )
    return engine, traj


def test_mcp_episode_matches_builtin_tools_over_stdio_and_http(http_url):
    tokenizer = load_tokenizer("tiny")
    options = {"categories": ["lookup_calc"], "eval_size": 4}
    builtin_engine, builtin = _play(build_env_spec("tool_use", options, 0), tokenizer)
    assert builtin.turn_rewards == [0.0, 0.0, 1.0]
    for mcp in ({"command": [sys.executable, SERVER]}, {"url": http_url}):
        spec = build_env_spec(MCP_SPEC, {**options, "mcp": mcp}, 0)
        try:
            engine, traj = _play(spec, tokenizer)
        finally:
            spec.close()
        # The rendered prompts hold the tool list and every tool observation.
        assert engine.prompts == builtin_engine.prompts, mcp
        assert traj.turn_rewards == builtin.turn_rewards and traj.finish_reason == "done"
        assert traj.env_info["success"] is True
        assert traj.env_info["mcp_calls"] == ["lookup", "calculator"]
        assert traj.env_metrics["tool_ok"] == 2 and traj.env_metrics["tool_errors"] == 0


def test_listed_tools_have_the_builtin_names_and_schemas():
    server = MCPServer([sys.executable, SERVER])
    try:
        tools = server.tools(["lookup", "calculator"], bind={"lookup": {"table": {"fig": 9}}})
        # Exactly what the chat template sees, key order included.
        assert json.dumps([t.schema for t in tools]) == json.dumps(tool_schemas("lookup_calc"))

        async def play():
            env = MCPToolEnv(tools)
            ok = await env.step(_turn(_call("lookup", key="fig")))
            unknown = await env.step(_turn(_call("lookup", key="kiwi"), 1))
            bad = await env.step(_turn(_call("calculator", expression="2**9"), 2))
            return ok, unknown, bad

        ok, unknown, bad = asyncio.run(play())
        assert json.loads(ok.observation[0]["content"]) == {"value": 9}
        assert unknown.observation[0]["content"].startswith("error: ")
        assert "unknown key 'kiwi'" in unknown.observation[0]["content"]
        assert "unsupported expression" in bad.observation[0]["content"]
        assert bad.info["mcp_calls"] == ["lookup", "lookup", "calculator"]
        assert not bad.done and bad.metrics["tool_error_exception"] == 1
    finally:
        server.close()


def test_failing_hanging_and_crashing_servers_become_error_observations(tmp_path):
    script = tmp_path / "flaky_server.py"
    script.write_text(FLAKY_SERVER)
    server = MCPServer([sys.executable, str(script)], errlog=open(os.devnull, "w"))  # noqa: SIM115
    try:
        tools = server.tools()

        async def play():
            env = MCPToolEnv(tools, tool_timeout_s=1.5)
            steps = [await env.step(_turn(_call("echo", text="hi")))]
            steps.append(await env.step(_turn(_call("fail"), 1)))
            steps.append(await env.step(_turn(_call("hang", seconds=30), 2)))
            steps.append(await env.step(_turn(_call("echo", text="still alive"), 3)))
            steps.append(await env.step(_turn(_call("garbage"), 4)))
            steps.append(await env.step(_turn(_call("picture"), 5)))
            steps.append(await env.step(_turn(_call("crash"), 6)))
            env.tool_timeout_s = 30.0  # reconnecting starts a new server process
            steps.append(await env.step(_turn(_call("echo", text="reconnected"), 7)))
            return steps

        t0 = time.monotonic()
        steps = asyncio.run(play())
        contents = [s.observation[0]["content"] for s in steps]
        assert not any(s.done for s in steps)
        assert contents[0] == "hi"
        assert contents[1].startswith("error: ") and "deliberate failure" in contents[1]
        assert contents[2] == "error: tool 'hang' timed out after 1.5s"
        assert contents[3] == "still alive"
        assert contents[4] == "answered after garbage"
        assert contents[5] == "[image content]"
        assert contents[6].startswith("error: tool 'crash' raised MCPToolError: MCP server")
        assert "closed the connection (it crashed or exited)" in contents[6]
        assert contents[7] == "reconnected"
        calls = ["echo", "fail", "hang", "echo", "garbage", "picture", "crash", "echo"]
        assert steps[-1].info["mcp_calls"] == calls
        assert time.monotonic() - t0 < 30
    finally:
        server.close()


def test_a_malformed_result_is_an_error_observation(tmp_path):
    script = tmp_path / "raw_server.py"
    script.write_text(RAW_SERVER)
    server = MCPServer([sys.executable, str(script)], connect_timeout_s=20)

    async def play():
        env = MCPToolEnv(server.tools())
        bad = await env.step(_turn(_call("bad")))
        good = await env.step(_turn(_call("good"), 1))
        return bad, good

    try:
        bad, good = asyncio.run(play())
    finally:
        server.close()
    content = bad.observation[0]["content"]
    assert content.startswith("error: tool 'bad' raised MCPToolError: malformed CallToolResult")
    assert "content: Input should be a valid list" in content and "\n" not in content
    assert good.observation[0]["content"] == "fine" and not good.done


def test_options_are_validated():
    for options, match in (
        ({}, "env.options.mcp is required"),
        ({"mcp": {"command": "python server.py"}}, "env.options.mcp must be"),
        ({"mcp": {"url": "ftp://x"}}, "env.options.mcp must be"),
        ({"mcp": {"command": ["x"], "url": "http://x"}}, "env.options.mcp must be"),
        ({"mcp": {"url": "http://x"}, "categories": ["python"]}, "categories"),
        ({"mcp": {"url": "http://x"}, "sandbox_servers": []}, "unknown option"),
        ({"mcp": {"url": "http://x"}, "tool_timeout_s": 0}, "tool_timeout_s"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_env_spec(MCP_SPEC, options, 0)


def test_an_unreachable_server_is_an_error_observation():
    server = MCPServer(url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_s=5)
    from temper.envs.tools import Tool

    tool = Tool("echo", "", {"type": "object", "properties": {}}, server_call(server))

    async def play():
        return await MCPToolEnv([tool]).step(_turn(_call("echo")))

    try:
        [message] = asyncio.run(play()).observation
    finally:
        server.close()
    assert message["content"].startswith("error: tool 'echo' raised MCPToolError: cannot connect")


def server_call(server):
    async def echo(**arguments):
        return await server.call("echo", arguments)

    return echo


def _listening_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


@pytest.fixture
def public_dir():
    """A folder the sandbox uid can read (pytest's tmp_path sits in a private one)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="temper-mcp-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_command_server_runs_in_the_sandbox_by_default(public_dir):
    """Through the options (as a run builds it): nobody, no network, read-only root;
    ``sandbox = false`` runs the same server as a plain subprocess of ours."""
    from temper.envs.mcp_tools import server_from_options

    script = public_dir / "probe_server.py"
    script.write_text(PROBE_SERVER)
    script.chmod(0o644)
    listener, port = _listening_port()
    results = {}
    try:
        for boxed in (True, False):
            options = {"command": [sys.executable, str(script)], "env": {"PROBE_PORT": str(port)}}
            server, scope = server_from_options(options if boxed else {**options, "sandbox": False})
            assert scope == "run"
            try:
                [tool] = server.tools(["probe"])
                results[boxed] = json.loads(asyncio.run(tool.fn()))
            finally:
                server.close()
    finally:
        listener.close()
    inside, outside = results[True], results[False]
    assert inside["uid"] == 65534 and inside["cwd"] == "/sandbox"
    assert inside["net"] != "connected" and inside["wrote_own_folder"] is False
    assert inside["sees_root_home"] is False
    assert outside["uid"] == os.getuid() and outside["net"] == "connected"
    assert outside["wrote_own_folder"] is True  # the probe can tell


def test_episode_scope_starts_a_server_per_episode_and_leaves_none():
    tokenizer = load_tokenizer("tiny")
    options = {"categories": ["lookup_calc"], "eval_size": 4}
    mcp = {"command": [sys.executable, SERVER], "scope": "episode"}
    spec = build_env_spec(MCP_SPEC, {**options, "mcp": mcp}, 0)
    before = _sandboxes()
    try:
        trajs = [_play(spec, tokenizer)[1] for _ in range(2)]
    finally:
        spec.close()
    for traj in trajs:
        assert traj.finish_reason == "done" and traj.env_info["success"] is True
        assert traj.env_info["mcp_calls"] == ["lookup", "calculator"]
    # Each episode's env closed its own server (and sandbox) when the episode ended.
    deadline = time.monotonic() + 30
    while _sandboxes() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sandboxes() - before


def _sandboxes() -> set[int]:
    """Pids of bwrap processes that are children of this test process."""
    out = subprocess.run(
        ["ps", "-o", "pid=,ppid=,comm=", "-e"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split() for line in out.splitlines()]
    return {int(r[0]) for r in rows if len(r) == 3 and r[2] == "bwrap" and int(r[1]) == os.getpid()}


def test_an_episode_server_that_cannot_start_is_an_infra_error(public_dir):
    """Not a tool error shown to the policy, nor a zero: the episode is infra_error."""
    script = public_dir / "dies.py"
    script.write_text("import sys; sys.exit(5)\n")
    script.chmod(0o644)
    mcp = {"command": [sys.executable, str(script)], "scope": "episode", "connect_timeout_s": 20}
    spec = build_env_spec(MCP_SPEC, {"categories": ["calc"], "eval_size": 2, "mcp": mcp}, 0)
    tokenizer = load_tokenizer("tiny")
    from temper.engine.base import SamplingParams

    try:
        [[traj]] = asyncio.run(
            run_episodes(
                ScriptedEngine(tokenizer, ["\\boxed{1}"]),
                spec.make_env,
                [spec.heldout[0]],
                tokenizer,
                SamplingParams(max_new_tokens=16),
                EpisodeLimits(max_turns=2),
                3,
                infra_retries=0,
            )
        )
    finally:
        spec.close()
    assert traj.finish_reason == "infra_error"
    assert "the episode's MCP server did not start" in traj.env_error


def test_server_options_are_validated(tmp_path):
    private = tmp_path / "server.py"  # pytest's tmp_path is in a folder only root reads
    private.write_text("")
    for mcp, match in (
        ({"url": "http://x", "scope": "forever"}, "env.options.mcp.scope"),
        ({"url": "http://x", "sandbox": True}, "only a command runs in the sandbox"),
        ({"command": ["python", "x.py"], "sandbox": {"memory_mb": 0}}, "sandbox.memory_mb"),
        ({"command": ["python", "x.py"], "sandbox": "yes"}, "sandbox must be"),
        ({"command": ["python", "x.py"], "sandbox": {"bwrap": "no-such-bwrap"}}, "sandbox = false"),
        ({"command": ["python"], "restart": True}, "unknown key"),
        ({"command": ["python", str(private)]}, "not reachable by uid 65534"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_env_spec(MCP_SPEC, {"mcp": mcp}, 0)
