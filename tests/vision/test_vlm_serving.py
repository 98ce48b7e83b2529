"""`temper serve` with a vision-language model: OpenAI-style image content parts in
chat messages, over real HTTP; a text model refuses them with a 400 naming the part."""

from __future__ import annotations

import base64
import io

import httpx
import pytest

from temper.engine.hf import HFEngine
from temper.models import load_tokenizer, resolve_model_path
from temper.serve.runner import start_server
from temper.vision.processor import VisionProcessor
from tiny_llava import picture


def _data_url(seed: int) -> str:
    buf = io.BytesIO()
    picture(seed).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(url: str, content, **extra) -> httpx.Response:
    body = {"model": "vlm", "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


@pytest.fixture(scope="module", params=["hf", "native"])
def vlm_server(llava_path, request):
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    from temper.engine.native import NativeEngine

    model = LlavaForConditionalGeneration.from_pretrained(llava_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(llava_path)
    vision = VisionProcessor.from_pretrained(llava_path)
    kind = HFEngine if request.param == "hf" else NativeEngine
    engine = kind(model, tokenizer, vision=vision)
    handle = start_server(engine, tokenizer, model_name="vlm", vision=vision)
    yield handle, vision
    handle.stop()


def test_image_parts_are_seen_by_the_model(vlm_server):
    handle, vision = vlm_server
    question = {"type": "text", "text": "What is this?"}
    replies = {}
    for seed in (1, 2):
        image = {"type": "image_url", "image_url": {"url": _data_url(seed)}}
        reply = _chat(
            handle.url,
            [image, question],
            max_tokens=4,
            temperature=0,
            logprobs=True,
            return_token_ids=True,
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        ids = body["prompt_token_ids"]
        assert ids.count(vision.image_token_id) == 16  # the image's token run, expanded
        replies[seed] = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    # Same text, other picture: the model's distribution differs.
    assert replies[1] != replies[2]
    streamed = _chat(
        handle.url,
        [{"type": "image_url", "image_url": {"url": _data_url(1)}}, question],
        max_tokens=4,
        temperature=0,
        stream=True,
    )
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text


@pytest.mark.parametrize(
    ("part", "words"),
    [
        ({"type": "image_url", "image_url": {"url": "https://x/y.png"}}, "runs are hermetic"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "readable"),
        ({"type": "image_url"}, "image_url.url"),
        ({"type": "audio", "audio": "x"}, "text or image_url"),
    ],
)
def test_bad_image_parts_are_400_naming_the_part(vlm_server, part, words):
    handle, _ = vlm_server
    reply = _chat(handle.url, [part, {"type": "text", "text": "hi"}])
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["param"].startswith("messages[0].content")


def test_a_text_model_refuses_image_parts():
    from temper.models import load_model

    path = resolve_model_path("tiny")
    handle = start_server(HFEngine(load_model(path), load_tokenizer(path)), load_tokenizer(path))
    try:
        part = {"type": "image_url", "image_url": {"url": _data_url(1)}}
        body = {"model": "temper", "messages": [{"role": "user", "content": [part]}]}
        reply = httpx.post(f"{handle.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 400
        assert "need a vision-language model" in reply.json()["error"]["message"]
    finally:
        handle.stop()
