"""`temper serve` on the vLLM engine: JSON output and forced tool calls through vLLM's
own structured outputs, and the legacy scoring request through vLLM's prompt logprobs,
driven by the official `openai` client against the tiny model (a real server on
127.0.0.1; runs in .venv-vllm, skipped elsewhere)."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import openai
import pytest
import torch
from pydantic import BaseModel, ConfigDict

pytest.importorskip("vllm")

from fp32 import ENGINE_PARITY
from temper import compute
from temper.engine.base import SamplingParams
from temper.engine.structured import json_output
from temper.engine.vllm_engine import VLLMEngine
from temper.models import load_model, load_tokenizer, resolve_model_path
from temper.serve import start_server
from temper.weights import push_weights

pytestmark = pytest.mark.vllm

PATH = str(resolve_model_path("tiny"))
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


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    label: Literal["yes", "no"]


@pytest.fixture(scope="module")
def engine():
    """One vLLM engine for the module (starting vLLM is slow)."""
    eng = VLLMEngine(PATH, load_tokenizer(PATH), dtype="float32")
    assert eng.abilities.structured_outputs
    yield eng
    asyncio.run(eng.close())


@pytest.fixture(scope="module")
def client(engine):
    handle = start_server(engine, engine.tokenizer, "127.0.0.1", 0, model_name="tiny")
    yield openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0, timeout=120)
    handle.stop()


@pytest.mark.parametrize("seed", [0, 1])
def test_json_schema_output_validates(client, seed):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        seed=seed,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": VERDICT}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), VERDICT)


def test_json_object_output_parses(client):
    r = client.chat.completions.create(
        model="tiny", messages=USER, seed=4, max_tokens=60, response_format={"type": "json_object"}
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_the_clients_parse_gets_its_model(client):
    r = client.chat.completions.parse(
        model="tiny", messages=USER, seed=2, max_tokens=40, response_format=Verdict
    )
    assert isinstance(r.choices[0].message.parsed, Verdict)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "echo"}}]
)
def test_forced_tool_call_gives_a_valid_call(client, tool_choice):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[ADD_TOOL, ECHO_TOOL],
        tool_choice=tool_choice,
        seed=1,
        max_tokens=60,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    if isinstance(tool_choice, dict):
        assert call.function.name == "echo"
    tool = {"add": ADD_TOOL, "echo": ECHO_TOOL}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "nonsense"}, 'cannot build a grammar: Unsupported type "nonsense"'),
        ({"type": "integer", "multipleOf": 3}, "vLLM cannot take this schema"),
    ],
)
def test_a_schema_vllm_cannot_take_is_a_one_line_400_naming_the_field(client, schema, says):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=USER,
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    message = info.value.message
    assert "response_format" in message and says in message and "\n" not in message
    # The server goes on serving.
    r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=4, seed=1)
    assert r.choices[0].message.content is not None


def test_a_weight_update_restarts_a_constrained_sample(engine):
    """A grammar cannot resume mid-way: the interrupted sample starts over on the new
    weights (every token records them) and its JSON still validates."""
    tok = engine.tokenizer
    text = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    prompt = list(tok(text, add_special_tokens=False)["input_ids"])
    schema = {"type": "string", "minLength": 300}  # longer than one hand-off's steps
    params = SamplingParams(max_new_tokens=450, seed=5, structured=json_output(schema))
    new = engine.version + 1

    def started() -> bool:  # vLLM has sampled a token for the request (read on its thread)
        states = engine._llm.output_processor.request_states.values()
        return any(len(s.detokenizer.output_token_ids) > 0 for s in states)

    async def go():
        task = asyncio.ensure_future(engine.generate(prompt, params))
        while not await compute.arun(started):
            await asyncio.sleep(0)
        push_weights(engine, load_model(PATH).state_dict(), new)
        return await task

    [sample] = asyncio.run(go()).samples
    assert sample.finish_reason == "stop"
    assert sample.policy_versions == [new] * len(sample.token_ids)
    jsonschema.validate(json.loads(tok.decode(sample.token_ids, skip_special_tokens=True)), schema)


def test_echo_with_max_tokens_0_scores_the_prompt_on_vllm(client, engine):
    """The legacy scoring request a served distillation teacher is asked, answered by
    vLLM's prompt logprobs: equal to an HF forward; ids that leave vLLM no token to
    sample are a one-line 400."""
    ids = engine.tokenizer("What is 12 + 30? The answer is 42.")["input_ids"]
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and all(len(alts) == 2 for alts in lp.top_logprobs[1:])
    model = load_model(PATH)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor([ids[1:]]).T)[:, 0]
    torch.testing.assert_close(torch.tensor(lp.token_logprobs[1:]), want, **ENGINE_PARITY)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model="tiny", prompt=[5] * engine.max_context, max_tokens=0, echo=True, logprobs=0
        )
    assert "vLLM scores at most" in info.value.message, info.value.message
