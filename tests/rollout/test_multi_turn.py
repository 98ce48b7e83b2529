"""Multi-turn rollouts: token-in/token-out at every turn, tool calls, limits, env failures.

Two templates: the built-in tiny model's ChatML template, and a Qwen2.5-style
Hermes template (written below; its default system prompt, `<tools>` block,
and consecutive tool results grouped into one user message). Two engines: a
scripted engine (a real `Engine` that returns predetermined replies, to force
tool calls) and the real `NativeEngine` on the tiny model. A recording proxy
keeps every (prompt ids, sample) pair the engine saw, and `check_token_io`
proves each turn's engine input equals the trajectory so far and the
loss-masked tokens are exactly the sampled ids.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from scripted_engine import RecordingProxy, ScriptedEngine, check_token_io
from temper.engine.base import Engine, SamplingParams
from temper.engine.native import NativeEngine
from temper.envs import AssistantTurn, EpisodeLimits, StepResult, ToolEnv
from temper.errors import PromptTooLongError
from temper.models.loader import load_model, load_tokenizer
from temper.records import Task, Trajectory
from temper.rollout.multi_turn import episode_stats, run_episode, run_episodes

QWEN_STYLE_TEMPLATE = (
    "{%- set default_system = 'You are a helpful assistant.' %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- default_system }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools>:"
    "\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object within "
    "<tool_call></tool_call> tags.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls %}"
    "{%- set call = tc.function if tc.function is defined else tc %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TEMPLATES = ["tiny", "qwen_style"]
ENDOFTEXT_ID = 0  # a stop token that is not the template's end of turn


def make_tokenizer(template: str) -> Any:
    tokenizer = load_tokenizer("tiny")
    tokenizer.model_max_length = 1 << 20  # scripted episodes exceed 512 tokens; no warning
    if template == "qwen_style":
        tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    return load_model("tiny")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ----------------------------------------------------------------------------- engines


def template_ids(tokenizer: Any, traj: Trajectory, tools: list[dict] | None) -> list[int]:
    """The whole conversation rendered at once (only valid when the sampled ids are the
    canonical tokenization of their text, as with the scripted engine)."""
    text = tokenizer.apply_chat_template(traj.messages, tools=tools or None, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ----------------------------------------------------------------------------- envs


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


class CalcEnv(ToolEnv):
    """Tools add/multiply; a turn without tool calls is the answer (reward 1 if it says 5)."""

    def __init__(self) -> None:
        super().__init__([add, multiply], tool_timeout_s=2.0)
        self.closed = False

    async def reset(self, task: Task, seed: int | None = None) -> list[dict]:
        return [{"role": "system", "content": "Use tools."}, *task.messages()]

    async def answer(self, turn: AssistantTurn) -> StepResult:
        return StepResult([], reward=float("\\boxed{5}" in turn.text), done=True, info={"n": 1})

    async def close(self) -> None:
        self.closed = True


class EchoEnv:
    """No tools. Answers each turn with a user message (or a tool message); ends after
    `turns` turns with reward = the turn number."""

    def __init__(self, turns: int = 3, role: str = "user", fail_at: int | None = None) -> None:
        self.turns, self.role, self.fail_at = turns, role, fail_at
        self.seen: list[AssistantTurn] = []
        self.delay_s = 0.0

    @property
    def tools(self) -> list[dict]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[dict]:
        self.seen = []
        return task.messages()

    async def step(self, turn: AssistantTurn) -> StepResult:
        await asyncio.sleep(self.delay_s)
        self.seen.append(turn)
        k = len(self.seen)
        if k == self.fail_at:
            raise RuntimeError("backend went away")
        content = f"You wrote {len(turn.token_ids)} tokens. Again, turn {k + 1}."
        return StepResult([{"role": self.role, "content": content}], reward=k, done=k >= self.turns)

    async def close(self) -> None:
        return None


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


TASK = Task("t0", "What is 2 + 3?")
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=160)


# ----------------------------------------------------------------------------- scripted


@pytest.mark.parametrize("template", TEMPLATES)
def test_tool_episode_is_token_exact(template: str) -> None:
    tokenizer = make_tokenizer(template)
    replies = [
        call("add", a=2, b=3),
        # parallel calls, one of them malformed in three different ways
        call("add", a=1, b=1)
        + call("multiply", a=2, b=2.5)
        + call("nope")
        + "<tool_call>{oops}</tool_call>"
        + call("add", a=1),
        "So the answer is \\boxed{5}",
    ]
    engine = ScriptedEngine(tokenizer, replies, max_context=4096)
    env = CalcEnv()
    traj = run(run_episode(engine, env, TASK, tokenizer, GREEDY, seed=3))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "done"
    assert traj.num_turns == 3
    assert traj.turn_rewards == [0.0, 0.0, 1.0] and traj.reward == 1.0
    assert traj.env_info == {"n": 1} and traj.env_error is None
    assert traj.env_metrics == {
        "tool_calls": 6.0,
        "tool_ok": 3.0,
        "tool_errors": 3.0,
        "tool_error_unknown_tool": 1.0,
        "tool_error_bad_json": 1.0,
        "tool_error_invalid_args": 1.0,
    }
    tool_msgs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs[:4] == [
        "5",
        "2",
        "5.0",
        "error: unknown tool 'nope'; available tools: add, multiply",
    ]
    assert tool_msgs[4].startswith("error: tool call is not valid JSON")
    assert tool_msgs[5] == "error: invalid arguments for 'add': missing required argument 'b'"
    # Incremental rendering equals rendering the whole conversation at once; the
    # template only adds its separator after the final <|im_end|>.
    full = template_ids(tokenizer, traj, env.tools)
    ids = traj.prompt_ids + traj.response_ids
    assert full[: len(ids)] == ids and tokenizer.decode(full[len(ids) :]) == "\n"
    assert ids[-1] == tokenizer.eos_token_id
    # the tools were rendered into the prompt
    assert '"name": "add"' in traj.prompt_text and "The first addend." in traj.prompt_text
    # the env saw the parsed turns
    assert engine.calls[0][1].seed == 3 * 1009 and engine.calls[2][1].seed == 3 * 1009 + 2
    json.dumps(traj.to_json())


@pytest.mark.parametrize("template", TEMPLATES)
def test_turn_not_ended_by_end_of_turn_token_is_closed(template: str) -> None:
    """A turn stopped by another stop token (<|endoftext|>) or cut by length gets the
    template's end-of-turn token appended with loss mask 0, then the separator."""
    tokenizer = make_tokenizer(template)
    replies = [("first", ENDOFTEXT_ID), "a reply that is far too long to fit", "done"]
    engine = ScriptedEngine(tokenizer, replies)
    limits = EpisodeLimits(max_turns=3, continue_after_length=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    traj = run(run_episode(engine, EchoEnv(turns=3), TASK, tokenizer, params, limits))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "done" and traj.num_turns == 3
    (_, e0), (_, e1), _ = traj.turn_spans
    im_end, newline = tokenizer.eos_token_id, tokenizer.encode("\n")[0]
    assert traj.response_ids[e0 - 1] == ENDOFTEXT_ID
    assert traj.response_ids[e0 : e0 + 2] == [im_end, newline]
    assert engine.calls[1][2].finish_reason == "length"
    assert traj.response_ids[e1 : e1 + 2] == [im_end, newline]
    assert traj.loss_mask[e0 : e0 + 2] == [0, 0] == traj.loss_mask[e1 : e1 + 2]
    assert traj.messages[1] == {"role": "assistant", "content": "first"}


def test_stop_string_turns_keep_their_text_and_are_closed() -> None:
    """With a stop string (e.g. "</tool_call>") the turn ends without <|im_end|>: the text
    keeps the stop string (so the call parses) and the loop closes the turn."""
    tokenizer = make_tokenizer("tiny")
    replies = [(call("add", a=2, b=3), "</tool_call>"), "\\boxed{5}"]
    engine = ScriptedEngine(tokenizer, replies, max_context=4096)
    params = SamplingParams(temperature=0.0, max_new_tokens=160, stop_strings=("</tool_call>",))
    traj = run(run_episode(engine, CalcEnv(), TASK, tokenizer, params))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "done" and traj.reward == 1.0
    assert traj.env_metrics["tool_ok"] == 1.0
    end = traj.turn_spans[0][1]
    assert traj.response_ids[end - 1] == tokenizer.convert_tokens_to_ids("</tool_call>")
    assert traj.response_ids[end : end + 2] == [tokenizer.eos_token_id, tokenizer.encode("\n")[0]]
    assert traj.messages[2]["content"].endswith("</tool_call>")


def test_length_ends_episode_by_default() -> None:
    tokenizer = make_tokenizer("tiny")
    engine = ScriptedEngine(tokenizer, ["a reply that is far too long"])
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    env = EchoEnv()
    traj = run(run_episode(engine, env, TASK, tokenizer, params))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "length" and traj.truncated
    assert traj.num_turns == 1 and env.seen == [] and traj.turn_rewards == []
    assert traj.response_ids == engine.calls[0][2].token_ids  # nothing appended


def test_max_turns() -> None:
    tokenizer = make_tokenizer("tiny")
    engine = ScriptedEngine(tokenizer, ["again"])
    limits = EpisodeLimits(max_turns=4)
    traj = run(
        run_episode(engine, EchoEnv(turns=100, role="tool"), TASK, tokenizer, GREEDY, limits)
    )
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "max_turns" and traj.num_turns == 4
    assert traj.turn_rewards == [1.0, 2.0, 3.0, 4.0]
    assert traj.response_ids[-1] == tokenizer.eos_token_id  # no observation after the last turn
    assert "<tool_response>You wrote 3 tokens." in traj.response_text


def test_generated_token_budget_clips_the_last_turn() -> None:
    tokenizer = make_tokenizer("tiny")
    reply = "twelve tokens or so here"
    n = len(tokenizer.encode(reply)) + 1
    engine = ScriptedEngine(tokenizer, [reply])
    limits = EpisodeLimits(max_turns=10, max_generated_tokens=2 * n + 3)
    traj = run(run_episode(engine, EchoEnv(turns=10), TASK, tokenizer, GREEDY, limits))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "token_budget"
    assert traj.num_policy_tokens == 2 * n + 3
    assert [c[1].max_new_tokens for c in engine.calls] == [2 * n + 3, n + 3, 3]


def test_total_token_budget() -> None:
    tokenizer = make_tokenizer("tiny")
    engine = ScriptedEngine(tokenizer, ["ok"])
    prompt_len = len(tokenizer.apply_chat_template(TASK.messages(), add_generation_prompt=True))
    # Room for two turns and one observation, not for the second observation.
    limits = EpisodeLimits(max_turns=10, max_total_tokens=prompt_len + 40)
    traj = run(run_episode(engine, EchoEnv(turns=10), TASK, tokenizer, GREEDY, limits))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "token_budget" and traj.num_tokens < prompt_len + 40
    for prompt, params, _ in engine.calls:
        assert len(prompt) + params.max_new_tokens <= prompt_len + 40
    # The engine's own context is a limit too; a first observation that does not fit raises.
    small = ScriptedEngine(tokenizer, ["ok"], max_context=prompt_len)
    with pytest.raises(PromptTooLongError, match="t0"):
        run(run_episode(small, EchoEnv(), TASK, tokenizer, GREEDY))


def test_timeout_during_env_step_and_during_generation() -> None:
    tokenizer = make_tokenizer("tiny")
    limits = EpisodeLimits(timeout_s=0.3, max_turns=50)
    env = EchoEnv(turns=50)
    env.delay_s = 0.12
    engine = ScriptedEngine(tokenizer, ["hm"])
    traj = run(run_episode(engine, env, TASK, tokenizer, GREEDY, limits))
    assert traj.finish_reason == "timeout"
    assert 1 <= traj.num_turns <= 3
    check_token_io(traj, engine.calls)
    slow = ScriptedEngine(tokenizer, ["hm"], delay_s=10.0)
    traj = run(run_episode(slow, EchoEnv(), TASK, tokenizer, GREEDY, limits))
    assert traj.finish_reason == "timeout" and traj.num_turns == 0 and traj.response_ids == []


def test_env_errors_are_recorded_not_raised() -> None:
    tokenizer = make_tokenizer("tiny")
    engine = ScriptedEngine(tokenizer, ["x"])
    traj = run(run_episode(engine, EchoEnv(turns=5, fail_at=2), TASK, tokenizer, GREEDY))
    check_token_io(traj, engine.calls)
    assert traj.finish_reason == "env_error" and traj.num_turns == 2
    assert traj.env_error == "step 1: RuntimeError: backend went away"

    class BadReset(EchoEnv):
        async def reset(self, task: Task, seed: int | None = None) -> list[dict]:
            raise OSError("no sandbox")

    traj = run(run_episode(engine, BadReset(), TASK, tokenizer, GREEDY))
    assert traj.finish_reason == "env_error" and traj.env_error == "reset: OSError: no sandbox"
    assert traj.num_turns == 0 and traj.prompt_ids == [] and traj.num_tokens == 0


def test_run_episodes_groups_seeds_closing_and_stats() -> None:
    tokenizer = make_tokenizer("qwen_style")
    engine = ScriptedEngine(tokenizer, [call("add", a=2, b=3), "\\boxed{5}"])
    tasks = [Task(f"t{i}", f"What is {i} + 3?") for i in range(3)]
    envs: list[CalcEnv] = []

    def make_env(task: Task) -> CalcEnv:
        envs.append(CalcEnv())
        return envs[-1]

    groups = run(
        run_episodes(
            engine, make_env, tasks, tokenizer, GREEDY, seed=5, group_size=2, max_concurrency=4
        )
    )
    assert [[t.task_id for t in g] for g in groups] == [["t0", "t0"], ["t1", "t1"], ["t2", "t2"]]
    assert all(t.group_id == i for i, g in enumerate(groups) for t in g)
    assert len(envs) == 6 and all(e.closed for e in envs)
    # Calls of episode (i, j) carry seed (5 * 100003 + 2 i + j) * 1009 + turn.
    by_episode: dict[int, list] = {}
    for c in engine.calls:
        by_episode.setdefault(c[1].seed // 1009, []).append(c)
    for i, group in enumerate(groups):
        for j, traj in enumerate(group):
            episode_calls = sorted(by_episode[5 * 100003 + 2 * i + j], key=lambda c: c[1].seed)
            check_token_io(traj, episode_calls)
            assert traj.finish_reason == "done" and traj.reward == 1.0
    stats = episode_stats(t for g in groups for t in g)
    assert stats["episodes"] == 6.0 and stats["finish/done"] == 6.0
    assert stats["turns_mean"] == 2.0 and stats["tool_ok"] == 6.0 and stats["env_errors"] == 0.0


def test_run_episodes_records_close_errors_and_cancels_on_raise() -> None:
    tokenizer = make_tokenizer("tiny")
    engine = ScriptedEngine(tokenizer, ["x"])

    class BadClose(EchoEnv):
        async def close(self) -> None:
            raise RuntimeError("leak")

    (group,) = run(run_episodes(engine, lambda t: BadClose(turns=1), [TASK], tokenizer, GREEDY))
    assert group[0].env_info["close_error"] == "RuntimeError: leak"
    with pytest.raises(ValueError, match="group_size"):
        run(run_episodes(engine, lambda t: EchoEnv(), [TASK], tokenizer, GREEDY, group_size=0))
    long_task = Task("long", "word " * 600)
    with pytest.raises(PromptTooLongError, match="long"):
        run(run_episodes(engine, lambda t: EchoEnv(), [TASK, long_task], tokenizer, GREEDY))


# ----------------------------------------------------------------------------- native engine


@pytest.mark.parametrize("template", TEMPLATES)
def test_native_engine_episodes_are_token_exact(template: str, tiny_model: Any) -> None:
    """The real engine on the tiny model: sampled turns (ending on <|im_end|>, on
    <|endoftext|> or cut by length) spliced with rendered observations."""
    tokenizer = make_tokenizer(template)
    native = NativeEngine(tiny_model, tokenizer, max_slots=16, seed=0)
    try:
        check_engine_episodes(native, tokenizer)
    finally:
        run(native.close())


@pytest.mark.vllm
@pytest.mark.parametrize("template", TEMPLATES)
def test_vllm_engine_episodes_are_token_exact(template: str) -> None:
    """The same episodes through vLLM (runs in .venv-vllm)."""
    pytest.importorskip("vllm")
    from temper.engine.vllm_engine import VLLMEngine
    from temper.models import resolve_model_path

    tokenizer = make_tokenizer(template)
    engine = VLLMEngine(str(resolve_model_path("tiny")), tokenizer)
    try:
        check_engine_episodes(engine, tokenizer)
    finally:
        run(engine.close())


def check_engine_episodes(inner: Any, tokenizer: Any) -> None:
    """Three-turn tool episodes on ``inner``: every turn's input is the trajectory so
    far, and the trajectory holds exactly what the engine sampled."""
    engine = RecordingProxy(inner)
    assert isinstance(engine, Engine)
    tasks = [Task("a", "What is 2 + 3?"), Task("b", "What is 7 + 1?")]
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    limits = EpisodeLimits(max_turns=3, continue_after_length=True)

    async def go() -> list[list[Trajectory]]:
        return await run_episodes(
            engine, lambda t: EchoEnv(turns=3, role="tool"), tasks, tokenizer, params, limits,
            seed=11, group_size=2,
        )  # fmt: skip

    groups = run(go())
    by_episode: dict[int, list] = {}
    for c in engine.calls:
        by_episode.setdefault(c[1].seed // 1009, []).append(c)
    reasons = set()
    for i, group in enumerate(groups):
        for j, traj in enumerate(group):
            check_token_io(
                traj, sorted(by_episode[11 * 100003 + 2 * i + j], key=lambda c: c[1].seed)
            )
            assert traj.finish_reason == "done" and traj.num_turns == 3
            assert set(traj.versions) <= {0, -1}
            reasons |= {c[2].finish_reason for c in by_episode[11 * 100003 + 2 * i + j]}
            # Every observation is the template's rendering of the tool message.
            for (_, end), (start, _) in zip(traj.turn_spans, traj.turn_spans[1:], strict=False):
                text = tokenizer.decode(traj.response_ids[end:start])
                assert "<tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    assert reasons <= {"stop", "length"}


def test_a_raising_tool_call_parser_becomes_an_error_observation() -> None:
    tokenizer = make_tokenizer("tiny")
    engine = ScriptedEngine(tokenizer, [call("add", a=2, b=3), "\\boxed{5}"])
    seen: list[str] = []

    def fragile(text: str):
        seen.append(text)
        if "<tool_call>" in text:
            raise KeyError("arguments")
        return [], []

    groups = run(
        run_episodes(
            engine, lambda task: CalcEnv(), [TASK], tokenizer, GREEDY, group_size=2, parser=fragile
        )
    )
    for traj in groups[0]:
        assert traj.finish_reason == "done" and traj.env_error is None and traj.reward == 1.0
        tool_msgs = [m["content"] for m in traj.messages if m["role"] == "tool"]
        assert tool_msgs == ["error: the tool-call parser raised KeyError: 'arguments'"]
        assert traj.env_metrics["tool_error_parser_error"] == 1.0
    assert len(seen) == 4
