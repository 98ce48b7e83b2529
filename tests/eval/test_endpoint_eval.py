"""engine.type = "openai": eval through a real `temper serve` (tiny model, native engine)
must match evaluating the same model in process; a text-only endpoint is re-tokenized."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from fastapi import FastAPI, Request

from temper.cli.eval import run_eval
from temper.cli.main import main as cli_main
from temper.config import config_from_dict
from temper.engine import SamplingParams
from temper.engine.native import NativeEngine
from temper.engine.openai_endpoint import OpenAIEndpointEngine
from temper.errors import ConfigError
from temper.http_client import api_key_from_env
from temper.models import load_model, load_tokenizer
from temper.serve import start_server
from temper.serve.runner import serve_app_in_thread
from temper.weights import push_weights

EVAL = {"size": 8, "k": 2, "max_response_tokens": 24}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = NativeEngine(load_model("tiny"), tokenizer)
    handle = start_server(engine, tokenizer, "127.0.0.1", 0, model_name="tiny")
    yield handle
    handle.stop()


def test_cli_eval_on_endpoint_equals_in_process(server, tmp_path, capsys):
    local = asyncio.run(run_eval(config_from_dict({"model": {"path": "tiny"}, "eval": EVAL})))
    out = tmp_path / "remote.json"
    code = cli_main(
        [
            "eval",
            "--engine.type=openai",
            f"--engine.base_url={server.base_url}",
            "--eval.size=8",
            "--eval.k=2",
            "--eval.max_response_tokens=24",
            f"--out={out}",
        ]
    )
    assert code == 0
    remote = json.loads(out.read_text())
    assert remote["n_tasks"] == 8
    # Greedy: the same ids, so the same accuracy and response lengths. The
    # sampled metrics use the same seeded per-sample streams on both sides.
    local.pop("model"), remote.pop("model")
    assert remote == local
    assert "eval: 8 tasks" in capsys.readouterr().out


def test_generate_returns_server_ids_and_logprobs(server, tokenizer):
    ids = tokenizer("Q: 2+3=?\nA:", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=11)

    async def both():
        remote = OpenAIEndpointEngine(server.base_url, tokenizer)
        local = NativeEngine(load_model("tiny"), tokenizer)
        try:
            return await remote.generate(ids, params), await local.generate(ids, params), remote
        finally:
            await remote.close()
            await local.close()

    got, want, engine = asyncio.run(both())
    assert engine.model_name == "tiny" and engine.max_context == 512
    assert got.prompt_token_ids == list(ids)
    for g, w in zip(got.samples, want.samples, strict=True):
        assert g.token_ids == w.token_ids and not g.retokenized
        assert g.finish_reason == w.finish_reason and g.stop_reason == w.stop_reason
        assert g.logprobs == pytest.approx(w.logprobs, rel=1e-5, abs=1e-4)
    with pytest.raises(ConfigError, match="cannot take weight updates"):
        push_weights(engine, {}, 1)


def text_only_endpoint(requests: list[dict]) -> FastAPI:
    """A completions endpoint that, like many hosted APIs, returns text only."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "remote-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        body["_auth"] = request.headers.get("authorization")
        requests.append(body)
        choices = [
            {"index": i, "text": f"The answer is {i + 4}.", "finish_reason": "stop"}
            for i in reversed(range(body["n"]))  # out of order on purpose
        ]
        return {"object": "text_completion", "choices": choices}

    return app


def test_text_only_endpoint_is_retokenized(tokenizer, monkeypatch):
    monkeypatch.setenv("TEMPER_TEST_KEY", "sk-test")
    requests: list[dict] = []
    handle = serve_app_in_thread(text_only_endpoint(requests))
    try:
        key = api_key_from_env("TEMPER_TEST_KEY")
        engine = OpenAIEndpointEngine(f"{handle.url}/v1", tokenizer, api_key=key, max_context=256)
        params = SamplingParams(n=2, temperature=0.0, max_new_tokens=9, stop_strings=("\n",))

        async def go():
            try:
                return await engine.generate([5, 6, 7], params)
            finally:
                await engine.close()

        result = asyncio.run(go())
    finally:
        handle.stop()
    body = requests[0]
    assert body["model"] == "remote-model" and body["prompt"] == [5, 6, 7]
    assert (body["n"], body["temperature"], body["max_tokens"]) == (2, 0.0, 9)
    assert body["stop"] == ["\n"] and body["return_token_ids"] is True
    assert "seed" not in body and "top_k" not in body and body["_auth"] == "Bearer sk-test"
    for i, s in enumerate(result.samples):
        text = f"The answer is {i + 4}."
        assert s.retokenized
        assert s.token_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(s.token_ids) == text
        assert all(math.isnan(v) for v in s.logprobs) and s.finish_reason == "stop"


def test_config_and_training_refused(monkeypatch):
    with pytest.raises(ConfigError, match=r"engine\.base_url: Field required"):
        config_from_dict({"engine": {"type": "openai"}})
    monkeypatch.delenv("TEMPER_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="TEMPER_NO_SUCH_KEY"):
        api_key_from_env("TEMPER_NO_SUCH_KEY")
    from temper.orchestrator.loop import Orchestrator

    cfg = config_from_dict({"engine": {"type": "openai", "base_url": "http://127.0.0.1:9/v1"}})
    with pytest.raises(ConfigError, match="'openai' cannot train"):
        Orchestrator(cfg)
