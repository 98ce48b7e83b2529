"""The env service over the wire (`temper env-serve`, `EnvFleet`, `RemoteEnv`): the same
episodes as in process, bad input ends only its call, the reaper and the lifetime,
the cap and the rate limit, vanished clients, and lost servers as infra errors."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from websockets.asyncio.client import connect

from counter_env import TASKS
from env_servers import COUNTER, ServerProcess, ServerThread
from ports import free_port
from scripted_engine import ScriptedEngine
from temper.builder.tasks import build_env_spec
from temper.engine.base import SamplingParams
from temper.envs.service.client import EnvFleet, RemoteEnv, check_servers, remote_spec
from temper.envs.service.messages import PROTOCOL_VERSION, env_fingerprint
from temper.errors import ConfigError, InfraError
from temper.models.loader import load_tokenizer
from temper.orchestrator.advantages import usable
from temper.rollout.multi_turn import episode_stats, run_episodes
from temper.wire.client import WireClient
from temper.wire.codec import WireError, decode, encode

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


def fleet(*urls: str, options: dict | None = None, **kw) -> EnvFleet:
    options = options or {}
    fingerprint = env_fingerprint(COUNTER, options)
    return EnvFleet(list(urls), fingerprint, env_type=COUNTER, options=options, **kw)


def wait_until(condition, timeout_s: float = 60.0) -> None:
    """Wait for what the server does after a connection closes (its own task)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def play(make_env, tokenizer, tasks=TASKS[:2], group_size=2, **kw):
    engine = ScriptedEngine(tokenizer, ["first", "second", "third"])
    return asyncio.run(
        run_episodes(
            engine, make_env, tasks, tokenizer, GREEDY, seed=3, group_size=group_size, **kw
        )
    )


def test_remote_episodes_equal_in_process_ones_token_for_token(tokenizer):
    options = {"turns": 3}
    local = build_env_spec(COUNTER, options, 0)
    with ServerThread(COUNTER, options) as server:
        remote = remote_spec(local, fleet(server.url, options=options))
        there = play(remote.make_env, tokenizer)
        stats = server.service.counts
        assert server.service.sessions == {}  # every episode closed its session
    here = play(local.make_env, tokenizer)
    for a, b in zip([t for g in here for t in g], [t for g in there for t in g], strict=True):
        assert a.finish_reason == b.finish_reason == "done"
        assert (a.prompt_ids, a.response_ids, a.loss_mask) == (
            b.prompt_ids,
            b.response_ids,
            b.loss_mask,
        )
        assert a.messages == b.messages and a.turn_rewards == b.turn_rewards == [0.5] * 3
        assert a.env_metrics == b.env_metrics == {"counted": 3.0}
    assert stats["sessions_opened"] == 4 and stats["steps"] == 12
    assert stats["sessions_ended_close"] == 4


def test_images_cross_once_per_connection(tokenizer):
    options = {"image": True}
    with ServerThread(COUNTER, options) as server:

        async def two_resets() -> list[int]:
            client = WireClient(server.url)
            await client.call("hello", version=PROTOCOL_VERSION)
            sizes = []
            for task in TASKS[:2]:
                answer = await client.call("open", task={"id": task.id, "prompt": task.prompt})
                sizes.append(len(encode(answer)))
                part = answer["observation"][0]["content"][1]
                assert part["type"] == "image" and len(part["sha256"]) == 64
            await client.close()
            return sizes

        first, second = asyncio.run(two_resets())
        assert first - second > 60  # the PNG's bytes, sent the first time only
        wait_until(lambda: not server.service.sessions)  # the closed connection ended both


def test_bad_input_ends_only_its_call_and_the_server_keeps_serving(tokenizer):
    with ServerThread(COUNTER, {"huge_bytes": 4096}, max_observation_bytes=2048) as server:

        async def probe() -> dict[str, str]:
            codes = {}
            async with connect(server.url) as ws:  # a raw socket: frames no client would send
                await ws.send(b"\xc1 not msgpack")
                codes["garbage"] = decode(await ws.recv())["error"]["code"]
                await ws.send("a text frame")
                codes["text"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 1, "op": "hello", "version": PROTOCOL_VERSION + 1}))
                codes["version"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 2, "op": "teleport"}))
                codes["op"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 3, "op": "step", "session": "nope", "turn": {}}))
                codes["session"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 4, "op": "open", "task": {"prompt": "no id"}}))
                codes["task"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 5, "op": "open", "task": {"id": "t", "prompt": "p"}}))
                sid = decode(await ws.recv())["session"]
                await ws.send(encode({"id": 6, "op": "step", "session": sid, "turn": {"text": 1}}))
                codes["turn"] = decode(await ws.recv())["error"]["code"]
                turn = {"text": "hi", "token_ids": [1]}
                await ws.send(encode({"id": 7, "op": "step", "session": sid, "turn": turn}))
                codes["huge"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 8, "op": "step", "session": sid, "turn": turn}))
                codes["after_huge"] = decode(await ws.recv())["error"]["code"]
                await ws.send(encode({"id": 9, "op": "ping"}))
                codes["ping"] = "ok" if decode(await ws.recv())["ok"] else "failed"
            return codes

        assert asyncio.run(probe()) == {
            "garbage": "bad_frame", "text": "bad_frame", "version": "protocol_version",
            "op": "bad_request", "session": "unknown_session", "task": "bad_request",
            "turn": "bad_request", "huge": "observation_too_large",
            "after_huge": "unknown_session", "ping": "ok",
        }  # fmt: skip
        # The rollout loop sees the oversized observation as the env's error, for that
        # episode only; the next episode on the same server plays to the end.
        spec = remote_spec(
            build_env_spec(COUNTER, {}, 0), fleet(server.url, options={"huge_bytes": 4096})
        )
        (group,) = play(spec.make_env, tokenizer, tasks=TASKS[:1], group_size=1)
        assert group[0].finish_reason == "env_error"
        assert "observation_too_large" in group[0].env_error
        assert server.service.health()["status"] == "ok" and server.service.sessions == {}


def test_a_server_of_another_env_or_version_is_a_config_error():
    with ServerThread(COUNTER, {"turns": 5}) as server:
        with pytest.raises(
            ConfigError,
            match=r"env\.servers: .*env_mismatch: .* with other env\.options \(turns: here 4, there 5\)",
        ):
            check_servers(fleet(server.url, options={"turns": 4}))
        check_servers(fleet(server.url, options={"turns": 5}))  # the right one passes
        # A server that is down while another answers is left to the episodes' retries.
        check_servers(fleet(f"ws://127.0.0.1:{free_port()}/v1", server.url, options={"turns": 5}))
    # A fleet of which no server answers is a config error: a run would only retry.
    with pytest.raises(ConfigError, match=r"no server answered \(cannot connect to ws://"):
        check_servers(fleet(f"ws://127.0.0.1:{free_port()}/v1"))


def test_the_reaper_ends_idle_and_old_sessions():
    with ServerThread(COUNTER, {"turns": 99}, idle_timeout_s=0.3, lifetime_s=1.0) as server:

        async def scenario() -> tuple[str, str]:
            client = WireClient(server.url)
            await client.call("hello", version=PROTOCOL_VERSION)
            idle = (await client.call("open", task={"id": "a", "prompt": "p"}))["session"]
            busy = (await client.call("open", task={"id": "b", "prompt": "p"}))["session"]
            turn = {"text": "hi", "token_ids": [1]}
            started = time.monotonic()
            # `busy` steps every 0.1 s: never idle, but it reaches its 1 s lifetime.
            while True:
                try:
                    await client.call("step", session=busy, turn=turn)
                except WireError as exc:
                    codes = [exc.code]
                    break
                await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(server.service.reap(), server.loop)
                )
                await asyncio.sleep(0.1)
                assert time.monotonic() - started < 60
            assert time.monotonic() - started >= 1.0  # not before its lifetime
            with pytest.raises(WireError) as err:
                await client.call("step", session=idle, turn=turn)
            codes.append(err.value.code)
            await client.close()
            return tuple(codes)

        assert asyncio.run(scenario()) == ("unknown_session", "unknown_session")
        counts = server.service.counts
        assert counts["sessions_ended_idle"] == 1 and counts["sessions_ended_lifetime"] == 1


def test_the_cap_and_the_rate_limit_answer_as_infrastructure(tokenizer):
    with ServerThread(COUNTER, {}, max_sessions=2, max_opens_per_s=1000) as server:

        async def fill() -> None:
            f = fleet(server.url)
            envs = [RemoteEnv(f) for _ in range(3)]
            await envs[0].reset(TASKS[0], 1)
            await envs[1].reset(TASKS[1], 1)
            with pytest.raises(InfraError, match="server_full"):
                await envs[2].reset(TASKS[2], 1)
            for env in envs:
                await env.close()
            await f.aclose()

        asyncio.run(fill())
    with ServerThread(COUNTER, {}, max_opens_per_s=2) as server:

        async def burst() -> int:
            f = fleet(server.url)
            refused = 0
            for task in TASKS:
                env = RemoteEnv(f)
                try:
                    await env.reset(task, 1)
                except InfraError as exc:
                    refused += "rate_limited" in str(exc)
                await env.close()
            await f.aclose()
            return refused

        assert asyncio.run(burst()) >= 1  # 4 opens at once against 2 a second


def test_a_vanished_client_leaves_no_session():
    with ServerThread(COUNTER, {}) as server:

        async def vanish() -> None:
            client = WireClient(server.url)
            await client.call("hello", version=PROTOCOL_VERSION)
            for task in TASKS:
                await client.call("open", task={"id": task.id, "prompt": task.prompt})
            assert len(server.service.sessions) == 4
            await client.close()  # no close calls: the client is simply gone

        asyncio.run(vanish())
        wait_until(lambda: not server.service.sessions)
        assert server.service.counts["sessions_ended_disconnect"] == 4


def test_a_lost_server_is_an_infra_error_retried_elsewhere_never_a_zero(tokenizer):
    port = free_port()
    crash = {"TEMPER_TEST_CRASH_ON_STEP": "1"}
    with ServerThread(COUNTER, {}) as good:
        with ServerProcess(port, f"--env.type={COUNTER}", env=crash) as doomed:
            f = fleet(doomed.url, good.url)
            spec = remote_spec(build_env_spec(COUNTER, {}, 0), f)
            groups = play(spec.make_env, tokenizer, tasks=TASKS[:2], group_size=2)
            assert doomed.proc.wait(timeout=30) == 17  # it died at its first step
        flat = [t for g in groups for t in g]
        assert [t.finish_reason for t in flat] == ["done"] * 4
        assert sum(t.env_info.get("infra_retries", 0) for t in flat) >= 1
        assert all(t.reward == 1.0 for t in flat) and f.infra_failures >= 1
        stats = episode_stats(flat)
        assert stats["infra_retries"] >= 1 and stats.get("finish/infra_error", 0) == 0
        # With no retries left an infra failure stays one: NaN reward, out of every group.
        port = free_port()
        with ServerProcess(port, f"--env.type={COUNTER}", env=crash) as doomed:
            spec = remote_spec(build_env_spec(COUNTER, {}, 0), fleet(doomed.url))
            (group,) = play(
                spec.make_env, tokenizer, tasks=TASKS[:1], group_size=1, infra_retries=0
            )
        (lost,) = group
        assert lost.finish_reason == "infra_error" and math.isnan(lost.reward)
        assert "connection" in lost.env_error and usable(group) == []
        assert episode_stats(group)["finish/infra_error"] == 1
        assert episode_stats(group)["env_errors"] == 0


def test_a_step_that_outlives_the_call_timeout_is_an_infra_error(tokenizer, monkeypatch):
    monkeypatch.setenv("TEMPER_TEST_SLOW_STEP_S", "30")  # read by the served env's step
    with ServerThread(COUNTER, {}) as slow:
        f = fleet(slow.url, call_timeout_s=0.5)
        spec = remote_spec(build_env_spec(COUNTER, {}, 0), f)
        (group,) = play(spec.make_env, tokenizer, tasks=TASKS[:1], group_size=1, infra_retries=1)
        assert group[0].finish_reason == "infra_error" and "timeout" in group[0].env_error
        assert group[0].env_info["infra_retries"] == 1


def test_an_oversized_image_ends_only_its_episode():
    with ServerThread(COUNTER, {"image": True}, max_observation_bytes=120) as server:

        async def probe() -> tuple[str, str]:
            client = WireClient(server.url)
            await client.call("hello", version=PROTOCOL_VERSION)
            with pytest.raises(WireError) as err:  # the PNG alone is over the limit
                await client.call("open", task={"id": "t", "prompt": "p"})
            pong = await client.call("ping")
            await client.close()
            return err.value.code, "ok" if pong["ok"] else "no"

        assert asyncio.run(probe()) == ("observation_too_large", "ok")
        assert server.service.sessions == {}
        assert server.service.counts["sessions_ended_failed"] == 1


def test_an_image_path_from_the_wire_is_refused_not_read():
    with ServerThread(COUNTER, {}) as server:

        async def probe() -> list[str]:
            client = WireClient(server.url)
            await client.call("hello", version=PROTOCOL_VERSION)
            codes = []
            for part in (
                {"type": "image", "image": "/etc/hostname"},
                {"type": "image_url", "image_url": {"url": "file:///etc/hostname"}},
            ):
                prompt = [{"role": "user", "content": [part]}]
                with pytest.raises(WireError) as err:
                    await client.call("open", task={"id": "t", "prompt": prompt})
                codes.append(err.value.code)
            await client.close()
            return codes

        assert asyncio.run(probe()) == ["bad_image", "bad_image"]
        assert server.service.counts["sessions_opened"] == 0


def test_a_built_in_image_env_serves_the_same_episode_as_in_process():
    """visual_grid over the wire: the same first observation and the same step, the
    rendered grid arriving as the very PNG bytes the env made."""
    from temper.envs import AssistantTurn as Turn
    from temper.vision.images import load_image

    local = build_env_spec("visual_grid", {"eval_size": 2}, 0)
    task = local.heldout[0]
    move = Turn("I move \\boxed{right}", [])

    async def play(make_env) -> tuple[list, object]:
        env = make_env(task)
        try:
            first = await env.reset(task, 5)
            return first, await env.step(move)
        finally:
            await env.close()

    with ServerThread("visual_grid", {"eval_size": 2}) as server:
        f = EnvFleet([server.url], env_fingerprint("visual_grid", {"eval_size": 2}))
        there, there_step = asyncio.run(play(remote_spec(local, f).make_env))
    here, here_step = asyncio.run(play(local.make_env))

    def shown(messages: list) -> list:
        out = []
        for m in messages:
            content = m["content"] if isinstance(m["content"], list) else [m["content"]]
            for p in content:
                is_image = isinstance(p, dict) and p.get("type") == "image"
                out.append(load_image(p["image"]).sha256 if is_image else p)
        return out

    assert shown(there) == shown(here) and any(len(str(x)) == 64 for x in shown(here))
    assert shown(there_step.observation) == shown(here_step.observation)
    assert (there_step.reward, there_step.done) == (here_step.reward, here_step.done)
