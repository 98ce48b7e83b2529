"""OpenEnv interop, both ways, against the real openenv-core (0.3.0): Temper plays and
trains on OpenEnv's own echo server (``env.type = "openenv"``), and OpenEnv's own
``GenericEnvClient`` plays a Temper env server's ``/ws`` route."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from counter_env import TASKS
from env_servers import COUNTER, ServerProcess, ServerThread
from ports import free_port
from quick_run import metrics, train
from scripted_engine import ScriptedEngine
from temper.builder.tasks import build_env_spec
from temper.config.env import EpisodeLimits
from temper.engine.base import SamplingParams
from temper.envs.base import AssistantTurn
from temper.envs.openenv_client import OpenEnvEnv, openenv_spec
from temper.envs.service.client import EnvFleet, remote_spec
from temper.envs.service.messages import env_fingerprint
from temper.envs.service.openenv_compat import OpenEnvRoute
from temper.errors import ConfigError, InfraError
from temper.models.loader import load_tokenizer
from temper.records import Task
from temper.rollout.multi_turn import run_episodes

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)

#: OpenEnv's generated echo server, unchanged, at /; at /stopping the same env ends its
#: episode when the action says "stop" (the echo env never does), for `done`.
SERVERS_APP = """
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.app import app
from echo_env.server.echo_env_environment import EchoEnvironment
from openenv.core.env_server.http_server import create_app


class StoppingEcho(EchoEnvironment):
    def step(self, action):
        observation = super().step(action)
        observation.done = "stop" in action.message
        return observation


app.mount("/stopping", create_app(StoppingEcho, EchoAction, EchoObservation, max_concurrent_envs=4))
"""


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never got there"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    """OpenEnv's echo env, made by ``openenv init`` and served by uvicorn: its base URL."""
    root = tmp_path_factory.mktemp("openenv")
    init = [sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(root)]
    made = subprocess.run(init, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and (root / "echo_env" / "server" / "app.py").exists(), made.stdout
    (root / "oe_servers.py").write_text(SERVERS_APP)
    port = free_port()
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "oe_servers:app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=log, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (root / "server.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the echo server did not start"
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def play(make_env, tokenizer, replies, tasks, group_size=1, max_turns=3):
    engine = ScriptedEngine(tokenizer, replies)
    limits = EpisodeLimits(max_turns=max_turns)
    episodes = run_episodes(
        engine, make_env, tasks, tokenizer, GREEDY, limits, seed=3, group_size=group_size
    )
    return asyncio.run(episodes)


def flat(groups):
    return [t for g in groups for t in g]


# -- Temper on OpenEnv servers ------------------------------------------------------------


def test_temper_episodes_on_openenvs_echo_server(echo_server, tokenizer):
    spec = openenv_spec({"url": echo_server, "observation_field": "echoed_message"}, 0)
    tasks = [Task("say", "Say something.")]
    trajs = flat(play(spec.make_env, tokenizer, ["first", "second", "third"], tasks, 2))
    assert len(trajs) == 2
    for t in trajs:
        assert t.finish_reason == "max_turns" and t.env_error is None  # echo never ends
        said = [(m["role"], m["content"]) for m in t.messages]
        assert said == [
            ("user", "Say something.\n\nEcho Env environment ready!"),
            ("assistant", "first"), ("user", "first"),
            ("assistant", "second"), ("user", "second"),
            ("assistant", "third"),
        ]  # fmt: skip
        assert t.turn_rewards == pytest.approx([0.5, 0.6, 0.5])  # echo: 0.1 per character
    # `done` ends the episode; without observation_field the whole observation is the text.
    spec = openenv_spec({"url": f"{echo_server}/stopping/", "max_sessions": 2}, 0)
    trajs = flat(play(spec.make_env, tokenizer, ["hello", "stop", "never"], tasks, 2))
    for t in trajs:
        assert t.finish_reason == "done" and t.num_turns == 2
        assert t.messages[0]["content"].endswith(
            '{"echoed_message":"Echo Env environment ready!","message_length":0}'
        )
        assert t.messages[2]["content"] == '{"echoed_message":"hello","message_length":5}'
        assert t.messages[-1] == {"role": "assistant", "content": "stop"}  # no observation after
        assert t.turn_rewards == pytest.approx([0.5, 0.4])


def test_failures_are_infra_errors_or_the_envs_own(echo_server, tokenizer):
    async def scenario() -> None:
        with pytest.raises(InfraError, match="cannot connect"):
            await OpenEnvEnv(f"http://127.0.0.1:{free_port()}").reset(TASKS[0])
        # The echo server holds one session: a second is refused until the first closes.
        holder, refused, later = (OpenEnvEnv(echo_server) for _ in range(3))
        await holder.reset(TASKS[0])
        with pytest.raises(InfraError, match="CAPACITY_REACHED"):
            await refused.reset(TASKS[0])
        await refused.close()
        await holder.close()  # waits until the server has freed the slot
        await later.reset(TASKS[0], seed=1)
        await later.close()
        # An invalid action is an error reply: the env's error, not the infrastructure's.
        wrong = OpenEnvEnv(echo_server, action_field="text")
        await wrong.reset(TASKS[0])
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            await wrong.step(AssistantTurn("hi", []))
        await wrong.close()
        missing = OpenEnvEnv(echo_server, observation_field="screen")
        with pytest.raises(RuntimeError, match=r"no field 'screen'.*echoed_message"):
            await missing.reset(TASKS[0])
        await missing.close()

    asyncio.run(scenario())
    # Through the rollout loop: the env's errors end the episode as env_error.
    spec = openenv_spec({"url": echo_server, "action_field": "text"}, 0)
    (traj,) = flat(play(spec.make_env, tokenizer, ["x"], [Task("t", "p")]))
    assert traj.finish_reason == "env_error" and "VALIDATION_ERROR" in traj.env_error


def test_the_spec_checks_its_options_in_one_line():
    for options, words in (
        ({}, "env.options.url is required"),
        ({"url": "ws://127.0.0.1:8000"}, "got 'ws://127.0.0.1:8000'"),
        ({"url": "http://h:1", "tasks": []}, "env.options.tasks must be"),
        ({"url": "http://h:1", "max_sessions": 0}, "env.options.max_sessions must be"),
        ({"url": "http://h:1", "colour": 1}, "env.options.colour: unknown option"),
    ):
        with pytest.raises(ConfigError, match=words) as err:
            build_env_spec("openenv", options, 0)
        assert "\n" not in str(err.value)
    spec = build_env_spec("openenv", {"url": "http://h:1", "tasks": ["a", "b"], "eval_size": 3}, 0)
    assert [t.prompt for t in spec.heldout] == ["a", "b", "a"] and spec.name == "openenv:http://h:1"


def test_a_short_training_run_on_openenvs_echo_server(echo_server, tmp_path):
    run = train(
        tmp_path, "openenv",
        "--env.type=openenv", f"--env.options.url={echo_server}",
        "--env.options.observation_field=echoed_message", "--env.limits.max_turns=2",
        "--orchestrator.steps=2", "--orchestrator.prompts_per_step=2",
        "--orchestrator.group_size=2", "--orchestrator.max_response_tokens=8",
    )  # fmt: skip
    rows = metrics(run)
    assert len(rows) == 2
    for row in rows:
        assert row["env/episodes"] == 4 and "loss" in row
        assert row.get("env/finish/infra_error", 0) == 0 and row.get("env/env_errors", 0) == 0
        assert row.get("env/infra_retries", 0) == 0


# -- OpenEnv clients on Temper env servers -----------------------------------------------


def openenv_server(options: dict | None = None, **limits) -> ServerThread:
    """A Temper env server (the counter env) with the OpenEnv route, as env-serve has it."""
    server = ServerThread(COUNTER, options or {}, **limits)
    server.server.extra_routes["/ws"] = OpenEnvRoute(server.service)
    return server


def http_url(server: ServerThread) -> str:
    return f"http://127.0.0.1:{server.server.port}"


def test_openenvs_client_plays_a_temper_env_server(tokenizer):
    from openenv.core import GenericEnvClient

    with openenv_server({"turns": 2}) as server:
        with GenericEnvClient(base_url=http_url(server)).sync() as env:
            first = env.reset(seed=5)
            obs = first.observation
            assert (first.reward, first.done) == (None, False)
            assert obs["text"] == "count to 0 (seed 5)" and obs["task_id"] == "count-0"
            assert obs["messages"] == [{"role": "user", "content": "count to 0 (seed 5)"}]
            assert obs["tools"][0]["function"]["name"] == "noop"
            one = env.step({"message": "one"})
            assert one.observation["text"] == "you said 'one' (turn 1)"
            assert (one.reward, one.done) == (0.5, False)
            two = env.step({"message": "two"})
            assert (two.reward, two.done) == (0.5, True)
            assert two.observation["info"] == {"success": True}
            assert two.observation["metrics"] == {"counted": 1.0}
            state = env.state()
            assert state["step_count"] == 2 and state["task_id"] == "count-0"
            assert state["done"] is True and state["episode_id"]
            # The next reset plays the env's next task, or the one it names.
            assert env.reset().observation["task_id"] == "count-1"
            mine = env.reset(task={"id": "mine", "prompt": "count to 9"}, seed=1, episode_id="e")
            assert mine.observation["text"] == "count to 9 (seed 1)"
            assert env.state()["episode_id"] == "e"
            assert len(server.service.sessions) == 1  # each reset ended the one before
        wait_until(lambda: not server.service.sessions)  # close ended the last
        counts = server.service.counts
        assert counts["sessions_opened"] == 3 and counts["sessions_ended_close"] == 3
        # env.type = "openenv" plays through the same route; Temper runs on /v1 beside it.
        spec = openenv_spec({"url": http_url(server), "observation_field": "text"}, 0)
        (traj,) = flat(play(spec.make_env, tokenizer, ["a", "b"], [Task("t", "Count.")]))
        assert traj.finish_reason == "done" and traj.turn_rewards == [0.5, 0.5]
        assert traj.messages[0]["content"].startswith("Count.\n\ncount to ")
        assert traj.messages[2]["content"] == "you said 'a' (turn 1)"
        fleet = EnvFleet([server.url], env_fingerprint(COUNTER, {"turns": 2}))
        remote = remote_spec(build_env_spec(COUNTER, {"turns": 2}, 0), fleet)
        (traj,) = flat(play(remote.make_env, tokenizer, ["a", "b"], TASKS[:1]))
        assert traj.finish_reason == "done" and traj.turn_rewards == [0.5, 0.5]


def test_env_serve_serves_openenv_clients_beside_temper_runs():
    from openenv.core import GenericEnvClient

    port = free_port()
    with ServerProcess(port, f"--env.type={COUNTER}") as server:
        base = f"http://127.0.0.1:{port}"
        with GenericEnvClient(base_url=base).sync() as env:
            assert env.reset(seed=2).observation["text"] == "count to 0 (seed 2)"
            assert env.step({"message": "hi"}).observation["text"] == "you said 'hi' (turn 1)"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{base}/nope", timeout=5)
        with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
            assert json.load(answer)["status"] == "ok"  # what OpenEnv's providers wait on
        assert "OpenEnv clients at /ws" in server.output()


def test_malformed_openenv_messages_get_error_replies_and_the_server_serves_on(monkeypatch):
    from openenv.core import GenericEnvClient

    with openenv_server({"huge_bytes": 4096}, max_observation_bytes=2048) as server:
        url = f"ws://127.0.0.1:{server.server.port}/ws"

        async def probe() -> dict[str, str]:
            codes = {}
            async with connect(url) as ws:

                async def ask(name: str, message: str | bytes) -> dict:
                    await ws.send(message)
                    reply = json.loads(await ws.recv())
                    codes[name] = reply["data"]["code"] if reply["type"] == "error" else "ok"
                    return reply

                await ask("garbage", "{not json")
                await ask("bytes", b"\xc1\x00")
                await ask("list", "[1, 2]")
                await ask("unknown", json.dumps({"type": "teleport"}))
                await ask("mcp", json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0"}}))
                await ask("early", json.dumps({"type": "step", "data": {"message": "x"}}))
                await ask("seed", json.dumps({"type": "reset", "data": {"seed": "x"}}))
                await ask("task", json.dumps({"type": "reset", "data": {"task": {"answer": 1}}}))
                host = [{"role": "user", "content": [{"type": "image", "image": "/etc/hostname"}]}]
                await ask("host_image", json.dumps({"type": "reset", "data": {"prompt": host}}))
                await ask("reset", json.dumps({"type": "reset", "data": {}}))
                await ask("field", json.dumps({"type": "step", "data": {"msg": "x"}}))
                await ask("huge", json.dumps({"type": "step", "data": {"message": "x"}}))
                await ask("after", json.dumps({"type": "step", "data": {"message": "x"}}))
                await ask("state", json.dumps({"type": "state"}))
                await ws.send(json.dumps({"type": "close"}))
                with pytest.raises(ConnectionClosed):
                    await ws.recv()  # no reply: the server closed the socket
                codes["closed"] = str(ws.close_code)
            return codes

        assert asyncio.run(probe()) == {
            "garbage": "INVALID_JSON", "bytes": "INVALID_JSON", "list": "VALIDATION_ERROR",
            "unknown": "UNKNOWN_TYPE", "mcp": "UNKNOWN_TYPE", "early": "EXECUTION_ERROR",
            "seed": "VALIDATION_ERROR", "task": "VALIDATION_ERROR",
            "host_image": "VALIDATION_ERROR", "reset": "ok",
            "field": "VALIDATION_ERROR", "huge": "EXECUTION_ERROR", "after": "EXECUTION_ERROR",
            "state": "ok", "closed": "1000",
        }  # fmt: skip
        counts = server.service.counts
        assert counts["errors_observation_too_large"] == 1
        assert counts["openenv_errors_VALIDATION_ERROR"] == 5
        wait_until(lambda: not server.service.sessions)
        # The server plays on, for OpenEnv clients and Temper's.
        with GenericEnvClient(base_url=http_url(server)).sync() as env:
            assert env.reset().observation["task_id"].startswith("count-")
    # A full server is CAPACITY_REACHED; a reply slower than timeout_s is an infra error.
    monkeypatch.setenv("TEMPER_TEST_SLOW_STEP_S", "1")
    with openenv_server(max_sessions=1) as server:

        async def full_and_slow() -> None:
            first, second = (
                OpenEnvEnv(http_url(server), timeout_s=0.2),
                OpenEnvEnv(http_url(server)),
            )
            await first.reset(TASKS[0])
            with pytest.raises(InfraError, match="CAPACITY_REACHED"):
                await second.reset(TASKS[0])
            await second.close()
            with pytest.raises(InfraError, match=r"no reply to step in 0\.2 s"):
                await first.step(AssistantTurn("slow", []))
            await first.close()

        asyncio.run(full_and_slow())


def test_images_reach_openenv_clients_in_full_every_time():
    from openenv.core import GenericEnvClient

    server = openenv_server({"image": True})
    with server, GenericEnvClient(base_url=http_url(server)).sync() as env:
        for _ in range(2):  # the same picture again: OpenEnv clients keep no image cache
            text, image = env.reset().observation["messages"][0]["content"]
            assert text["type"] == "text" and image["type"] == "image"
            png = base64.b64decode(image["png_base64"])
            assert png.startswith(b"\x89PNG") and len(image["sha256"]) == 64
