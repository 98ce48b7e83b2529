"""The built-in tool-use env: tools, scoring, splits, options, and hermetic replay."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from scripted_engine import ScriptedEngine
from temper.builder.tasks import build_env_spec
from temper.config.env import EpisodeLimits
from temper.envs.base import AssistantTurn
from temper.envs.replay import replay_episode
from temper.envs.tool_use import (
    CATEGORIES,
    ToolUseEnv,
    ToolUseTasks,
    calculator,
    is_heldout,
    make_task,
)
from temper.errors import ConfigError
from temper.models import load_tokenizer
from temper.models.tool_calls import parse_tool_calls
from temper.records import Task
from temper.rollout.multi_turn import run_episodes
from temper.sandbox import Sandbox


def _turn(text: str, index: int = 0) -> AssistantTurn:
    calls, errors = parse_tool_calls(text)
    return AssistantTurn(text, [], calls, errors, "stop", index)


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_calculator_evaluates_integer_arithmetic_and_rejects_the_rest():
    assert calculator("12*(3+4)-5") == {"result": 79}
    assert calculator(" -7 * 3 ") == {"result": -21}
    for bad in ("2**10", "__import__('os')", "1/2", "3.5*2", "x+1", "1+"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_lookup_then_calculator_episode_succeeds_and_wrong_answer_fails():
    task = Task(
        "t", "How much do 7 pears cost?", "161", "lookup_calc",
        {"table": {"pear": 23, "plum": 5}, "item": "pear", "count": 7},
    )  # fmt: skip

    async def play(final: str) -> list:
        env = ToolUseEnv(task)
        first = await env.reset(task, 0)
        assert first == [{"role": "user", "content": "How much do 7 pears cost?"}]
        assert [t["function"]["name"] for t in env.tools] == ["lookup", "calculator"]
        r1 = await env.step(_turn(_call("lookup", key="pear")))
        r2 = await env.step(_turn(_call("calculator", expression="7*23"), 1))
        r3 = await env.step(_turn(final, 2))
        return [r1, r2, r3]

    r1, r2, r3 = asyncio.run(play("7 pears cost 161. \\boxed{161}"))
    assert json.loads(r1.observation[0]["content"]) == {"value": 23} and not r1.done
    assert json.loads(r2.observation[0]["content"]) == {"result": 161}
    assert r3.done and r3.reward == 1.0 and r3.info["success"] is True
    *_, wrong = asyncio.run(play("\\boxed{160}"))
    assert wrong.done and wrong.reward == 0.0 and wrong.info["success"] is False


def test_bad_tool_calls_become_error_observations():
    task = Task("t", "What is the price of the fig?", "9", "lookup", {"table": {"fig": 9}})

    async def play():
        env = ToolUseEnv(task)
        await env.reset(task, 0)
        unknown_key = await env.step(_turn(_call("lookup", key="kiwi")))
        unknown_tool = await env.step(_turn(_call("calculator", expression="1+1"), 1))
        bad_json = await env.step(_turn("<tool_call>{not json</tool_call>", 2))
        return unknown_key, unknown_tool, bad_json

    for result in asyncio.run(play()):
        assert not result.done and result.reward is None
        assert result.observation[0]["content"].startswith("error: ")
    assert "kiwi" in asyncio.run(play())[0].observation[0]["content"]


def test_python_tool_runs_code_in_the_sandbox():
    task = make_task("python", random.Random(3))
    n = task.columns["n"]
    with Sandbox() as sandbox:

        async def play():
            env = ToolUseEnv(task, sandbox)
            await env.reset(task, 0)
            code = f"print(sum(int(d) for d in '{n}'))"
            ok = await env.step(_turn(_call("python", code=code)))
            crash = await env.step(_turn(_call("python", code="raise ValueError('boom')"), 1))
            return ok, crash

        ok, crash = asyncio.run(play())
    assert ok.observation[0]["content"] == task.answer
    assert "ValueError" in crash.observation[0]["content"]


def test_heldout_split_is_disjoint_and_fixed():
    tasks = ToolUseTasks()
    train = tasks.sample(random.Random(0), 2000)
    assert not any(is_heldout(str(t.prompt)) for t in train)
    heldout = tasks.heldout(80)
    assert all(is_heldout(str(t.prompt)) for t in heldout)
    assert [t.category for t in heldout[:4]] == list(CATEGORIES)
    assert [t.id for t in tasks.heldout(80)] == [t.id for t in heldout]


def test_options_are_validated():
    with pytest.raises(ConfigError, match="unknown option"):
        build_env_spec("tool_use", {"categoriez": ["calc"]}, 0)
    with pytest.raises(ConfigError, match="categories"):
        build_env_spec("tool_use", {"categories": ["chess"]}, 0)
    with pytest.raises(ConfigError, match=r"env\.type"):
        build_env_spec("no_such_env", {}, 0)


def test_scripted_episodes_succeed_and_replay_exactly():
    tokenizer = load_tokenizer("tiny")
    spec = build_env_spec("tool_use", {"categories": ["lookup_calc"], "eval_size": 4}, 0)
    task = spec.heldout[0]
    item, count = task.columns["item"], task.columns["count"]
    price = task.columns["table"][item]
    replies = [
        _call("lookup", key=item),
        _call("calculator", expression=f"{count}*{price}"),
        f"{count} {item}s cost {task.answer}. \\boxed{{{task.answer}}}",
    ]
    engine = ScriptedEngine(tokenizer, replies)
    [[traj]] = asyncio.run(
        run_episodes(
            engine, spec.make_env, [task], tokenizer, _params(), EpisodeLimits(max_turns=4), 11
        )
    )
    assert traj.finish_reason == "done" and traj.num_turns == 3
    assert traj.turn_rewards == [0.0, 0.0, 1.0] and traj.env_info["success"] is True
    record = json.loads(json.dumps(traj.to_json()))
    report = asyncio.run(replay_episode(record, spec))
    assert report.ok and report.turns == 3
    record["turn_rewards"][-1] = 0.0
    assert not asyncio.run(replay_episode(record, spec)).ok


def _params():
    from temper.engine.base import SamplingParams

    return SamplingParams(max_new_tokens=64)
