"""The rollout gateway with the tiny model on the native engine, driven by the real
`openai` client over HTTP on 127.0.0.1: token-exact rows call by call, a history
edit that starts a new row (the break counted), a re-spaced tool call repaired by
splicing (or a break with ``splice`` off), run sampling, limits, and bad requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from temper.config.env import EpisodeLimits
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.serve.gateway import AgentGateway

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
RUN = SamplingParams(temperature=1.0, max_new_tokens=48)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def engine(tokenizer: Any) -> NativeEngine:
    return NativeEngine(load_model("tiny"), tokenizer)


class Recording:
    """The engine under the gateway, remembering what it was fed and what it sampled."""

    def __init__(self, engine: NativeEngine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name: str) -> Any:  # a test double: forward the rest
        return getattr(self.engine, name)

    async def generate(self, ids: list[int], params: SamplingParams) -> Any:
        result = await self.engine.generate(ids, params)
        self.calls.append((list(ids), list(result.samples[0].token_ids), params))
        return result


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with_gateway(engine: Any, tokenizer: Any, body: Any, **open_kw: Any) -> Any:
    gw = AgentGateway(engine, tokenizer, "tiny")
    await gw.start()
    try:
        session = gw.open(RUN, open_kw.pop("limits", EpisodeLimits(max_turns=6)), seed=7, **open_kw)
        client = AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
        try:
            return session, await body(client, session, gw)
        finally:
            await client.close()
    finally:
        await gw.stop()


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_multi_call_episode_is_one_token_exact_row(engine, tokenizer):
    rec = Recording(engine)

    async def body(client: AsyncOpenAI, session: Any, gw: Any) -> list[Any]:
        messages = _user("What is 347 * 58?")
        replies = []
        for turn in range(3):
            r = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
            msg = r.choices[0].message
            replies.append(msg)
            messages.append(msg.model_dump(exclude_none=True))
            messages.append(
                {"role": "tool", "tool_call_id": "c", "content": json.dumps({"result": turn})}
            )
        return replies

    session, _replies = run(_with_gateway(rec, tokenizer, body))
    rows = session.record.rows
    assert len(rec.calls) == 3 and len(rows) == 1
    row = rows[0]
    ids = row.prompt_ids + row.response_ids
    # Call by call: the engine was fed exactly the row so far, and the row holds exactly
    # what it sampled, with loss mask 1 on sampled tokens and 0 on everything between.
    for k, (fed, sampled, _) in enumerate(rec.calls):
        assert ids[: len(fed)] == fed
        start, end = row.turn_spans[k]
        assert row.response_ids[start:end] == sampled
        assert ids[len(fed) : len(fed) + len(sampled)] == sampled
        assert all(row.loss_mask[start:end]) and len(row.logprobs) == len(row.response_ids)
    assert sum(row.loss_mask) == sum(len(s) for _, s, _ in rec.calls)
    assert row.versions[row.turn_spans[0][0]] == engine.version
    assert session.record.breaks == {} and session.record.calls == 3
    # The run's sampling, not the agent's: temperature from the run, a per-call seed.
    seeds = [p.seed for _, _, p in rec.calls]
    assert all(p.temperature == 1.0 for _, _, p in rec.calls) and len(set(seeds)) == 3


def test_edited_history_starts_a_new_row_and_counts_the_break(engine, tokenizer):
    async def body(client: AsyncOpenAI, session: Any, gw: Any) -> None:
        first = _user("What is 2 + 3?")
        r = await client.chat.completions.create(model="tiny", messages=first)
        follow = [*first, r.choices[0].message.model_dump(exclude_none=True)]
        follow.append({"role": "user", "content": "Are you sure?"})
        await client.chat.completions.create(model="tiny", messages=follow)  # extends
        edited = [{"role": "user", "content": "What is 2 + 4?"}, *follow[1:]]  # rewrote turn 0
        await client.chat.completions.create(model="tiny", messages=edited)

    session, _ = run(_with_gateway(engine, tokenizer, body))
    rec = session.record
    assert len(rec.rows) == 2 and rec.calls == 3
    assert rec.breaks == {"new_conversation": 1}
    assert len(rec.rows[0].turn_spans) == 2 and len(rec.rows[1].turn_spans) == 1
    assert rec.metrics()["agent_break_new_conversation"] == 1.0


def test_an_edit_in_the_middle_of_the_history_starts_a_new_row(engine, tokenizer):
    """The agent rewrites what the model said two calls ago (the first message kept):
    a new row, the break counted as ``edited_history``; the first row keeps its ids."""

    async def body(client: AsyncOpenAI, session: Any, gw: Any) -> None:
        messages = _user("What is 2 + 3?")
        r = await client.chat.completions.create(model="tiny", messages=messages)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "Show your work."})
        r = await client.chat.completions.create(model="tiny", messages=messages)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages[1] = {"role": "assistant", "content": "The answer is \\boxed{5}."}
        messages.append({"role": "user", "content": "Thanks."})
        await client.chat.completions.create(model="tiny", messages=messages)

    rec = Recording(engine)
    session, _ = run(_with_gateway(rec, tokenizer, body))
    record = session.record
    assert record.calls == 3 and len(record.rows) == 2
    assert record.breaks == {"edited_history": 1} and record.repairs == {}
    first, second = record.rows
    assert len(first.turn_spans) == 2 and len(second.turn_spans) == 1
    # The new row starts from what the engine was fed for the edited call.
    assert second.prompt_ids == rec.calls[2][0]
    assert first.prompt_ids + first.response_ids == rec.calls[1][0] + rec.calls[1][1]
    assert record.metrics()["agent_break_edited_history"] == 1.0
    assert record.metrics()["agent_rows"] == 2.0


def test_a_respaced_tool_call_is_spliced_or_breaks(engine, tokenizer):
    """The agent sends its tool call back with the arguments re-spaced: the messages are the
    same conversation, the rendered ids are not. Splicing feeds the sampled ids; with
    splice off a new row starts. Either way the cause is counted."""

    async def body(client: AsyncOpenAI, session: Any, gw: Any) -> None:
        messages = _user("What is 347 * 58?")
        r = await client.chat.completions.create(model="tiny", messages=messages)
        text = r.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        # The same turn as far as messages go, but the agent re-wrote its text with
        # different spacing: an "edit" only of whitespace, like a re-serialised tool call.
        messages[-1]["content"] = "  " + text.replace(" ", "  ") + "  "
        messages.append({"role": "user", "content": "And then?"})
        await client.chat.completions.create(model="tiny", messages=messages)

    spliced, _ = run(_with_gateway(engine, tokenizer, body))
    assert len(spliced.record.rows) == 1 and spliced.record.breaks == {}
    assert sum(spliced.record.repairs.values()) == 1
    broke, _ = run(_with_gateway(engine, tokenizer, body, splice=False))
    assert len(broke.record.rows) == 2 and sum(broke.record.breaks.values()) == 1


def test_limits_and_bad_requests_are_one_line_errors(engine, tokenizer):
    async def body(client: AsyncOpenAI, session: Any, gw: Any) -> dict[str, str]:
        errors = {}
        with pytest.raises(BadRequestError) as n2:
            await client.chat.completions.create(model="tiny", messages=_user("hi"), n=2)
        errors["n"] = n2.value.message
        await client.chat.completions.create(model="tiny", messages=_user("hi"))
        await client.chat.completions.create(model="tiny", messages=_user("hi"))
        with pytest.raises(BadRequestError) as turns:
            await client.chat.completions.create(model="tiny", messages=_user("hi"))
        errors["turns"] = turns.value.message
        async with httpx.AsyncClient() as http:
            bad = await http.post(f"{session.base_url}/chat/completions", content=b"{not json")
            errors["json"] = (bad.status_code, bad.json()["error"]["message"])
            lost = await http.post(f"{gw.url}/sessions/nope/v1/chat/completions", json={})
            errors["unknown"] = (lost.status_code, lost.json()["error"]["message"])
            reward = session.base_url.removesuffix("/v1") + "/reward"
            nan = await http.post(reward, content=b'{"reward": "high"}')
            errors["reward"] = (nan.status_code, nan.json()["error"]["message"])
            ok = await http.post(reward, json={"reward": 0.5})
            assert ok.status_code == 200
        gw.close(session.record.id)
        with pytest.raises(NotFoundError):
            await client.chat.completions.create(model="tiny", messages=_user("hi"))
        return errors

    session, errors = run(_with_gateway(engine, tokenizer, body, limits=EpisodeLimits(max_turns=2)))
    assert "n must be 1" in errors["n"]
    assert "max_turns = 2" in errors["turns"] and session.cut == "max_turns"
    assert errors["json"][0] == 400
    assert errors["unknown"][0] == 404 and "unknown session 'nope'" in errors["unknown"][1]
    assert errors["reward"][0] == 400 and "reward" in errors["reward"][1]
    assert session.posted_reward == 0.5 and session.record.calls == 2
