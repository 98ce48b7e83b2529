"""HFEngine: the model.generate baseline behind the Engine protocol."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fp32 import ENGINE_PARITY
from temper.engine.base import Engine, SamplingParams
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.errors import PromptTooLongError
from temper.weights import push_weights

from .conftest import CharTokenizer, hf_greedy, hf_logprobs, make_model, run

PROMPT = [5, 9, 13, 17, 21]


def test_greedy_and_logprobs(llama) -> None:
    engine = HFEngine(llama)
    assert isinstance(engine, Engine)
    out = run(
        engine.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))
    )
    s = out.samples[0]
    assert s.token_ids == hf_greedy(llama, PROMPT, 12)
    assert s.finish_reason == "length" and s.policy_versions == [0] * 12
    torch.testing.assert_close(
        torch.tensor(s.logprobs), hf_logprobs(llama, PROMPT, s.token_ids), **ENGINE_PARITY
    )


def test_sampled_n_seeded_and_raw_logprobs(llama) -> None:
    engine = HFEngine(llama)
    params = SamplingParams(n=3, temperature=0.7, max_new_tokens=10, seed=5, ignore_eos=True)
    a = run(engine.generate(PROMPT, params))
    b = run(engine.generate(PROMPT, params))
    assert len(a.samples) == 3
    assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
    for s in a.samples:  # raw (temperature 1) logprobs
        ref = hf_logprobs(llama, PROMPT, s.token_ids)
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, **ENGINE_PARITY)


def test_stops_match_native_engine(llama) -> None:
    free = hf_greedy(llama, PROMPT, 16)
    tok = CharTokenizer()
    hf, native = HFEngine(llama, tok), NativeEngine(llama, tok)
    cases = [
        SamplingParams(
            temperature=0, max_new_tokens=16, stop_token_ids=(free[4],), ignore_eos=True
        ),
        SamplingParams(
            temperature=0, max_new_tokens=16, stop_strings=(tok.decode(free[5:7]),), ignore_eos=True
        ),
        SamplingParams(temperature=0, max_new_tokens=7, ignore_eos=True),
    ]

    async def go(engine):
        return await asyncio.gather(*[engine.generate(PROMPT, p) for p in cases])

    for h, n in zip(run(go(hf)), run(go(native)), strict=True):
        hs, ns = h.samples[0], n.samples[0]
        assert (hs.token_ids, hs.finish_reason, hs.stop_reason) == (
            ns.token_ids,
            ns.finish_reason,
            ns.stop_reason,
        )
    assert run(go(hf))[0].samples[0].finish_reason == "stop"


def test_update_weights_and_errors(llama) -> None:
    engine = HFEngine(make_model("llama"), max_context=16)
    assert isinstance(engine, HFEngine) and engine.max_context == 16
    push_weights(engine, llama.state_dict(), version=2)
    out = run(
        engine.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
    )
    assert out.samples[0].token_ids == hf_greedy(llama, PROMPT, 6)
    assert out.samples[0].policy_versions == [2] * 6
    long = run(
        engine.generate([5] * 12, SamplingParams(max_new_tokens=50, ignore_eos=True))
    ).samples[0]
    assert len(long.token_ids) == 4 and long.finish_reason == "length"
    with pytest.raises(PromptTooLongError):
        run(engine.generate([5] * 16, SamplingParams()))
    run(engine.close())
