"""Adapter updates in vLLM (`temper.engine.vllm_lora`, runs in .venv-vllm): after each
update vLLM's logprobs equal a forward of the model with the adapter merged, and a
call in flight when an update lands finishes on its own adapter version.

The updates are what a `[lora]` trainer publishes (`temper.weights.adapter`): A and
scaled B per linear layer, made here at random (this environment has no peft; the
trainer's side is tested in tests/trainer/test_lora.py).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("vllm")

from fp32 import ENGINE_PARITY
from temper.engine.base import SamplingParams
from temper.engine.vllm_engine import VLLMEngine
from temper.models import load_model, load_tokenizer, resolve_model_path
from temper.weights import push_weights
from temper.weights.adapter import LORA_A, LORA_B, merge_into

pytestmark = pytest.mark.vllm

PATH = str(resolve_model_path("tiny"))
PROMPTS = [[1, 87, 85, 20], [1, 87, 85, 21, 22, 23]]
LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_update(seed: int, rank: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    update = {}
    for name, module in load_model(PATH).named_modules():
        if name.rsplit(".", 1)[-1] in LAYERS:
            update[name + LORA_A] = torch.randn(rank, module.in_features, generator=g) * 0.1
            update[name + LORA_B] = torch.randn(module.out_features, rank, generator=g) * 0.1
    return update


def merged_model(update: dict[str, torch.Tensor]) -> torch.nn.Module:
    return merge_into(load_model(PATH), update)


def logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor([ids]).T)[:, 0]


@pytest.fixture(scope="module")
def engine():
    eng = VLLMEngine(PATH, load_tokenizer(PATH), adapter_versions=2, max_lora_rank=4)
    yield eng
    asyncio.run(eng.close())


def test_each_adapter_update_serves_the_merged_forward(engine):
    params = SamplingParams(n=2, max_new_tokens=10, seed=3, ignore_eos=True)
    base = load_model(PATH)
    for version in (1, 2, 3):
        update = adapter_update(version)
        push_weights(engine, update, version)
        want_model = merged_model(update)
        for prompt in PROMPTS:
            result = asyncio.run(engine.generate(prompt, params))
            for s in result.samples:
                assert s.policy_versions == [version] * len(s.token_ids)
                want = logprobs(want_model, prompt, s.token_ids)
                torch.testing.assert_close(torch.tensor(s.logprobs), want, **ENGINE_PARITY)
                # The adapter really moved the model (not the base weights served).
                assert (want - logprobs(base, prompt, s.token_ids)).abs().max() > 1e-2
        # Nothing in flight between calls: only the newest version stays loaded.
        assert engine._adapters.loaded == [version]


def test_a_call_in_flight_finishes_on_its_own_adapter_version(engine):
    first, second = adapter_update(11), adapter_update(12)
    push_weights(engine, first, 10)
    long = SamplingParams(n=2, max_new_tokens=200, seed=5, ignore_eos=True)
    short = SamplingParams(n=1, max_new_tokens=12, seed=6, ignore_eos=True)

    async def scenario():
        running = asyncio.create_task(engine.generate(PROMPTS[0], long))
        await asyncio.sleep(0)  # generate has submitted its requests on version 10
        assert not running.done()
        push_weights(engine, second, 11)
        assert engine._adapters.loaded == [10, 11]  # both while the call runs
        after = await engine.generate(PROMPTS[1], short)
        return await running, after

    old, new = asyncio.run(scenario())
    old_model, new_model = merged_model(first), merged_model(second)
    for s in old.samples:
        assert len(s.token_ids) == 200 and s.policy_versions == [10] * 200
        want = logprobs(old_model, PROMPTS[0], s.token_ids)
        torch.testing.assert_close(torch.tensor(s.logprobs), want, **ENGINE_PARITY)
    (s,) = new.samples
    assert s.policy_versions == [11] * len(s.token_ids)
    want = logprobs(new_model, PROMPTS[1], s.token_ids)
    torch.testing.assert_close(torch.tensor(s.logprobs), want, **ENGINE_PARITY)
    assert engine._adapters.loaded == [11]  # version 10 went once its call ended
