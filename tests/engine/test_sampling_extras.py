"""Optional sampling extras on the native and HF engines (tiny model): top-logprob
alternatives, presence/frequency penalties and per-sample logits processors."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from fp32 import ENGINE_PARITY
from temper.engine.base import SamplingParams
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.engine.sampling import PenaltyProcessor
from temper.models import load_model, load_tokenizer

PROMPT = [5, 17, 42, 9, 100, 3]


@pytest.fixture(scope="module")
def model():
    return load_model("tiny")


@pytest.fixture(scope="module", params=["native", "hf"])
def engine(request, model):
    tok = load_tokenizer("tiny")
    eng = NativeEngine(model, tok) if request.param == "native" else HFEngine(model, tok)
    yield eng
    asyncio.run(eng.close())


def run(engine, params):
    return asyncio.run(engine.generate(PROMPT, params))


def raw_logprobs(model, tokens):
    """log_softmax of the model's logits before each of ``tokens`` (HF forward)."""
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1].float()
    return torch.log_softmax(logits, -1)


class OnlyTokens:
    """A processor that allows only ``allowed`` and records what it was told."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = torch.tensor(allowed)
        self.seen: list[int] = []

    def apply(self, logits: torch.Tensor) -> None:
        keep = logits[self.allowed].clone()
        logits.fill_(float("-inf"))
        logits[self.allowed] = keep

    def accept(self, token_id: int) -> None:
        self.seen.append(token_id)


def test_top_logprobs_are_the_k_best_raw_logprobs(engine, model):
    params = SamplingParams(temperature=1.0, seed=4, max_new_tokens=6, ignore_eos=True)
    out = run(engine, SamplingParams(**{**params.__dict__, "top_logprobs": 3})).samples[0]
    plain = run(engine, params).samples[0]
    assert out.token_ids == plain.token_ids  # asking for alternatives changes nothing sampled
    assert plain.top_logprobs is None
    assert len(out.top_logprobs) == len(out.token_ids)
    ref = raw_logprobs(model, out.token_ids)
    for t, alts in enumerate(out.top_logprobs):
        assert len(alts) == 3
        best = ref[t].topk(3)
        assert list(alts) == best.indices.tolist()
        torch.testing.assert_close(torch.tensor(list(alts.values())), best.values, **ENGINE_PARITY)


def test_frequency_penalty_stops_greedy_repeats_and_keeps_raw_logprobs(engine, model):
    base = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    plain = run(engine, base).samples[0].token_ids
    assert len(set(plain)) < len(plain), "greedy tiny model should repeat itself"
    out = run(engine, SamplingParams(**{**base.__dict__, "frequency_penalty": 1e4})).samples[0]
    assert len(set(out.token_ids)) == len(out.token_ids)
    ref = raw_logprobs(model, out.token_ids)
    chosen = ref.gather(1, torch.tensor(out.token_ids).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(out.logprobs), chosen, **ENGINE_PARITY)


def test_presence_penalty_applies_once_per_token():
    proc = PenaltyProcessor(presence=0.5, frequency=0.25)
    for t in (1, 1, 1, 3):
        proc.accept(t)
    logits = torch.zeros(5)
    proc.apply(logits)
    assert logits.tolist() == [0.0, -1.25, 0.0, -0.75, 0.0]


def test_logits_processor_constrains_each_sample(engine):
    made: list[OnlyTokens] = []

    def factory():
        made.append(OnlyTokens([7, 11, 13]))
        return made[-1]

    params = SamplingParams(
        n=2, seed=1, max_new_tokens=5, ignore_eos=True, logits_processors=(factory,)
    )
    result = run(engine, params)
    assert len(made) == 2  # one processor per sample
    for sample in result.samples:
        assert set(sample.token_ids) <= {7, 11, 13}
        assert all(math.isfinite(lp) for lp in sample.logprobs)
    # Each processor was told its own sample's tokens (HF: all but the last).
    seen = sorted(tuple(p.seen) for p in made)
    drawn = sorted(
        tuple(s.token_ids[: len(p.seen)]) for s, p in zip(result.samples, made, strict=True)
    )
    assert seen == drawn and all(len(p.seen) >= 4 for p in made)


def test_nan_sampling_params_are_refused():
    for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**{field: float("nan")})
    with pytest.raises(ValueError, match="top_logprobs"):
        SamplingParams(top_logprobs=-1)


def test_native_generate_stream_yields_tokens_then_the_result(model):
    engine = NativeEngine(model, load_tokenizer("tiny"))
    # A stop string makes the engine run one step per call: one update per token.
    params = SamplingParams(
        n=2, seed=3, max_new_tokens=12, ignore_eos=True, stop_strings=("\u2603",), top_logprobs=2
    )

    async def go():
        updates = [u async for u in engine.generate_stream(PROMPT, params)]
        plain = await engine.generate(PROMPT, params)
        # Closing a stream after its first update cancels the request.
        stream = engine.generate_stream(PROMPT, params)
        await anext(stream)
        await stream.aclose()
        for _ in range(600):  # the engine's loop drops the request on its next step
            if not engine._rows and not engine._waiting:
                break
            await asyncio.sleep(0.05)
        idle = not engine._rows and not engine._waiting
        await engine.close()
        return updates, plain, idle

    updates, plain, idle = asyncio.run(go())
    *steps, last = updates
    assert last.result is not None and all(u.result is None for u in steps)
    assert engine.abilities.stream
    for i, sample in enumerate(last.result.samples):
        mine = [u for u in steps if u.sample == i]
        assert len(mine) == 12  # one update per token
        assert [t for u in mine for t in u.token_ids] == sample.token_ids
        assert [x for u in mine for x in u.logprobs] == sample.logprobs
        assert [x for u in mine for x in u.top_logprobs] == sample.top_logprobs
        assert sample.token_ids == plain.samples[i].token_ids
    assert idle
