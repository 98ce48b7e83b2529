"""`Engine.score`: the logprob of each given token after the first, as a plain HF
forward computes it, from the native and the HF engine (and after a weight update);
what cannot be scored is refused in one line."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fp32 import ENGINE_PARITY
from temper.engine.base import Engine
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.errors import PromptTooLongError, TemperError
from temper.models import load_model, load_tokenizer
from temper.weights import push_weights


def forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor([ids[1:]]).T)[:, 0]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_scores_equal_an_hf_forward_before_and_after_an_update(tok, kind):
    model = load_model("tiny")
    engine: Engine = (NativeEngine if kind == "native" else HFEngine)(load_model("tiny"), tok)
    assert engine.abilities.scoring
    ids = tok("What is 12 + 30? The answer is 42.")["input_ids"]
    try:
        got = asyncio.run(engine.score(ids, top_logprobs=3))
        assert len(got.logprobs) == len(ids) - 1
        torch.testing.assert_close(
            torch.tensor(got.logprobs), forward_logprobs(model, ids), **ENGINE_PARITY
        )
        assert len(got.top_logprobs) == len(ids) - 1
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], -1)
        for pos, alts in enumerate(got.top_logprobs):
            assert list(alts) == full[pos].topk(3).indices.tolist()
        # New weights: the scores follow them.
        gen = torch.Generator().manual_seed(0)
        state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in
                 model.state_dict().items()}  # fmt: skip
        model.load_state_dict(state)
        push_weights(engine, state, 1)
        again = asyncio.run(engine.score(ids))
        assert again.top_logprobs is None
        torch.testing.assert_close(
            torch.tensor(again.logprobs), forward_logprobs(model, ids), **ENGINE_PARITY
        )
        assert max(abs(a - b) for a, b in zip(again.logprobs, got.logprobs, strict=True)) > 1e-2
        with pytest.raises(TemperError, match="scoring needs at least 2"):
            asyncio.run(engine.score(ids[:1]))
        with pytest.raises(PromptTooLongError, match="tokens to score but the engine context"):
            asyncio.run(engine.score([5] * (engine.max_context + 1)))
        with pytest.raises(TemperError, match="scored token id 99999 is outside"):
            asyncio.run(engine.score([5, 99999]))
    finally:
        asyncio.run(engine.close())
