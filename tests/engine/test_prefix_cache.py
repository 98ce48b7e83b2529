"""Prefill reuse: identical prompts admitted together run once; a next turn reuses the
previous turn's keys/values (the prefix cache). Outputs stay those of a full prefill."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from fp32 import ENGINE_PARITY, SAME_MATH
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine
from temper.engine.prefix_cache import PrefixCache
from temper.weights import push_weights

from .conftest import hf_logprobs, make_model, run

TURN1 = [5 + (7 * i) % 80 for i in range(30)]
TOOL = [40, 41, 42, 43, 44]


def greedy(max_new: int = 10, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_new_tokens=max_new, ignore_eos=True)


def sampled(seed: int, n: int = 1, max_new: int = 10) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, seed=seed, ignore_eos=True)


def _assert_matches_hf(model, prompt: list[int], result) -> None:
    """Every sample's logprobs equal HF's full forward over prompt + sample."""
    for s in result.samples:
        ref = hf_logprobs(model, prompt, s.token_ids)
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, **ENGINE_PARITY)


def _turns(engine: NativeEngine, params: SamplingParams) -> tuple[list[int], object]:
    """Turn 1, then turn 2 = turn 1's prompt + its response + a tool output."""
    first = run(engine.generate(TURN1, greedy(12)))
    turn2 = TURN1 + first.samples[0].token_ids + TOOL
    return turn2, run(engine.generate(turn2, params))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_next_turn_runs_only_its_new_tokens_and_matches_hf(kind):
    model = make_model(kind)
    engine = NativeEngine(model, max_slots=8)
    turn2, result = _turns(engine, sampled(seed=3, n=3))
    stats = engine.stats
    # Turn 1's prompt and all of its 12 tokens but the last (never fed back) were cached.
    reused = len(TURN1) + 11
    assert (stats.prefix_hits, stats.prefix_reused_tokens) == (1, reused)
    assert stats.prefill_tokens == len(TURN1) + len(turn2) - reused
    _assert_matches_hf(model, turn2, result)
    run(engine.close())


def test_identical_prompts_admitted_together_are_prefilled_once():
    model = make_model("qwen3")
    engine = NativeEngine(model)

    async def go():  # a group's episodes: one request each, same prompt
        return await asyncio.gather(*[engine.generate(TURN1, sampled(seed=i)) for i in range(4)])

    results = run(go())
    assert (engine.stats.prefill_tokens, engine.stats.prefill_forwards) == (len(TURN1), 1)
    assert len({tuple(r.samples[0].token_ids) for r in results}) > 1  # own seeds, own samples
    for r in results:
        _assert_matches_hf(model, TURN1, r)
    run(engine.close())


def test_outputs_equal_an_engine_without_the_cache():
    model = make_model("llama")
    cached, plain = NativeEngine(model), NativeEngine(model, prefix_cache_mb=0)
    turn2, a = _turns(cached, greedy(16))
    turn2_plain, b = _turns(plain, greedy(16))
    assert turn2 == turn2_plain
    assert a.samples[0].token_ids == b.samples[0].token_ids
    np.testing.assert_allclose(a.samples[0].logprobs, b.samples[0].logprobs, **SAME_MATH)
    assert plain.stats.prefix_hits == 0 and cached.stats.prefix_hits == 1
    assert len(cached._runner.prefix) == 1  # turn 1 (turn 2 is saved at the next step)
    run(cached.close())
    assert len(cached._runner.prefix) == 0  # close frees the kept keys/values too
    run(plain.close())


def test_hits_and_misses_admitted_together_each_get_their_own_prefix():
    model = make_model("qwen2")
    engine = NativeEngine(model, max_slots=16)

    async def go():
        firsts = await asyncio.gather(
            engine.generate(TURN1, greedy(6)), engine.generate(TURN1[:20] + [9] * 25, greedy(9))
        )
        nexts = [
            TURN1 + firsts[0].samples[0].token_ids + TOOL,  # hit: 35 cached, 5 new
            TURN1[:20] + [9] * 25 + firsts[1].samples[0].token_ids + [50] * 17,  # hit, 17 new
            [*TURN1[:22], 60, 61, 62],  # partial: shares 22 tokens with both entries
            [70, 71, 72, 73],  # miss: too short to share
        ]
        return nexts, await asyncio.gather(
            *[engine.generate(p, sampled(i, n=2)) for i, p in enumerate(nexts)]
        )

    prompts, results = run(go())
    assert engine.stats.prefix_hits == 3
    for prompt, result in zip(prompts, results, strict=True):
        _assert_matches_hf(model, prompt, result)
    run(engine.close())


def test_weight_update_empties_the_cache():
    model = make_model("llama")
    engine = NativeEngine(model)
    first = run(engine.generate(TURN1, greedy(8)))
    other = make_model("llama", seed=1)
    push_weights(engine, other.state_dict(), version=1)
    turn2 = TURN1 + first.samples[0].token_ids + TOOL
    result = run(engine.generate(turn2, greedy(8)))
    assert engine.stats.prefix_hits == 0  # the old keys/values were not reused
    _assert_matches_hf(other, turn2, result)
    run(engine.close())


def test_a_cancelled_request_is_not_cached():
    engine = NativeEngine(make_model("llama"))

    async def go():
        task = asyncio.ensure_future(engine.generate(TURN1, greedy(90)))
        while engine.stats.prefill_batches == 0:  # admitted: its row has run (or is running)
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # One more step runs the pending saves; this request is too short to be kept.
        await engine.generate([1, 2, 3], greedy(2))

    run(go())
    assert len(engine._runner.prefix) == 0
    run(engine.close())


def _entry(tokens: list[int], width: int = 4) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    kv = torch.zeros(2, 1, len(tokens), width)
    return np.array(tokens, dtype=np.int64), kv, kv.clone()


def test_lookup_finds_the_longest_shared_prefix_and_keeps_one_token_to_run():
    cache = PrefixCache(max_bytes=1 << 20, block=2)
    cache.add(*_entry([1, 2, 3, 4, 5, 6]))
    cache.add(*_entry([1, 2, 3, 9, 9]))
    assert cache.lookup(np.array([1, 2, 3, 9, 9, 7]))[1] == 5
    assert cache.lookup(np.array([1, 2, 3, 4, 8]))[1] == 4
    assert cache.lookup(np.array([1, 2, 3, 4, 5, 6]))[1] == 5  # the last token still runs
    assert cache.lookup(np.array([1, 7, 7, 7])) is None  # 1 shared < one block
    assert cache.lookup(np.array([2, 1, 3, 4])) is None
    assert (cache.stats.lookups, cache.stats.hits) == (5, 3)


def test_lookup_among_many_entries_picks_the_longest():
    rng = np.random.default_rng(0)
    cache = PrefixCache(max_bytes=1 << 30)
    stem = list(range(40))
    for _ in range(300):  # same 40-token stem, then random tails
        cache.add(*_entry(stem + rng.integers(100, 200, 60).tolist()))
    target = stem + rng.integers(100, 200, 60).tolist()
    cache.add(*_entry(target))
    for _ in range(300):
        cache.add(*_entry(stem + rng.integers(100, 200, 60).tolist()))
    entry, shared = cache.lookup(np.array([*target[:77], 5, 5, 5]))
    assert shared == 77 and entry.tokens.tolist() == target


def test_entries_are_evicted_least_recently_used_within_the_byte_budget():
    one = 2 * 2 * 1 * 10 * 4 * 4  # k and v of 2 layers x 1 head x 10 positions x 4 dims, fp32
    cache = PrefixCache(max_bytes=2 * one, block=2)
    a, b, c = ([k] * 10 for k in (1, 2, 3))
    cache.add(*_entry(a))
    cache.add(*_entry(b))
    assert cache.lookup(np.array([*a, 0])) is not None  # a is now the most recent
    cache.add(*_entry(c))  # evicts b
    assert cache.nbytes == 2 * one and cache.stats.evicted == 1
    assert cache.lookup(np.array([*b, 0])) is None
    assert cache.lookup(np.array([*a, 0])) is not None
    cache.add(*_entry(list(range(40))))  # larger than the whole budget: not kept
    assert len(cache) == 2
