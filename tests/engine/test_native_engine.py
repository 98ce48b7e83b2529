"""NativeEngine: numerical parity with HF, scheduling, sampling, stops, weights."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from fp32 import ENGINE_PARITY
from temper.engine.base import Engine, SamplingParams
from temper.engine.llama_forward import UnsupportedModelError
from temper.engine.native import NativeEngine
from temper.errors import PromptTooLongError, TemperError
from temper.weights import push_weights

from .conftest import EOS, VOCAB, CharTokenizer, hf_greedy, hf_logprobs, make_model, run

PROMPTS = [[5, 9, 13, 17, 21], [7, 8], [11] * 23, [30, 31, 32, 33, 34, 35, 36, 37, 38]]


def sampled(n: int = 1, seed: int | None = 0, max_new: int = 12, **kw) -> SamplingParams:
    return SamplingParams(
        n=n, temperature=1.0, max_new_tokens=max_new, seed=seed, ignore_eos=True, **kw
    )


@pytest.mark.parametrize("kind", ["llama", "llama_mha", "llama_yarn", "mistral", "qwen2", "qwen3"])
def test_logprobs_match_hf_forward(kind: str) -> None:
    model = make_model(kind)
    engine = NativeEngine(model, max_slots=8)
    assert isinstance(engine, Engine)

    async def go():
        # Mixed prompt lengths, n > 1 and different output lengths exercise padding,
        # the shared prefill, the length mask and row compaction.
        return await asyncio.gather(
            *[
                engine.generate(p, sampled(n=2, seed=i, max_new=8 + 4 * i))
                for i, p in enumerate(PROMPTS)
            ]
        )

    results = run(go())
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.prompt_token_ids == prompt
        for s in result.samples:
            ref = hf_logprobs(model, prompt, s.token_ids)
            torch.testing.assert_close(torch.tensor(s.logprobs), ref, **ENGINE_PARITY)
    run(engine.close())


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_matches_hf_generate(kind: str) -> None:
    model = make_model(kind)
    engine = NativeEngine(model)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)

    async def go():
        return await asyncio.gather(*[engine.generate(p, params) for p in PROMPTS])

    for prompt, result in zip(PROMPTS, run(go()), strict=True):
        assert result.samples[0].token_ids == hf_greedy(model, prompt, 20)
        assert result.samples[0].finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_batch_independent(llama) -> None:
    engine = NativeEngine(llama)
    prompt = PROMPTS[0]

    async def alone():
        return await engine.generate(prompt, sampled(n=3, seed=42, max_new=16))

    async def crowded():
        others = [engine.generate(p, sampled(n=2, seed=None, max_new=20)) for p in PROMPTS[1:]]
        results = await asyncio.gather(
            *others[:1], engine.generate(prompt, sampled(n=3, seed=42, max_new=16)), *others[1:]
        )
        return results[1]

    a, b, c = run(alone()), run(alone()), run(crowded())
    tokens = [s.token_ids for s in a.samples]
    assert tokens == [s.token_ids for s in b.samples]
    assert tokens == [s.token_ids for s in c.samples]
    assert len({tuple(t) for t in tokens}) > 1, "samples of one request should differ"
    d = run(engine.generate(prompt, sampled(n=3, seed=43, max_new=16)))
    assert [s.token_ids for s in d.samples] != tokens


def test_n_samples_share_one_prefill(llama) -> None:
    engine = NativeEngine(llama)
    prompt = PROMPTS[2]
    result = run(engine.generate(prompt, sampled(n=4, max_new=5)))
    assert len(result.samples) == 4
    assert engine.stats.prefill_tokens == len(prompt)
    assert engine.stats.prefill_batches == 1
    assert engine.stats.generated_tokens == 4 * 5
    assert engine.stats_dict()["samples"] == 4


def test_continuous_batching_short_request_overtakes_long(llama) -> None:
    engine = NativeEngine(llama)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)
    finished: list[str] = []

    async def request(name: str, prompt: list[int], max_new: int):
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_new_tokens=max_new)
        out = await engine.generate(prompt, params)
        finished.append(name)
        return out

    async def go():
        long = asyncio.create_task(request("long", PROMPTS[0], 100))
        while engine.stats.generated_tokens < 5:  # the long request is mid-generation
            await asyncio.sleep(0.001)
        short = asyncio.create_task(request("short", PROMPTS[1], 4))
        return await long, await short

    long, short = run(go())
    assert finished == ["short", "long"]
    assert engine.stats.requests == 2 and engine.stats.prefill_batches == 2
    assert long.samples[0].token_ids == hf_greedy(llama, PROMPTS[0], 100)
    assert short.samples[0].token_ids == hf_greedy(llama, PROMPTS[1], 4)
    for prompt, out in ((PROMPTS[0], long), (PROMPTS[1], short)):
        ref = hf_logprobs(llama, prompt, out.samples[0].token_ids)
        torch.testing.assert_close(torch.tensor(out.samples[0].logprobs), ref, **ENGINE_PARITY)
    del greedy


def test_requests_gathered_together_are_admitted_together(llama) -> None:
    engine = NativeEngine(llama)

    async def go():
        return await asyncio.gather(*[engine.generate(p, sampled(max_new=3)) for p in PROMPTS])

    run(go())
    assert engine.stats.prefill_batches == 1
    assert engine.stats.decode_steps == 2  # one prefill step + 2 decode steps for 3 tokens


def test_more_requests_than_slots_queue_and_complete(llama) -> None:
    engine = NativeEngine(llama, max_slots=3)

    async def go():
        return await asyncio.gather(
            *[engine.generate(p, sampled(n=2, seed=i, max_new=6)) for i, p in enumerate(PROMPTS)]
        )

    results = run(go())
    assert [len(r.samples) for r in results] == [2, 2, 2, 2]
    for prompt, r in zip(PROMPTS, results, strict=True):
        for s in r.samples:
            ref = hf_logprobs(llama, prompt, s.token_ids)
            torch.testing.assert_close(torch.tensor(s.logprobs), ref, **ENGINE_PARITY)
    with pytest.raises(TemperError, match="max_slots"):
        run(engine.generate(PROMPTS[0], sampled(n=4)))


def test_stop_token_and_eos(llama) -> None:
    prompt = PROMPTS[0]
    free = hf_greedy(llama, prompt, 20)
    stop = free[5]
    cut = free.index(stop) + 1
    engine = NativeEngine(llama)
    out = run(
        engine.generate(
            prompt,
            SamplingParams(
                temperature=0, max_new_tokens=20, stop_token_ids=(stop,), ignore_eos=True
            ),
        )
    ).samples[0]
    assert out.token_ids == free[:cut]  # the stop token is included
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert len(out.logprobs) == len(out.policy_versions) == cut

    # The model's eos stops generation unless ignore_eos is set.
    llama.generation_config.eos_token_id = stop
    try:
        eos_engine = NativeEngine(llama)
        out = run(
            eos_engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20))
        ).samples[0]
        assert out.token_ids == free[:cut] and out.stop_reason == stop
        out = run(
            eos_engine.generate(
                prompt, SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
            )
        ).samples[0]
        assert out.token_ids == free and out.finish_reason == "length" and out.stop_reason is None
    finally:
        llama.generation_config.eos_token_id = EOS


def test_stop_string(llama) -> None:
    prompt = PROMPTS[1]
    free = hf_greedy(llama, prompt, 20)
    tok = CharTokenizer()
    target = tok.decode(free[6:8])
    text = tok.decode(free)
    end = text.index(target) + len(target)  # one char per token
    engine = NativeEngine(llama, tok)
    params = SamplingParams(
        temperature=0, max_new_tokens=20, stop_strings=(target,), ignore_eos=True
    )
    out = run(engine.generate(prompt, params)).samples[0]
    assert out.token_ids == free[:end]
    assert out.finish_reason == "stop" and out.stop_reason == target
    with pytest.raises(TemperError, match="tokenizer"):
        run(NativeEngine(llama).generate(prompt, params))


def test_max_new_tokens_and_context_limit(llama) -> None:
    engine = NativeEngine(llama, max_context=20)
    assert engine.max_context == 20
    out = run(engine.generate([5] * 10, sampled(max_new=4))).samples[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    out = run(engine.generate([5] * 15, sampled(max_new=50))).samples[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    with pytest.raises(PromptTooLongError, match="20 tokens"):
        run(engine.generate([5] * 20, sampled()))
    with pytest.raises(TemperError, match="empty"):
        run(engine.generate([], sampled()))
    with pytest.raises(TemperError, match="vocabulary"):
        run(engine.generate([VOCAB + 1], sampled()))


def test_update_weights_changes_outputs_and_versions(llama) -> None:
    engine = NativeEngine(llama)
    prompt = PROMPTS[3]
    params = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    before = run(engine.generate(prompt, params)).samples[0]
    assert before.policy_versions == [0] * 10

    other = make_model("llama", seed=1)
    push_weights(engine, other.state_dict(), version=3)
    assert engine.version == 3
    after = run(engine.generate(prompt, params)).samples[0]
    assert after.policy_versions == [3] * 10
    assert after.token_ids != before.token_ids
    assert after.token_ids == hf_greedy(other, prompt, 10)
    ref = hf_logprobs(other, prompt, after.token_ids)
    torch.testing.assert_close(torch.tensor(after.logprobs), ref, **ENGINE_PARITY)

    with pytest.raises(KeyError, match="unknown"):
        push_weights(engine, {"nope.weight": torch.zeros(1)}, version=4)
    # the source model is not aliased: changing it does not change the engine
    with torch.no_grad():
        other.model.embed_tokens.weight.zero_()
    assert run(engine.generate(prompt, params)).samples[0].token_ids == after.token_ids


def test_update_weights_mid_generation_records_versions(llama) -> None:
    engine = NativeEngine(llama)

    async def go():
        task = asyncio.create_task(engine.generate(PROMPTS[0], sampled(max_new=60)))
        while engine.stats.generated_tokens < 10:
            await asyncio.sleep(0.001)
        push_weights(engine, llama.state_dict(), version=1)
        return await task

    versions = run(go()).samples[0].policy_versions
    assert versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions)


def test_cancelled_request_frees_its_slots(llama) -> None:
    engine = NativeEngine(llama, max_slots=2)

    async def go():
        task = asyncio.create_task(engine.generate(PROMPTS[0], sampled(n=2, max_new=100)))
        while engine.stats.generated_tokens < 4:
            await asyncio.sleep(0.001)
        task.cancel()
        return await engine.generate(PROMPTS[1], sampled(n=2, max_new=3))

    assert len(run(go()).samples) == 2


def test_close_fails_further_requests(llama) -> None:
    engine = NativeEngine(llama)

    async def go():
        await engine.generate(PROMPTS[0], sampled(max_new=2))
        await engine.close()
        with pytest.raises(RuntimeError, match="closed"):
            await engine.generate(PROMPTS[0], sampled())

    run(go())


def test_top_k_one_and_tiny_top_p_are_greedy(qwen2) -> None:
    engine = NativeEngine(qwen2)
    greedy = run(
        engine.generate(
            PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
        )
    )
    for extra in ({"top_k": 1}, {"top_p": 1e-6}):
        out = run(engine.generate(PROMPTS[0], sampled(n=2, max_new=10, **extra)))
        for s in out.samples:
            assert s.token_ids == greedy.samples[0].token_ids


def test_unsupported_architecture_suggests_hf() -> None:
    gpt2 = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32)
    )
    with pytest.raises(UnsupportedModelError, match=r'engine\.type = "hf"'):
        NativeEngine(gpt2)


def test_sliding_window_caps_the_context() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    from .conftest import COMMON

    windowed = MistralForCausalLM(MistralConfig(**{**COMMON, "sliding_window": 16}))
    assert NativeEngine(windowed).max_context == 16  # where sliding == full attention
    assert NativeEngine(make_model("mistral"), max_context=50).max_context == 50


def test_prefill_groups_and_attention_chunks() -> None:
    from temper.engine.planning import attention_chunks, group_by_length

    lengths = [30, 5, 6, 31, 7, 29]
    groups = group_by_length(lengths, overhead=8, budget=1000)
    assert sorted(k for g in groups for k in g) == list(range(6))
    assert [sorted(lengths[k] for k in g) for g in groups] == [[5, 6, 7], [29, 30, 31]]
    assert group_by_length(lengths, overhead=1000, budget=1000) == [[1, 2, 4, 5, 0, 3]]
    assert all(len(g) == 1 for g in group_by_length(lengths, overhead=0, budget=31))

    rows = [10] * 16 + [100] * 16
    assert attention_chunks(rows, overhead=64) == [(0, 16), (16, 32)]
    assert attention_chunks(rows, overhead=10_000) == [(0, 32)]
    assert attention_chunks([5, 6], overhead=0) == [(0, 2)]


def test_bfloat16_runs_close_to_hf() -> None:
    model = make_model("qwen2").to(torch.bfloat16)
    engine = NativeEngine(model)
    out = run(engine.generate(PROMPTS[0], sampled(max_new=8))).samples[0]
    ref = hf_logprobs(model, PROMPTS[0], out.token_ids)
    assert (torch.tensor(out.logprobs) - ref).abs().max() < 0.05


def test_worker_runs_many_decode_steps_per_hand_off(llama) -> None:
    engine = NativeEngine(llama)
    calls: list[int] = []
    run_step = engine._runner.run

    def counting(step):
        out = run_step(step)
        calls.append(len(out.versions))
        return out

    engine._runner.run = counting  # type: ignore[method-assign]

    async def go():
        return await asyncio.gather(
            engine.generate(PROMPTS[0], sampled(max_new=30)),
            engine.generate(PROMPTS[1], sampled(max_new=10, seed=1)),
        )

    long, short = run(go())
    # prefill (1 token), 9 steps until the short request finishes, then the rest
    assert calls == [1, 9, 20]
    assert engine.stats.decode_steps == 29 and engine.stats.generated_tokens == 40
    for prompt, out in ((PROMPTS[0], long), (PROMPTS[1], short)):
        ref = hf_logprobs(llama, prompt, out.samples[0].token_ids)
        torch.testing.assert_close(torch.tensor(out.samples[0].logprobs), ref, **ENGINE_PARITY)
    alone = run(engine.generate(PROMPTS[0], sampled(max_new=30)))
    assert alone.samples[0].token_ids == long.samples[0].token_ids


def test_release_memory_frees_the_cache_only_when_idle(llama) -> None:
    engine = NativeEngine(llama)
    initial = engine._runner.cache.nbytes()
    # 32 samples need more rows than the initial allocation, so the cache grows.
    params = SamplingParams(n=32, temperature=0, max_new_tokens=12, ignore_eos=True)
    first = run(engine.generate(PROMPTS[0], params)).samples[0].token_ids
    grown = engine._runner.cache.nbytes()
    assert grown > initial
    done_before = engine.stats.generated_tokens

    async def busy() -> bool:
        long = SamplingParams(temperature=0, max_new_tokens=100, ignore_eos=True)
        task = asyncio.create_task(engine.generate(PROMPTS[1], long))
        while engine.stats.generated_tokens - done_before < 5:
            await asyncio.sleep(0.001)
        assert not task.done()
        refused = not engine.release_memory()
        await task
        return refused

    assert run(busy()), "release_memory must refuse while a request is running"
    assert engine.release_memory()
    assert engine._runner.cache.nbytes() == initial
    # The engine keeps working (and gives the same greedy tokens) after a release.
    assert run(engine.generate(PROMPTS[0], params)).samples[0].token_ids == first
