"""Both servers under hostile requests: client mistakes are 4xx in the server's JSON error
format (never 500), bodies are limited (413) and read with deadlines (408, closed
connections), a bad pair in `serve-rm` fails alone, and requests stay parseable under
property-based fuzzing. Real servers on 127.0.0.1: the tiny model on the native engine,
and the shipped tiny reward model."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scripted_engine import ScriptedEngine
from temper import compute
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.rewards.rm_batcher import RewardModelBatcher, load_reward_model
from temper.rewards.rm_scoring import UnscorablePair, score_pairs, score_pairs_each
from temper.serve import start_server
from temper.serve.limits import HTTPLimits
from temper.serve.protocol import APIError, ChatRequest, CompletionRequest, parse_body
from temper.serve.reward_model import parse_score_request, start_rm_server

USER = [{"role": "user", "content": "What is 2+3?"}]
DEEP = "[" * 100_000
HUGE_INT = "9" * 5000
# A small body limit; timeouts generous enough that a loaded machine never trips them.
SMALL = HTTPLimits(max_body_bytes=64 * 1024, header_timeout_s=30, body_timeout_s=30)
# Short timeouts, only for the servers of the slow-client tests. The head's is the
# longer, so a head sent at once is always read before it can expire.
SHORT = HTTPLimits(max_body_bytes=64 * 1024, header_timeout_s=2, body_timeout_s=0.5)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def llm(tokenizer):
    engine = NativeEngine(load_model("tiny"), tokenizer)
    with start_server(engine, tokenizer, model_name="tiny", limits=SMALL) as handle:
        yield handle


@pytest.fixture(scope="module")
def rm_loaded():
    return load_reward_model("tiny-rm")


@pytest.fixture(scope="module")
def rm(rm_loaded):
    handle, _ = start_rm_server(rm_loaded, max_batch_size=64, max_wait_ms=20, limits=SMALL)
    yield handle
    handle.stop()


def chat(**fields) -> bytes:
    return json.dumps({"model": "tiny", "messages": USER, "max_tokens": 2, **fields}).encode()


def raw_chat(fragment: str) -> bytes:
    """A chat body with ``fragment`` (raw JSON text) as the value of "n"."""
    return b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": ' + (
        fragment.encode() + b"}"
    )


def assert_openai_error(reply: httpx.Response, status: int | None = None) -> dict:
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text[:300])
    if status is not None:
        assert reply.status_code == status, reply.text[:300]
    err = reply.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "\n" not in err["message"] and "Traceback" not in err["message"]
    return err


CHAT_MISTAKES = {
    "deep_array": raw_chat(DEEP),
    "deep_closed": raw_chat("[" * 5000 + "]" * 5000),
    "deep_object_in_content": json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    ).encode()[:-1]
    + b', "tools": '
    + b'{"a":' * 3000
    + b"1"
    + b"}" * 3001,
    "huge_int_n": raw_chat(HUGE_INT),
    "huge_int_seed": chat(seed=1)[:-1] + b', "seed": ' + HUGE_INT.encode() + b"}",
    "seed_over_64_bits": chat(seed=2**70),
    "lone_surrogate_escape": chat(messages=[{"role": "user", "content": "\ud800"}]),
    "lone_surrogate_raw_bytes": chat().replace(b"What", b"\xed\xa0\x80"),
    "invalid_utf8": chat().replace(b"What", b"\xff\xfe"),
    "nan_temperature": chat()[:-1] + b', "temperature": NaN}',
    "infinite_top_p": chat()[:-1] + b', "top_p": 1e999}',
    "messages_not_a_list": chat(messages="hello"),
    "content_is_a_number": chat(messages=[{"role": "user", "content": 5}]),
    "content_part_not_text": chat(messages=[{"role": "user", "content": [{"type": "image"}]}]),
    "tools_not_a_list": chat(tools={"a": 1}),
    "tool_without_function": chat(tools=[{"type": "function"}]),
    "assistant_tool_calls_wrong": chat(
        messages=[*USER, {"role": "assistant", "tool_calls": [{"x": 1}]}]
    ),
    "n_too_large": chat(n=10**9),
    "stop_token_out_of_vocab": chat(stop_token_ids=[10**12]),
    "empty_body": b"",
    "body_is_a_string": b'"hello"',
}

COMPLETION_MISTAKES = {
    "ids_out_of_vocab": {"prompt": [1, 2, 10**9]},
    "negative_id": {"prompt": [1, -5]},
    "nested_ids_out_of_vocab": {"prompt": [[1, 2], [3, 10**6]]},
    "floats_as_ids": {"prompt": [1.5, 2.5]},
    "empty_id_list": {"prompt": [[]]},
    "mixed_prompt": {"prompt": [1, "a"]},
}


@pytest.mark.parametrize("name", sorted(CHAT_MISTAKES))
def test_chat_mistakes_are_4xx_json_errors(llm, name):
    reply = httpx.post(
        f"{llm.base_url}/chat/completions",
        content=CHAT_MISTAKES[name],
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert_openai_error(reply)


@pytest.mark.parametrize("name", sorted(COMPLETION_MISTAKES))
def test_completion_mistakes_are_4xx_json_errors(llm, name):
    body = {"model": "tiny", "max_tokens": 2, **COMPLETION_MISTAKES[name]}
    reply = httpx.post(f"{llm.base_url}/completions", json=body, timeout=60)
    assert_openai_error(reply, 400)


def test_text_too_long_for_the_context_is_refused_before_tokenizing(llm):
    """60 KB of text fits the body limit but not the 512-token context: 400 without
    tokenizing it (the message counts characters, not tokens)."""
    for path, body in [
        ("chat/completions", {"messages": [{"role": "user", "content": "word " * 12_000}]}),
        ("completions", {"prompt": "word " * 12_000}),
        ("completions", {"prompt": ["hi", "word " * 12_000]}),
    ]:
        reply = httpx.post(f"{llm.base_url}/{path}", json={"model": "tiny", **body}, timeout=60)
        err = assert_openai_error(reply, 400)
        assert err["code"] == "context_length_exceeded" and "characters" in err["message"]
    ok = httpx.post(f"{llm.base_url}/chat/completions", content=chat(), timeout=60)
    assert ok.status_code == 200


# ------------------------------------------------------------------ body size


def raw_exchange(url: str, head: bytes, body: bytes = b"", timeout: float = 30) -> bytes:
    """Send ``head`` and ``body`` on a fresh socket; everything read until the server closes."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize("server", ["llm", "rm"])
def test_body_over_the_limit_is_413_before_it_is_read(server, request):
    handle = request.getfixturevalue(server)
    path = "/v1/chat/completions" if server == "llm" else "/score"
    # A declared 50 MB body: refused from its Content-Length, none of it sent.
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 50000000\r\n\r\n"
    ).encode()
    data = raw_exchange(handle.url, head)
    assert data.startswith(b"HTTP/1.1 413 "), data[:200]
    assert b"connection: close" in data.lower()
    error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert "65536 bytes" in error["message"] and "--max-body-mb" in error["message"]

    # A chunked body without a length: refused once it passes the limit.
    def chunks():
        yield b'{"pairs": [], "x": "'
        for _ in range(64):
            yield b"a" * 8192

    reply = httpx.post(f"{handle.url}{path}", content=chunks(), timeout=30)
    assert reply.status_code == 413 and "larger than" in reply.json()["error"]["message"]


@pytest.mark.parametrize("server", ["llm", "rm"])
def test_a_client_that_sends_its_refused_body_anyway_reads_the_413(server, request):
    """The client writes all of a 2 MB body (over the 64 KiB limit) before it reads.
    The server answered 413 after the head; had it closed at once, the bytes
    still arriving would reset the connection and the client would never see why."""
    handle = request.getfixturevalue(server)
    path = "/v1/chat/completions" if server == "llm" else "/score"
    body = b"{" + b" " * (2 * 2**20 - 2) + b"}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(3):  # a reset is a race: give it a few chances to show
        data = raw_exchange(handle.url, head, body)
        assert data.startswith(b"HTTP/1.1 413 "), data[:200]
        assert "--max-body-mb" in json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    reply = httpx.post(f"{handle.url}{path}", content=body, timeout=30)
    assert reply.status_code == 413


def test_body_under_the_limit_is_served(rm):
    pairs = [{"prompt": "p " * 2500, "response": "r"}] * 8  # ~40 KB < 64 KiB
    reply = httpx.post(f"{rm.url}/score", json={"pairs": pairs}, timeout=60)
    assert reply.status_code == 200 and len(reply.json()["scores"]) == 8


# ------------------------------------------------------------------ slow clients


@pytest.fixture(params=["llm", "rm"])
def short_server(request, tokenizer, rm_loaded):
    """A server of each kind with the SHORT timeouts (head 2 s, body 0.5 s)."""
    if request.param == "llm":
        engine = ScriptedEngine(tokenizer, ["fine"], by="call")
        handle = start_server(engine, tokenizer, model_name="tiny", limits=SHORT)
    else:
        handle, _ = start_rm_server(rm_loaded, max_wait_ms=1, limits=SHORT)
    yield request.param, handle
    handle.stop()


def _post_retrying(url: str, **kwargs) -> httpx.Response:
    """POST, again on a transport error: with short head timeouts a starved client
    may be cut before it sends its head (that is the timeout working)."""
    for attempt in range(5):
        try:
            return httpx.post(url, timeout=60, **kwargs)
        except httpx.TransportError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def test_half_sent_requests_are_closed(short_server):
    """100 connections that stall: silent, half a request head, or a head with a
    partial body. With SHORT timeouts the server closes every one (408 for a
    partial body) and keeps serving."""
    server, handle = short_server
    path = "/v1/chat/completions" if server == "llm" else "/score"
    host, port = handle.url.removeprefix("http://").split(":")
    kinds = ["silent", "half_head", "half_body"]
    socks = []
    for i in range(100):
        sock = socket.create_connection((host, int(port)), timeout=60)
        kind = kinds[i % 3]
        if kind == "half_head":
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Le".encode())
        elif kind == "half_body":
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            sock.sendall(head.encode() + b'{"pairs": [')
        socks.append((kind, sock))
    for kind, sock in socks:
        data = b""
        try:
            while chunk := sock.recv(65536):  # returns b"" once the server closes
                data += chunk
        finally:
            sock.close()
        if kind == "half_body":
            assert data.startswith(b"HTTP/1.1 408 "), data[:200]
            assert b"--body-timeout-s" in data
        else:
            assert data == b""
    deadline = time.monotonic() + 300  # a generous cap: a loaded machine is slow
    while handle.open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handle.open_connections == 0
    if server == "llm":
        reply = _post_retrying(f"{handle.base_url}/chat/completions", content=chat())
    else:
        reply = _post_retrying(
            f"{handle.url}/score", json={"pairs": [{"prompt": "a", "response": "b"}]}
        )
    assert reply.status_code == 200


def test_a_request_waiting_for_its_answer_is_not_cut(rm_loaded):
    """The head and body timeouts (2 s, 0.5 s) do not cut a request whose answer
    takes longer: the batcher holds a lone pair 3 s waiting for company."""
    handle, _ = start_rm_server(rm_loaded, max_batch_size=64, max_wait_ms=3000, limits=SHORT)
    body = {"pairs": [{"prompt": "a", "response": "b"}]}
    try:
        reply = _post_retrying(f"{handle.url}/score", json=body)
        assert reply.status_code == 200 and len(reply.json()["scores"]) == 1
    finally:
        handle.stop()


# ------------------------------------------------------------------ serve-rm poisoning

RM_PAIRS = [("What is 2+3?", "5"), ("Name a colour.", "Blue."), ("Say hi", "hi")]


def test_a_bad_pair_fails_alone_over_http(rm, rm_loaded):
    """60 concurrent requests, every fifth with a lone surrogate: those get 400, the
    others 200 with the scores the model gives them alone."""
    model, tok = rm_loaded
    expected = compute.run(score_pairs, model, tok, RM_PAIRS)

    async def one(i, http):
        if i % 5 == 0:
            text = b'{"pairs": [{"prompt": "ok", "response": "\\ud800"}]}'
            return i, await http.post(f"{rm.url}/score", content=text)
        p, r = RM_PAIRS[i % 3]
        return i, await http.post(f"{rm.url}/score", json={"pairs": [{"prompt": p, "response": r}]})

    async def go():
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*(one(i, http) for i in range(60)))

    for i, reply in asyncio.run(go()):
        if i % 5 == 0:
            assert reply.status_code == 400
            err = reply.json()["error"]
            assert err["type"] == "invalid_request" and "surrogate" in err["message"]
        else:
            assert reply.status_code == 200, reply.text
            (score,) = reply.json()["scores"]
            assert score == pytest.approx(expected[i % 3], rel=1e-4, abs=1e-4)


def test_a_pair_the_tokenizer_refuses_fails_only_its_own_request(rm_loaded):
    """In process (no JSON to catch it first) a lone surrogate reaches the
    tokenizer, batched with 19 good requests: only its request fails, naming the pair."""
    model, tok = rm_loaded
    expected = compute.run(score_pairs, model, tok, RM_PAIRS)

    async def go():
        batcher = RewardModelBatcher(model, tok, max_batch_size=64, max_wait_ms=50)
        try:
            calls = [batcher.score([RM_PAIRS[i % 3]]) for i in range(19)]
            calls.insert(7, batcher.score([RM_PAIRS[0], ("fine", "bad \ud800")]))
            results = await asyncio.gather(*calls, return_exceptions=True)
            return results, batcher.forwards
        finally:
            await batcher.close()

    results, forwards = asyncio.run(go())
    assert forwards == 1  # all 20 requests were in one batch
    bad = results.pop(7)
    assert isinstance(bad, UnscorablePair) and str(bad).startswith("pairs.1: the tokenizer")
    for i, got in enumerate(results):
        assert got == pytest.approx([expected[i % 3]], rel=1e-4, abs=1e-4)


def test_a_pair_whose_forward_fails_fails_alone():
    """A real model whose embedding is smaller than its tokenizer (700 of 759 ids):
    a batch holding a pair with a high id fails its forward; the batch is rerun row
    by row, so only that pair gets the error and the rest their own scores."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = load_tokenizer("tiny")
    cfg = LlamaConfig(vocab_size=700, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                      pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(cfg).eval()
    good = [("hello world", "hello"), ("what is it", "it is"), ("hello", "world")]
    pairs = [*good[:2], ("hello", "Saturn Mango"), good[2]]  # ids 752, 751
    alone = [compute.run(score_pairs_each, model, tok, [p])[0] for p in good]
    got = compute.run(score_pairs_each, model, tok, pairs)
    assert isinstance(got[2], RuntimeError) and "forward failed" in str(got[2])
    assert [got[0], got[1], got[3]] == pytest.approx(alone, rel=1e-4, abs=1e-4)


def test_huge_texts_are_cut_before_tokenizing_with_the_same_score(rm_loaded):
    """A 300,000-character prompt scores what the old path (tokenize it all, then
    truncate) gave, and the tokenizer never sees more than the cut."""
    model, tok = rm_loaded
    prompt = "Tell me about the sea. " * 13_000
    pair = (prompt, "The sea is large and salty.")
    length = model.config.max_position_embeddings
    full = tok(pair[0], pair[1], truncation=True, max_length=length)["input_ids"]
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([full])).logits[0, 0].item()
    got = compute.run(score_pairs, model, tok, [pair], length)
    assert got == pytest.approx([want], rel=1e-4, abs=1e-4)


# ------------------------------------------------------------------ properties

_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)
)
_value = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
_chat_fields = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("tiny"), _value),
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
                    optional={"content": _value, "tool_calls": _value, "name": _value},
                ),
                max_size=3,
            ),
            _value,
        ),
        "n": _value,
        "temperature": _value,
        "top_p": _value,
        "max_tokens": _value,
        "stop": _value,
        "seed": _value,
        "tools": _value,
        "tool_choice": _value,
        "logprobs": _value,
    },
)
_raw_bytes = st.one_of(
    st.binary(max_size=64),
    st.lists(st.sampled_from([b"{", b"}", b"[", b"]", b'"', b":", b",", b"1e999", b"NaN",
                              b'"\\ud800"', b"\xff", b'"pairs"', b'"prompt"', HUGE_INT.encode()]),
             max_size=30).map(b"".join),
)  # fmt: skip
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(_chat_fields)
def test_property_chat_body_parses_or_is_an_api_error(fields):
    for model in (ChatRequest, CompletionRequest):
        try:
            parse_body(json.dumps(fields).encode(), model)
        except APIError as exc:
            assert 400 <= exc.status < 500 and "\n" not in exc.message


@FUZZ
@given(_raw_bytes)
def test_property_raw_bodies_parse_or_are_api_errors(raw):
    for model in (ChatRequest, CompletionRequest):
        try:
            parse_body(raw, model)
        except APIError as exc:
            assert exc.status == 400 and "\n" not in exc.message
    try:
        pairs = parse_score_request(raw)
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert all(isinstance(p, str) and isinstance(r, str) for p, r in pairs)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(_chat_fields)
def test_property_chat_server_never_answers_5xx(llm, fields):
    body = {"max_tokens": 2, **fields}
    for key in ("max_tokens", "n"):  # keep the engine's work small: at most 4 of each
        if type(body.get(key)) is int:
            body[key] = min(body[key], 4)
    raw = json.dumps(body).encode()  # may hold Infinity, which httpx's json= refuses
    reply = httpx.post(f"{llm.base_url}/chat/completions", content=raw, timeout=60)
    assert reply.status_code < 500, reply.text[:300]
    if reply.status_code >= 400:
        assert_openai_error(reply)


_pairs_body = st.fixed_dictionaries(
    {},
    optional={
        "pairs": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {}, optional={"prompt": _value, "response": _value, "extra": _value}
                ),
                max_size=3,
            ),
            _value,
        ),
        "x": _value,
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(_pairs_body)
def test_property_score_server_never_answers_5xx(rm, body):
    reply = httpx.post(f"{rm.url}/score", content=json.dumps(body).encode(), timeout=60)
    assert reply.status_code in (200, 400), reply.text[:300]
    if reply.status_code == 400:
        err = reply.json()["error"]
        assert err["type"] == "invalid_request" and "\n" not in err["message"]
    else:
        assert len(reply.json()["scores"]) == len(body["pairs"])


@pytest.mark.parametrize(
    "flags",
    [["--max-body-mb", "0"], ["--max-body-mb", "inf"], ["--header-timeout-s", "nan"],
     ["--body-timeout-s", "-1"]],
)  # fmt: skip
def test_bad_limit_flags_are_one_line_errors(capsys, flags):
    from temper.cli.main import main

    assert main(["serve-rm", "tiny-rm", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("temper: error: need finite --max-body-mb")


def test_clients_do_not_retry_a_request_larger_than_the_queue(rm_loaded):
    """`RewardModelReward` sends 4 pairs per request to a server whose queue holds 2:
    413, given up after one attempt (a 503 would have been retried 3 times)."""
    from temper.http_client import retryable_status
    from temper.records import Task
    from temper.rewards.base import RewardInput
    from temper.rewards.reward_model import RewardModelReward

    handle, _ = start_rm_server(rm_loaded, max_queue=2)
    try:
        reward = RewardModelReward(base_url=handle.url, request_size=4, max_retries=3)
        task = Task(id="t", prompt="q")
        results = asyncio.run(reward.score([RewardInput(task, "q", "a")] * 4))
    finally:
        handle.stop()
    assert reward.client.attempts == 1
    assert all("HTTP 413" in r.error and "1 attempt(s)" in r.error for r in results)
    assert [retryable_status(s) for s in (400, 408, 413, 429, 500, 503)] == [
        False, True, False, True, True, True
    ]  # fmt: skip
