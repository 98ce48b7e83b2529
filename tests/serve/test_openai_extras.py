"""`temper serve` as a drop-in for vLLM's OpenAI server: streaming, top-k logprobs,
penalties, forced tool calls and JSON output, driven by the official `openai` client
against the tiny model on the native engine (a real server on 127.0.0.1)."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema
import openai
import pytest

from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.serve import start_server

USER = [{"role": "user", "content": "What is 2+3?"}]
ADD_PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": ADD_PARAMS}}
ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 8}},
            "required": ["text"],
        },
    },
}
VERDICT = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
        "label": {"enum": ["yes", "no"]},
    },
    "required": ["ok", "score", "label"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server():
    tokenizer = load_tokenizer("tiny")
    engine = NativeEngine(load_model("tiny"), tokenizer)
    handle = start_server(engine, tokenizer, "127.0.0.1", 0, model_name="tiny")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)


def collect_chat(stream) -> tuple[dict[int, str], dict[int, str], list, object]:
    """Concatenated content and finish reason per choice, logprob entries, usage."""
    text: dict[int, str] = {}
    finish: dict[int, str] = {}
    logprobs: dict[int, list] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            if c.logprobs is not None:
                logprobs.setdefault(c.index, []).extend(c.logprobs.content)
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    return text, finish, logprobs, usage


def test_chat_stream_concatenates_to_the_non_streamed_reply(client):
    request = dict(model="tiny", messages=USER, n=2, seed=11, max_tokens=14, logprobs=True)
    whole = client.chat.completions.create(**request)
    stream = client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    text, finish, logprobs, usage = collect_chat(stream)
    for c in whole.choices:
        assert text[c.index] == c.message.content
        assert finish[c.index] == c.finish_reason
        assert [t.token for t in logprobs[c.index]] == [t.token for t in c.logprobs.content]
    assert usage.model_dump() == whole.usage.model_dump()


def test_stream_without_usage_ends_with_done(server):
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 4, "stream": True, "seed": 1}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_completion_stream_matches_with_top_logprobs(client):
    request = dict(model="tiny", prompt=["Hello", "Bye"], n=2, seed=5, max_tokens=8, logprobs=2)
    whole = client.completions.create(**request)
    text: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    usage = None
    for chunk in client.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    ):
        usage = chunk.usage or usage
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + c.text
            if c.logprobs is not None:
                tokens.setdefault(c.index, []).extend(c.logprobs.tokens)
                assert len(c.logprobs.top_logprobs) == len(c.logprobs.tokens)
    assert len(whole.choices) == 4
    for c in whole.choices:
        assert text[c.index] == c.text
        assert tokens[c.index] == c.logprobs.tokens
        for alts in c.logprobs.top_logprobs:
            assert 1 <= len(alts) <= 2 and all(v <= 0 for v in alts.values())
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_chat_top_logprobs_are_the_best_alternatives(client):
    r = client.chat.completions.create(
        model="tiny", messages=USER, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    for entry in r.choices[0].logprobs.content:
        alts = entry.top_logprobs
        assert len(alts) == 3
        values = [a.logprob for a in alts]
        assert values == sorted(values, reverse=True)
        # Greedy: the sampled token is the best one, with the same raw logprob.
        assert alts[0].token == entry.token
        assert math.isclose(alts[0].logprob, entry.logprob, rel_tol=1e-6, abs_tol=1e-6)


def test_penalties_change_sampling_not_the_reported_logprobs(client):
    # Greedy, this prompt repeats digits ("222350"); penalised, it does not.
    base = dict(model="tiny", prompt="The cat sat on the", temperature=0, max_tokens=24, logprobs=0)
    plain = client.completions.create(**base).choices[0].logprobs
    assert len(set(plain.tokens)) < len(plain.tokens), "greedy tiny model should repeat"
    for kwargs in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        out = client.completions.create(**base, **kwargs).choices[0].logprobs
        assert len(set(out.tokens)) > len(set(plain.tokens))
        # Up to the first token the penalty changed, the raw logprobs are the same.
        same = next(
            i for i, (a, b) in enumerate(zip(out.tokens, plain.tokens, strict=False)) if a != b
        )
        assert same > 0
        assert out.token_logprobs[:same] == pytest.approx(plain.token_logprobs[:same], rel=1e-5)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "echo"}}]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_forced_tool_choice_gives_a_valid_call(client, tool_choice, seed):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[ADD_TOOL, ECHO_TOOL],
        tool_choice=tool_choice,
        seed=seed,
        max_tokens=60,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    if isinstance(tool_choice, dict):
        assert call.function.name == "echo"
    tool = {"add": ADD_TOOL, "echo": ECHO_TOOL}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_forced_tool_call_streams_as_a_tool_call_delta(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[ADD_TOOL],
        tool_choice="required",
        seed=3,
        max_tokens=60,
        stream=True,
    )
    calls, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            calls.extend(c.delta.tool_calls or [])
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    [call] = calls
    assert call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), ADD_PARAMS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_response_format_json_schema_output_validates(client, seed):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        seed=seed,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": VERDICT}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), VERDICT)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_response_format_json_object_output_parses(client, temperature):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        seed=4,
        temperature=temperature,
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("name", ["temperature", "top_p", "presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_400s(server, name, value):
    # Python's json writes NaN/Infinity, as the openai client would send them.
    body = json.dumps({"model": "tiny", "messages": USER, "max_tokens": 2, name: value})
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "\n" not in error["message"]


ENGINES = {"native": NativeEngine, "hf": HFEngine}


@pytest.mark.parametrize("engine_type", ["native", "hf"])
def test_streamed_text_stops_where_the_stop_string_starts(engine_type):
    # Greedy, the prompt continues " digits of 222350?": the stream must hold back "3"
    # and "35" (they may start the stop string) and never send text past it. The HF
    # engine does not stream tokens: its samples are sent whole, to the same text.
    tokenizer = load_tokenizer("tiny")
    engine = ENGINES[engine_type](load_model("tiny"), tokenizer)
    handle = start_server(engine, tokenizer, "127.0.0.1", 0, model_name="tiny")
    try:
        client = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0, timeout=60)
        request = dict(model="tiny", prompt="The cat sat on the", temperature=0, max_tokens=16)
        for stop in ("350", "?"):
            whole = client.completions.create(**request, stop=stop).choices[0]
            assert whole.finish_reason == "stop" and stop not in whole.text
            pieces = [
                c.choices[0].text
                for c in client.completions.create(**request, stop=stop, stream=True)
                if c.choices
            ]
            assert "".join(pieces) == whole.text
            sent = sum(1 for p in pieces if p)
            assert sent > 1 if engine_type == "native" else sent == 1
    finally:
        handle.stop()


def test_closing_a_stream_early_cancels_the_generation(server, client):
    stream = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=400, seed=2, stream=True, stop=["\u2603"]
    )
    next(iter(stream))
    stream.close()
    # The server keeps serving; the abandoned request does not hold its rows forever.
    r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=4, seed=1)
    assert r.choices[0].message.content is not None


def test_a_schema_xgrammar_cannot_compile_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=USER,
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert info.value.param == "response_format"
    assert info.value.message.endswith('cannot build a grammar: Unsupported type "nonsense"')


def test_an_engine_refusal_of_a_stream_is_a_400_before_any_event(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="Hi", n=5000, max_tokens=2, stream=True)
    assert "max_slots" in info.value.message
