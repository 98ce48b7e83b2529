"""Agents as a rollout source (`temper.agents`): groups from a real agent function and a
real agent command talking to the tiny model through the gateway; each kind of bad
agent ends its own episode with a one-line reason while the others go on; and a
two-step training run of an agent through `temper train`."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.agents import agents_for_tests as A

from temper.agents.programs import CommandAgent, FunctionAgent
from temper.agents.rollouts import AgentRollouts
from temper.builder.rewards import build_reward
from temper.config.env import EpisodeLimits
from temper.config.reward import RewardConfig
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.records import Task

ROOT = Path(__file__).resolve().parents[2]
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def engine(tokenizer: Any) -> NativeEngine:
    return NativeEngine(load_model("tiny"), tokenizer)


def _tasks(k: int = 2) -> list[Task]:
    return [Task(f"t{i}", f"What is {i} + 3?", answer=str(i + 3)) for i in range(k)]


def _groups(engine: Any, tokenizer: Any, agent: Any, limits: EpisodeLimits | None = None, **kw):
    async def go() -> Any:
        source = AgentRollouts(
            engine,
            tokenizer,
            agent,
            limits or EpisodeLimits(max_turns=4, timeout_s=60),
            build_reward(RewardConfig(), tokenizer),
            **kw,
        )
        try:
            return await source.groups(_tasks(), PARAMS, seed=0)
        finally:
            await source.close()

    return asyncio.run(go())


def test_function_agent_groups_are_scored_token_exact_episodes(engine, tokenizer):
    groups, stats = _groups(engine, tokenizer, FunctionAgent(A.answers, "answers", "k"))
    assert [len(g) for g in groups] == [2, 2] and stats["reward_errors"] == 0
    for g in groups:
        for t in g:
            assert t.finish_reason == "done" and t.env_error is None
            assert t.num_turns == 2 and t.env_metrics["agent_calls"] == 2
            assert t.reward in (0.0, 1.0) and t.correct == (t.reward >= 1.0)
            assert len(t.loss_mask) == len(t.response_ids) and sum(t.loss_mask) > 0
            assert t.messages[-1]["role"] == "assistant"


@pytest.mark.parametrize(("fn", "reward"), [(A.scores_itself, 0.25), (A.posts_reward, 0.75)])
def test_the_agent_gives_the_reward(engine, tokenizer, fn, reward):
    groups, _ = _groups(engine, tokenizer, FunctionAgent(fn, fn.__name__, "k"))
    assert {t.reward for g in groups for t in g} == {reward}


@pytest.mark.parametrize(
    ("fn", "finish", "reason"),
    [
        (A.raises, "agent_error", "agent raised KeyError: 'tool_result'"),
        (A.hangs, "timeout", "agent did not finish within 1.0s"),
        (A.returns_nan, "agent_error", "agent returned nan, not a finite number"),
        (A.returns_text, "agent_error", "agent returned 'great', not a number or None"),
        (A.never_calls, "agent_error", "the agent made no model call"),
        (A.sends_malformed, "agent_error", "agent raised BadRequestError: "),
        (A.calls_another_session, "agent_error", "agent raised NotFoundError: "),
    ],
)
def test_a_bad_agent_fails_only_its_episode(engine, tokenizer, fn, finish, reason):
    # Only the hanging agent meets the short limit: a cold first call on a loaded
    # machine can take a second, and must not turn a raising agent into a timeout.
    limits = EpisodeLimits(max_turns=4, timeout_s=1.0 if fn is A.hangs else 120.0)
    groups, _ = _groups(engine, tokenizer, FunctionAgent(fn, fn.__name__, "k"), limits)
    for t in (t for g in groups for t in g):
        assert t.finish_reason == finish and "\n" not in t.env_error
        assert t.env_error == reason or (reason.endswith(": ") and t.env_error.startswith(reason))
        assert math.isnan(t.reward)  # on_error = "drop": left out of training
    zeroed, _ = _groups(engine, tokenizer, FunctionAgent(fn, "f", "k"), limits, on_error="zero")
    assert {t.reward for g in zeroed for t in g} == {0.0}


def test_an_eval_of_a_failing_agent_says_why_its_accuracy_is_zero(engine, tokenizer):
    from temper.eval.harness import evaluate
    from temper.orchestrator.loop import _eval_line

    async def go() -> Any:
        source = AgentRollouts(
            engine, tokenizer, FunctionAgent(A.raises, "raises", "k"),
            EpisodeLimits(max_turns=4, timeout_s=60), build_reward(RewardConfig(), tokenizer),
        )  # fmt: skip
        try:
            return await evaluate(source, _tasks(), k=2, max_new_tokens=16)
        finally:
            await source.close()

    result = asyncio.run(go())
    assert result["accuracy"] == 0.0
    assert result["episode_errors"] == result["episodes"] == 2 + 2 * 2  # greedy, then k=2
    assert result["first_episode_error"] == "agent raised KeyError: 'tool_result'"
    line = _eval_line(0, result)
    assert "(6 of 6 episodes ended in an error; the first: agent raised KeyError" in line


class SlowEngine:
    """The engine, each call ``delay_s`` slower: as when many episodes queue for it."""

    def __init__(self, engine: NativeEngine, delay_s: float) -> None:
        self.engine, self.delay_s = engine, delay_s

    def __getattr__(self, name: str) -> Any:  # a test double: forward the rest
        return getattr(self.engine, name)

    async def generate(self, ids: list[int], params: SamplingParams) -> Any:
        await asyncio.sleep(self.delay_s)
        return await self.engine.generate(ids, params)


def test_time_in_the_engine_is_not_the_agents(engine, tokenizer):
    """timeout_s bounds the agent's own time: two calls of 1.5 s each in a (slow) engine
    fit a 1 s limit, while an agent that hangs after its call does not."""
    limits = EpisodeLimits(max_turns=4, timeout_s=1.0)
    slow = SlowEngine(engine, 1.5)
    groups, _ = _groups(slow, tokenizer, FunctionAgent(A.answers, "a", "k"), limits)
    for t in (t for g in groups for t in g):
        assert t.finish_reason == "done" and t.env_error is None
        assert t.env_metrics["agent_calls"] == 2
    groups, _ = _groups(slow, tokenizer, FunctionAgent(A.hangs, "h", "k"), limits)
    for t in (t for g in groups for t in g):
        assert t.finish_reason == "timeout" and t.env_metrics["agent_calls"] == 1


def test_running_out_of_turns_is_the_policys_and_scored(engine, tokenizer):
    limits = EpisodeLimits(max_turns=2, timeout_s=60)
    groups, _ = _groups(engine, tokenizer, FunctionAgent(A.loops_forever, "l", "k"), limits)
    for t in (t for g in groups for t in g):
        assert t.finish_reason == "max_turns" and t.env_error is None
        assert t.env_metrics["agent_calls"] == 2 and not math.isnan(t.reward)
        # It sent the same first message again: each call a new row, the break counted.
        assert len(t.extra_rows) == 1 and t.env_metrics["agent_break_edited_history"] == 1


def test_a_command_agent_runs_per_episode(engine, tokenizer, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os\n"
        "from openai import OpenAI\n"
        "task = json.loads(os.environ['TEMPER_TASK'])\n"
        "client = OpenAI()\n"
        "client.chat.completions.create(model='temper', messages=[{'role': 'user', "
        "'content': task['prompt']}])\n"
        "print('a log line')\n"
        "print(json.dumps({'reward': 0.5}))\n"
    )
    groups, _ = _groups(engine, tokenizer, CommandAgent([sys.executable, str(script)], "k"))
    assert {t.reward for g in groups for t in g} == {0.5}
    assert all(t.num_turns == 1 for g in groups for t in g)
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nsys.exit('no tools here')\n")
    groups, _ = _groups(engine, tokenizer, CommandAgent([sys.executable, str(crash)], "k"))
    assert {t.env_error for g in groups for t in g} == {"agent exited 1: no tools here"}


@pytest.mark.parametrize("backend", ["local", "process"])
def test_an_agent_trains_through_temper_train(tmp_path, backend):
    """In the run's process, and in a rollout worker process (its own engine and
    gateway, the agent imported there by name). In this process, as the other run
    tests do: a subprocess would pay for torch's import again."""
    from temper.cli.main import main

    code = main([
        "train", "--run.name=agent", f"--run.output_dir={tmp_path}",
        "--orchestrator.steps=2", "--orchestrator.prompts_per_step=4", "--orchestrator.group_size=4",
        "--orchestrator.max_response_tokens=24", "--eval.at_start=false", "--eval.every=0",
        "--eval.size=8", "--health.all_groups_dropped.enabled=false",
        "--orchestrator.drop_zero_variance_groups=false",
        "--agent.function=tests.agents.agents_for_tests:answers",
        f"--orchestrator.backend={backend}",
    ])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "agent" / "metrics.jsonl").open()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 2
    assert all(r["env/agent_calls"] == 32 for r in steps)  # 16 episodes of 2 calls
    final = json.loads((tmp_path / "agent" / "eval" / "step_000002.json").read_text())
    assert final["n_tasks"] == 8 and "episode_errors" not in final  # through the agent


def test_a_bad_agent_setting_is_one_line_exit_2(tmp_path, capsys):
    from temper.cli.main import main

    for target, words in (("nope", "nope"), ("not_async", "must be an async function")):
        capsys.readouterr()
        args = ["train", f"--run.output_dir={tmp_path}", "--run.name=bad", "--eval.every=0"]
        code = main([*args, f"--agent.function=tests.agents.agents_for_tests:{target}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and words in err[0], err


@pytest.mark.parametrize(
    "spec", ["examples/agents/agents_sdk.py:agent", "examples/agents/langgraph_agent.py:agent"]
)
def test_framework_agents_run_through_the_gateway(engine, tokenizer, spec):
    """The OpenAI Agents SDK and LangGraph examples, unchanged but for the base URL: every
    episode reaches the model through its session and ends with a recorded row; a
    framework that raises on the model's misbehaviour fails only that episode."""
    import random

    from temper.envs.tool_use import ToolUseTasks
    from temper.targets import load_target

    fn = load_target(str(ROOT / spec.split(":")[0]) + ":agent", "agent.function")
    tasks = ToolUseTasks(("calc", "lookup", "lookup_calc")).sample(random.Random(0), 3)

    async def go() -> Any:
        source = AgentRollouts(
            engine,
            tokenizer,
            FunctionAgent(fn, spec, "k"),
            EpisodeLimits(max_turns=4, timeout_s=120),
            build_reward(RewardConfig(), tokenizer),
        )
        try:
            return await source.groups(tasks, SamplingParams(n=2, max_new_tokens=48), seed=0)
        finally:
            await source.close()

    groups, _ = asyncio.run(go())
    flat = [t for g in groups for t in g]
    assert len(flat) == 6
    for t in flat:
        assert t.env_metrics["agent_calls"] >= 1 and sum(t.loss_mask) > 0
        assert t.finish_reason in ("done", "max_turns", "agent_error")
        assert t.finish_reason != "agent_error" or t.env_error.startswith("agent raised")
    assert any(t.finish_reason == "done" for t in flat)
