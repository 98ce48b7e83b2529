"""`temper serve` for real: the tiny model on the native engine behind uvicorn, driven
by the official `openai` client; a scripted engine for tool calls and server faults."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch

from fp32 import ENGINE_PARITY
from scripted_engine import ScriptedEngine
from temper.cli.main import main as cli_main
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.serve import start_server

USER = [{"role": "user", "content": "What is 2+3?"}]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = NativeEngine(load_model("tiny"), tokenizer)
    handle = start_server(engine, tokenizer, "127.0.0.1", 0, model_name="tiny")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)


def prompt_ids(tokenizer, messages, tools=None) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_chat_n2_logprobs_usage_and_token_ids(client, tokenizer):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        n=2,
        seed=3,
        temperature=1.0,
        max_tokens=12,
        logprobs=True,
        top_logprobs=0,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in r.choices] == [0, 1]
    expected_prompt = prompt_ids(tokenizer, USER)
    assert r.model_extra["prompt_token_ids"] == expected_prompt
    assert r.usage.prompt_tokens == len(expected_prompt)
    sampled = 0
    for c in r.choices:
        ids = c.model_extra["token_ids"]
        lps = [t.logprob for t in c.logprobs.content]
        assert 1 <= len(ids) <= 12 and len(lps) == len(ids)
        assert all(lp <= 0 for lp in lps)
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert len(ids) == 12
        assert c.message.role == "assistant"
        assert c.message.content == tokenizer.decode(ids, skip_special_tokens=True)
        sampled += len(ids)
    assert r.usage.completion_tokens == sampled
    assert r.usage.total_tokens == r.usage.prompt_tokens + sampled


def test_chat_seed_reproducible(client):
    def ask(seed):
        r = client.chat.completions.create(
            model="tiny", messages=USER, n=2, seed=seed, max_tokens=10, logprobs=True
        )
        return [(c.message.content, [t.token for t in c.logprobs.content]) for c in r.choices]

    assert ask(11) == ask(11)


def test_max_tokens_and_max_completion_tokens(client):
    for kwargs in ({"max_tokens": 2}, {"max_completion_tokens": 2, "max_tokens": 50}):
        r = client.chat.completions.create(
            model="tiny", messages=USER, n=3, seed=1, logprobs=True, **kwargs
        )
        for c in r.choices:
            assert len(c.logprobs.content) <= 2
            assert c.finish_reason == "length" or len(c.logprobs.content) < 2
        assert r.usage.completion_tokens <= 6


def test_stop_string_is_honoured_and_cut(client):
    base = client.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=24)
    text = base.choices[0].message.content
    assert len(text) >= 6, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    r = client.chat.completions.create(
        model="tiny", messages=USER, temperature=0, max_tokens=24, stop=[stop]
    )
    assert r.choices[0].message.content == text[: text.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    # A plain string works too.
    r2 = client.chat.completions.create(
        model="tiny", messages=USER, temperature=0, max_tokens=24, stop=stop
    )
    assert r2.choices[0].message.content == r.choices[0].message.content


def test_completions_text_batch_and_ids(client, tokenizer):
    r = client.completions.create(
        model="tiny", prompt="Hello", n=2, seed=5, max_tokens=6, logprobs=0
    )
    assert len(r.choices) == 2
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) >= 1
        assert all(x <= 0 for x in lp.token_logprobs)
    assert r.usage.prompt_tokens == len(tokenizer("Hello")["input_ids"])
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    batch = client.completions.create(model="tiny", prompt=["Hi", "Bye"], n=2, max_tokens=3)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    ids = tokenizer("Hello")["input_ids"]
    same = client.completions.create(model="tiny", prompt=ids, n=2, seed=5, max_tokens=6)
    assert [c.text for c in same.choices] == [c.text for c in r.choices]


def test_echo_with_max_tokens_0_scores_the_prompt(client, tokenizer):
    """OpenAI's legacy scoring request (vLLM answers it too): the prompt's own tokens'
    logprobs, the first one null, equal to a forward of the served weights; a
    distillation teacher behind `temper serve` is asked exactly this."""
    ids = tokenizer("What is 12 + 30? The answer is 42.")["input_ids"]
    r = client.completions.create(
        model="tiny", prompt=[ids, ids[:5]], max_tokens=0, echo=True, logprobs=2,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    first, short = r.choices
    lp = first.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    model = load_model("tiny")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor([ids[1:]]).T)[:, 0]
    torch.testing.assert_close(torch.tensor(lp.token_logprobs[1:]), want, **ENGINE_PARITY)
    assert lp.tokens == [tokenizer.decode([t]) for t in ids]
    assert all(len(alts) == 2 for alts in lp.top_logprobs[1:])
    assert first.text == tokenizer.decode(ids) and first.finish_reason == "length"
    assert first.model_extra["prompt_token_ids"] == ids and first.model_extra["token_ids"] == []
    assert len(short.logprobs.token_logprobs) == 5
    assert r.usage.prompt_tokens == len(ids) + 5 and r.usage.completion_tokens == 0
    # A sequence that fills the whole context may be scored (nothing is generated).
    full = client.completions.create(
        model="tiny", prompt=[5] * 512, max_tokens=0, echo=True, logprobs=0
    )
    assert len(full.choices[0].logprobs.token_logprobs) == 512
    for kwargs, param, words in [
        ({"max_tokens": 3}, "echo", "echo=true is supported with max_tokens = 0"),
        ({"max_tokens": 0, "stream": True}, "stream", "does not stream"),
        ({"max_tokens": 0, "n": 2}, "n", "n must be 1"),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="tiny", prompt=ids, echo=True, **kwargs)
        assert info.value.param == param and words in info.value.message, info.value.message


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny"


@pytest.mark.parametrize(
    ("kwargs", "error", "param", "words"),
    [
        ({"model": "nope"}, openai.NotFoundError, "model", "does not exist"),
        ({"n": 0}, openai.BadRequestError, "n", "n must be at least 1"),
        ({"messages": []}, openai.BadRequestError, "messages", "non-empty"),
        ({"top_logprobs": 21, "logprobs": True}, openai.BadRequestError, "top_logprobs", "[0, 20]"),
        ({"top_logprobs": 3}, openai.BadRequestError, "top_logprobs", "logprobs=true"),
        ({"temperature": -1}, openai.BadRequestError, "temperature", ">= 0"),
        ({"max_tokens": 0}, openai.BadRequestError, "max_tokens", "at least 1"),
        (
            {"messages": [{"role": "robot", "content": "x"}]},
            openai.BadRequestError,
            "messages[0].role",
            "role",
        ),
        (
            {"messages": [{"role": "user"}]},
            openai.BadRequestError,
            "messages[0].content",
            "missing",
        ),
        ({"tool_choice": "required"}, openai.BadRequestError, "tools", "non-empty tools"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "mul"}}, "tools": [ADD_TOOL]},
            openai.BadRequestError,
            "tool_choice",
            "not in tools",
        ),
        (
            {"tool_choice": "always", "tools": [ADD_TOOL]},
            openai.BadRequestError,
            "tool_choice",
            "'required'",
        ),
        ({"presence_penalty": 2.5}, openai.BadRequestError, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -3}, openai.BadRequestError, "frequency_penalty", "[-2, 2]"),
        (
            {"response_format": {"type": "xml"}},
            openai.BadRequestError,
            "response_format.type",
            "json_schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
            openai.BadRequestError,
            "response_format.json_schema",
            "schema",
        ),
        (
            {"stream_options": {"include_usage": True}},
            openai.BadRequestError,
            "stream_options",
            "stream=true",
        ),
        ({"stop": [""]}, openai.BadRequestError, "stop", "non-empty"),
    ],
)
def test_bad_chat_requests_get_openai_errors(client, kwargs, error, param, words):
    request = {"model": "tiny", "messages": USER, "max_tokens": 4, **kwargs}
    with pytest.raises(error) as info:
        client.chat.completions.create(**request)
    assert info.value.param == param
    assert info.value.type == "invalid_request_error"
    assert words in info.value.message and "\n" not in info.value.message


def test_prompt_longer_than_context(client):
    long = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=long, max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    assert "512 tokens" in info.value.message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="word " * 2000, max_tokens=4)


def test_malformed_bodies_and_routes(server, client):
    url = f"{server.base_url}/chat/completions"
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (json.dumps({"model": "tiny", "messages": USER, "n": "two"}).encode(), 400, "invalid n"),
        (json.dumps({"messages": USER}).encode(), 400, "invalid model"),
    ]
    for body, status, words in cases:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status
        err = r.json()["error"]
        assert words in err["message"] and set(err) >= {"message", "type", "param"}
    r = httpx.get(f"{server.base_url}/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(url)
    assert r.status_code == 405 and "error" in r.json()
    # Still serving after all that.
    ok = client.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert ok.choices[0].message.role == "assistant"


def tool_reply(prompt: str, index: int) -> str:
    if "<tool_response>" in prompt:
        return "The answer is 5."
    return 'Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_tool_call_round_trip(tokenizer):
    engine = ScriptedEngine(tokenizer, [tool_reply], by="call")
    with start_server(engine, tokenizer, model_name="scripted") as handle:
        client = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        first = client.chat.completions.create(model="scripted", messages=USER, tools=[ADD_TOOL])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me add."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "add"
        assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
        # The tools were rendered into the prompt by the chat template.
        assert engine.prompt_ids[0] == prompt_ids(tokenizer, USER, [ADD_TOOL])
        assert '"name": "add"' in engine.prompts[0]

        history = [
            *USER,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        second = client.chat.completions.create(
            model="scripted", messages=history, tools=[ADD_TOOL]
        )
        assert second.choices[0].message.content == "The answer is 5."
        assert second.choices[0].message.tool_calls is None
        assert second.choices[0].finish_reason == "stop"
        sent = engine.prompts[1]
        assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in sent
        assert "<tool_response>5</tool_response>" in sent

        # Without tools (or with tool_choice="none") the text is returned as is.
        for extra in ({}, {"tools": [ADD_TOOL], "tool_choice": "none"}):
            plain = client.chat.completions.create(model="scripted", messages=USER, **extra)
            assert plain.choices[0].message.tool_calls is None
            assert "<tool_call>" in plain.choices[0].message.content


def test_malformed_tool_call_stays_in_content(tokenizer):
    reply = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>\n'
        "<tool_call>{not json}</tool_call>"
    )
    engine = ScriptedEngine(tokenizer, [reply], by="call")
    with start_server(engine, tokenizer, model_name="scripted") as handle:
        client = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        msg = (
            client.chat.completions.create(model="scripted", messages=USER, tools=[ADD_TOOL])
            .choices[0]
            .message
        )
    assert [c.function.name for c in msg.tool_calls] == ["add"]
    assert msg.content == "<tool_call>{not json}</tool_call>"


def test_engine_failure_is_a_500_and_the_server_survives(tokenizer):
    def reply(prompt: str, index: int) -> str:
        if "BOOM" in prompt:
            raise RuntimeError("engine exploded")
        return "fine"

    engine = ScriptedEngine(tokenizer, [reply], by="call")
    with start_server(engine, tokenizer, model_name="scripted") as handle:
        client = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "BOOM"}]
            )
        assert "engine exploded" in info.value.message
        ok = client.chat.completions.create(model="scripted", messages=USER)
        assert ok.choices[0].message.content == "fine"


def test_restart_on_the_same_native_engine(tokenizer):
    engine = NativeEngine(load_model("tiny"), tokenizer)
    for _ in range(2):
        t0 = time.monotonic()
        handle = start_server(engine, tokenizer, model_name="tiny")
        client = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=3, seed=0)
        assert r.choices[0].message.role == "assistant"
        handle.stop()
        assert time.monotonic() - t0 < 20
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{handle.url}/health")


def test_cli_serve_bad_port_is_one_line(capsys):
    assert cli_main(["serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("temper: error: cannot listen on 127.0.0.1:70000") and "\n" not in err


def test_cli_serve_runs_and_stops_on_ctrl_c():
    proc = subprocess.Popen(
        [sys.executable, "-m", "temper.cli.main", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "temper serve: tiny (native engine) at http://127.0.0.1:" in line, line
        base = line.rsplit(" at ", 1)[1].strip()
        # The URL is printed once the port accepts connections: no retrying needed.
        port = int(base.removesuffix("/v1").rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        health = httpx.get(base.removesuffix("/v1") + "/health", timeout=10)
        assert health.json()["status"] == "ok"
        proc.send_signal(2)  # SIGINT, as Ctrl-C: uvicorn shuts down, then re-raises it
        assert proc.wait(timeout=30) == 130
        err = proc.stderr.read()
        assert "temper: interrupted" in err and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
