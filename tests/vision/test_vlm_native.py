"""The native engine runs a LLaVA-style VLM: its logprobs equal the HF forward over the
same ids and pixels; each distinct image goes through the vision tower once per weight
version; the prefix cache and shared prefill tell prompts apart by their images."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fp32 import ENGINE_PARITY
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine
from temper.errors import ModelLoadError, TemperError
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.vision import ImageStore, load_image
from temper.weights.transport import InProcessTransport
from tiny_llava import assert_trainer_matches_engine, picture, picture_task


def _prompt(vlm, seed: int, text: str = "What is in the picture?"):
    _, tokenizer, vision = vlm
    renderer = PromptRenderer(tokenizer, vision=vision)
    ids, _, placed = renderer.render_images(picture_task(0, seed, text), keep=False)
    return ids, [image for _, image in placed]


def _hf_logprobs(model, vision, prompt, images, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids, **vision.pixel_inputs(images)).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    return lp[len(prompt) - 1 : -1].gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


def test_native_vlm_logprobs_equal_the_hf_forward(vlm):
    model, tokenizer, vision = vlm
    engine = NativeEngine(model, tokenizer, vision=vision, prefix_cache_mb=0)
    assert engine.abilities.images
    prompt, images = _prompt(vlm, 1)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=5)
    result = asyncio.run(engine.generate(prompt, params, images=images))
    for sample in result.samples:
        want = _hf_logprobs(model, vision, prompt, images, sample.token_ids)
        torch.testing.assert_close(torch.tensor(sample.logprobs), want, **ENGINE_PARITY)


def test_native_vlm_rollouts_train_token_exact(vlm, tmp_path):
    """Rollouts through the native engine, then the trainer's forward over the stored
    ids and image hashes: the engine's logprobs come back."""
    model, tokenizer, vision = vlm
    engine = NativeEngine(model, tokenizer, vision=vision)
    renderer = PromptRenderer(tokenizer, vision=vision)
    tasks = [picture_task(0, 1), picture_task(1, 2), picture_task(2, 1, "Describe it.")]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
    groups = asyncio.run(rollout_groups(engine, renderer, tasks, params, seed=3))
    store = ImageStore(tmp_path)
    for seed in (1, 2):
        store.put(load_image(picture(seed)))
    assert_trainer_matches_engine(model, [t for g in groups for t in g], vision, store)


def test_each_image_is_encoded_once_per_weight_version(vlm):
    model, tokenizer, vision = vlm
    engine = NativeEngine(model, tokenizer, vision=vision, prefix_cache_mb=0)
    encoder = engine._encoder
    assert encoder is not None
    a, images_a = _prompt(vlm, 11)
    b, images_b = _prompt(vlm, 12)
    a2, _ = _prompt(vlm, 11, "Describe it.")  # same image, other text
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)

    async def round_of_requests():
        return await asyncio.gather(
            engine.generate(a, params, images=images_a),
            engine.generate(b, params, images=images_b),
            engine.generate(a2, params, images=images_a),
        )

    asyncio.run(round_of_requests())
    assert (encoder.encoded, encoder.forwards) == (2, 1)  # both images, one batched forward
    asyncio.run(round_of_requests())
    assert encoder.encoded == 2  # all cached
    state = {k: v.clone() for k, v in model.state_dict().items() if "projector" in k}
    transport = InProcessTransport()
    transport.publish(state, 1)
    engine.load_weights(transport, 1)
    asyncio.run(round_of_requests())
    assert encoder.encoded == 4  # new weights: each image once more


def test_prefix_cache_and_shared_prefill_tell_images_apart(vlm):
    """Two prompts with the same ids but different images are different prompts: no
    shared prefill, no prefix hit across them; the same image in a later turn hits."""
    model, tokenizer, vision = vlm
    engine = NativeEngine(model, tokenizer, vision=vision)
    a, images_a = _prompt(vlm, 21)
    b, images_b = _prompt(vlm, 22)
    assert a == b  # same text: identical placeholder ids
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=5)

    async def both():
        return await asyncio.gather(
            engine.generate(a, greedy, images=images_a),
            engine.generate(b, greedy, images=images_b),
        )

    ra, rb = asyncio.run(both())
    assert engine.stats.prefill_tokens == 2 * len(a)  # each prompt ran: not shared
    for prompt, images, result in ((a, images_a, ra), (b, images_b, rb)):
        want = _hf_logprobs(model, vision, prompt, images, result.samples[0].token_ids)
        torch.testing.assert_close(torch.tensor(result.samples[0].logprobs), want, **ENGINE_PARITY)
    # A later turn that extends conversation a reuses a's keys/values (and images).
    turn2 = a + ra.samples[0].token_ids + tokenizer.encode(" and then?")
    hits = engine.stats.prefix_hits
    r2 = asyncio.run(engine.generate(turn2, greedy, images=images_a))
    assert engine.stats.prefix_hits == hits + 1
    want = _hf_logprobs(model, vision, turn2, images_a, r2.samples[0].token_ids)
    torch.testing.assert_close(torch.tensor(r2.samples[0].logprobs), want, **ENGINE_PARITY)
    # The same ids shown image b reuse only what b's own conversation ran: its entry,
    # not a's longer one.
    reused = engine.stats.prefix_reused_tokens
    r3 = asyncio.run(engine.generate(turn2, greedy, images=images_b))
    want = _hf_logprobs(model, vision, turn2, images_b, r3.samples[0].token_ids)
    torch.testing.assert_close(torch.tensor(r3.samples[0].logprobs), want, **ENGINE_PARITY)
    b_entry = b + rb.samples[0].token_ids[:-1]
    common = next(
        (i for i, (x, y) in enumerate(zip(b_entry, turn2, strict=False)) if x != y),
        min(len(b_entry), len(turn2) - 1),
    )
    assert engine.stats.prefix_reused_tokens - reused == common
    assert common < len(a) + len(ra.samples[0].token_ids) - 1  # less than a's entry offered


def test_bad_image_input_is_refused_in_one_line(vlm):
    model, tokenizer, vision = vlm
    engine = NativeEngine(model, tokenizer, vision=vision)
    prompt, images = _prompt(vlm, 1)
    params = SamplingParams(n=1, max_new_tokens=2)
    with pytest.raises(TemperError, match="image"):
        asyncio.run(engine.generate(prompt, params))  # image tokens but no image
    with pytest.raises(TemperError, match="image"):
        asyncio.run(engine.generate(prompt, params, images=images * 2))
    with pytest.raises(ModelLoadError, match="processor"):
        NativeEngine(model, tokenizer)
