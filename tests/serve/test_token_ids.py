"""Token ids for outside harnesses: `temper serve` returns the prompt ids the engine was
fed and the ids it sampled, and takes id prompts, with vLLM's field names
(``return_token_ids``; chat: ``prompt_token_ids`` on the response, completions: on
each choice; ``token_ids`` and ``stop_reason`` on each choice; streamed: prompt ids
on the first chunk, each chunk's new ids). A real server on 127.0.0.1 with the tiny
model: the native engine (streams token by token) and the HF engine (whole samples)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.serve import start_server

USER = [{"role": "user", "content": "What is 2+3?"}]
TEXT = "The cat sat on the"
ID_FIELDS = {"prompt_token_ids", "token_ids", "stop_reason"}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def url(tokenizer):
    handle = start_server(
        NativeEngine(load_model("tiny"), tokenizer), tokenizer, "127.0.0.1", 0, model_name="tiny"
    )
    yield handle.base_url
    handle.stop()


@pytest.fixture(scope="module")
def hf_url(tokenizer):
    handle = start_server(
        HFEngine(load_model("tiny"), tokenizer), tokenizer, "127.0.0.1", 0, model_name="tiny"
    )
    yield handle.base_url
    handle.stop()


def post(url: str, path: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/{path}", json={"model": "tiny", **body}, timeout=120)


def ok(url: str, path: str, **body: Any) -> dict[str, Any]:
    reply = post(url, path, **body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream(url: str, path: str, **body: Any) -> list[dict[str, Any]]:
    payload = {"model": "tiny", "stream": True, **body}
    with httpx.stream("POST", f"{url}/{path}", json=payload, timeout=120) as r:
        assert r.status_code == 200, r.read()
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    return chunks


def chat_template_ids(tokenizer, messages) -> list[int]:
    """The chat template's rendering, tokenised by the template itself."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])  # a BatchEncoding


def check_stop(tokenizer, choice: dict[str, Any]) -> None:
    """A sample that ended on a stop token holds it (its id is the stop_reason or EOS);
    the text is the ids decoded without special tokens."""
    ids = choice["token_ids"]
    if choice["finish_reason"] == "stop" and choice["stop_reason"] is None:
        assert ids[-1] == tokenizer.eos_token_id
    elif isinstance(choice["stop_reason"], int):
        assert ids[-1] == choice["stop_reason"]


def test_chat_returns_the_rendered_prompt_and_the_sampled_ids(url, tokenizer):
    body = ok(url, "chat/completions", messages=USER, temperature=0, return_token_ids=True)
    expected = chat_template_ids(tokenizer, USER)
    assert body["prompt_token_ids"] == expected
    assert body["usage"]["prompt_tokens"] == len(expected)
    [choice] = body["choices"]
    ids = choice["token_ids"]
    assert choice["message"]["content"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert body["usage"]["completion_tokens"] == len(ids)
    assert choice["finish_reason"] == "stop", "the tiny model ends this reply on its own"
    assert ids[-1] in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    check_stop(tokenizer, choice)
    assert "prompt_token_ids" not in choice  # chat: on the response, as vLLM


def test_token_id_prompt_samples_what_the_same_text_samples(url, tokenizer):
    greedy = dict(temperature=0, max_tokens=12, return_token_ids=True)
    by_text = ok(url, "completions", prompt=TEXT, **greedy)["choices"][0]
    ids = tokenizer(TEXT)["input_ids"]
    assert by_text["prompt_token_ids"] == ids  # on the choice, as vLLM
    by_ids = ok(url, "completions", prompt=ids, **greedy)["choices"][0]
    assert by_ids["prompt_token_ids"] == ids
    assert by_ids["token_ids"] == by_text["token_ids"] and len(by_ids["token_ids"]) >= 1
    assert by_ids["text"] == by_text["text"]
    assert by_ids["text"] == tokenizer.decode(by_ids["token_ids"], skip_special_tokens=True)


def test_ids_fed_back_extend_the_conversation_exactly(url, tokenizer):
    """Chat's prompt + sampled ids, sent back as a completions prompt, are the
    engine's prompt as given (no re-tokenizing), and greedy continuation of
    prompt + first half gives the second half of a longer greedy sample."""
    first = ok(url, "chat/completions", messages=USER, temperature=0, return_token_ids=True)
    turn = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    next_user = "\n<|im_start|>user\nAnd 3+4?<|im_end|>\n<|im_start|>assistant\n"
    history = turn + tokenizer(next_user, add_special_tokens=False)["input_ids"]
    second = ok(url, "completions", prompt=history, max_tokens=6, temperature=0)
    assert second["usage"]["prompt_tokens"] == len(history)
    fed = ok(
        url, "completions", prompt=history, max_tokens=6, temperature=0, return_token_ids=True
    )["choices"][0]
    assert fed["prompt_token_ids"] == history and fed["text"] == second["choices"][0]["text"]

    greedy = dict(temperature=0, return_token_ids=True, stop_token_ids=[], max_tokens=6)
    head = ok(url, "completions", prompt=first["prompt_token_ids"], **greedy)["choices"][0]
    assert head["finish_reason"] == "length"
    prompt = head["prompt_token_ids"] + head["token_ids"]
    tail = ok(url, "completions", prompt=prompt, **greedy)["choices"][0]
    assert tail["prompt_token_ids"] == prompt
    whole = ok(url, "completions", prompt=first["prompt_token_ids"], **{**greedy, "max_tokens": 12})
    assert whole["choices"][0]["token_ids"] == head["token_ids"] + tail["token_ids"]


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_streamed_ids_are_the_non_streamed_ones(url, hf_url, tokenizer, engine):
    base = url if engine == "native" else hf_url
    request = dict(messages=USER, n=2, seed=7, max_tokens=10, return_token_ids=True)
    whole = ok(base, "chat/completions", **request)
    chunks = stream(base, "chat/completions", **request, stream_options={"include_usage": True})
    role_chunks = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(role_chunks) == 2
    assert all(c["prompt_token_ids"] == whole["prompt_token_ids"] for c in role_chunks)
    assert whole["prompt_token_ids"] == chat_template_ids(tokenizer, USER)
    ids: dict[int, list[int]] = {0: [], 1: []}
    text = {0: "", 1: ""}
    for c in chunks:
        if c not in role_chunks:
            assert "prompt_token_ids" not in c
        for choice in c["choices"]:
            if c not in role_chunks:
                ids[choice["index"]] += choice["token_ids"]
            text[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"] is not None:
                assert "stop_reason" in choice
    for choice in whole["choices"]:
        assert ids[choice["index"]] == choice["token_ids"]
        assert text[choice["index"]] == choice["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == sum(len(v) for v in ids.values())

    prompts = [tokenizer(TEXT)["input_ids"], tokenizer("Hello")["input_ids"]]
    request = dict(prompt=prompts, n=2, seed=5, max_tokens=8, return_token_ids=True)
    whole = ok(base, "completions", **request)
    got: dict[int, list[int]] = {c: [] for c in range(4)}
    first_seen: dict[int, dict[str, Any]] = {}
    for c in stream(base, "completions", **request):
        for choice in c["choices"]:
            k = choice["index"]
            if k in first_seen:
                assert "prompt_token_ids" not in choice
            else:
                first_seen[k] = choice
            got[k] += choice["token_ids"]
    for choice in whole["choices"]:
        k = choice["index"]
        assert first_seen[k]["prompt_token_ids"] == prompts[k // 2] == choice["prompt_token_ids"]
        assert got[k] == choice["token_ids"]


def test_streamed_tool_reply_carries_its_ids(url):
    """A chat with tools is sent whole at the end: its ids come with it."""
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    request = dict(messages=USER, tools=[tool], seed=3, max_tokens=10, return_token_ids=True)
    whole = ok(url, "chat/completions", **request)
    ids = [
        i
        for c in stream(url, "chat/completions", **request)[1:]
        for i in c["choices"][0]["token_ids"]
    ]
    assert ids == whole["choices"][0]["token_ids"]


BAD_PROMPTS = [
    ([5, -1, 7], "prompt[1]", "-1"),
    ([5, "VOCAB"], "prompt[1]", "VOCAB"),
    ([5, "a"], "prompt[1]", '"a"'),
    ([5, 1.5], "prompt[1]", "1.5"),
    ([True, 5], "prompt[0]", "true"),
    ([[5, 6], [7, -3]], "prompt[1][1]", "-3"),
    ([[5, 6], [7, "x"]], "prompt[1][1]", '"x"'),
    (["hi", 4], "prompt[1]", "4"),
    ({"ids": [1]}, "prompt", '{"ids": [1]}'),
    ([], "prompt", "empty"),
]


@pytest.mark.parametrize(("prompt", "param", "shown"), BAD_PROMPTS)
def test_a_bad_token_id_is_a_400_naming_the_field_and_value(url, tokenizer, prompt, param, shown):
    vocab = len(tokenizer)
    prompt = json.loads(json.dumps(prompt).replace('"VOCAB"', str(vocab)))
    shown = shown.replace("VOCAB", str(vocab))
    for stream_it in (False, True):
        reply = post(url, "completions", prompt=prompt, max_tokens=2, stream=stream_it)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param
        assert error["message"].startswith(param) and shown in error["message"], error


def test_the_last_id_in_the_vocabulary_is_taken(url, tokenizer):
    reply = ok(url, "completions", prompt=[5, len(tokenizer) - 1], max_tokens=2)
    assert reply["usage"]["prompt_tokens"] == 2


def test_without_return_token_ids_there_are_no_id_fields(url):
    chat = ok(url, "chat/completions", messages=USER, max_tokens=4)
    text = ok(url, "completions", prompt=[5, 6, 7], max_tokens=4)
    for body in (chat, text):
        assert not ID_FIELDS & set(body) and not ID_FIELDS & set(body["choices"][0])
    for path, body in [("chat/completions", {"messages": USER}), ("completions", {"prompt": "Hi"})]:
        for chunk in stream(url, path, max_tokens=4, **body):
            assert not ID_FIELDS & set(chunk)
            assert not any(ID_FIELDS & set(choice) for choice in chunk["choices"])
