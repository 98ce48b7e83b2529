"""Token-in/token-out with images: a VLM's rollouts through the HF engine, then the
trainer's forward over exactly the stored ids and images, must give the engine's
logprobs back; images are processed once each; a prompt is its ids *and* images."""

from __future__ import annotations

import asyncio

import pytest
import torch

from temper.engine.base import SamplingParams
from temper.engine.hf import HFEngine
from temper.errors import DataError
from temper.models import load_tokenizer
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.trainer.batching import collate, plan_micro_batches
from temper.trainer.forward import response_logits
from temper.vision import ImageStore, load_image
from temper.vision.processor import pixel_source
from tiny_llava import assert_trainer_matches_engine, picture, picture_task


def _rollouts(vlm, tasks, n=2):
    model, tokenizer, vision = vlm
    engine = HFEngine(model, tokenizer, vision=vision)
    assert engine.abilities.images
    renderer = PromptRenderer(tokenizer, vision=vision)
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=6)
    return asyncio.run(rollout_groups(engine, renderer, tasks, params, seed=3))


def test_trainer_forward_over_stored_ids_and_images_gives_the_engines_logprobs(vlm, tmp_path):
    model, _, vision = vlm
    tasks = [picture_task(0, 1), picture_task(1, 2), picture_task(2, 1, "Describe it.")]
    groups = _rollouts(vlm, tasks)
    trajs = [t for g in groups for t in g]
    store = ImageStore(tmp_path)
    for seed in (1, 2):
        store.put(load_image(picture(seed)))
    t0 = trajs[0]
    # The image's run of placeholder tokens sits where the trajectory says.
    offset, sha = t0.images[0]
    assert sha == load_image(picture(1)).sha256
    run = vision.image_run(load_image(picture(1)))
    assert t0.prompt_ids[offset : offset + len(run)] == run
    assert len(run) == 16  # (32 / 8) ** 2 patches, CLS dropped
    mb = assert_trainer_matches_engine(model, trajs, vision, store)
    assert mb.prompt_ids.shape[0] == 3  # three distinct prompts, each once


def test_a_prompt_is_its_ids_and_its_images(vlm, tmp_path):
    model, _, vision = vlm
    same_text = [picture_task(0, 7), picture_task(1, 8), picture_task(2, 7)]
    trajs = [g[0] for g in _rollouts(vlm, same_text, n=1)]
    assert trajs[0].prompt_ids == trajs[1].prompt_ids  # same text, same placeholder ids
    assert trajs[0].prompt_key() != trajs[1].prompt_key()
    assert trajs[0].prompt_key() == trajs[2].prompt_key()
    store = ImageStore(tmp_path)
    for seed in (7, 8):
        store.put(load_image(picture(seed)))
    mb = collate(trajs, [0, 1, 2], pad_id=0, pixels=pixel_source(vision, store))
    assert mb.prompt_ids.shape[0] == 2 and mb.prompt_pixels["pixel_values"].shape[0] == 2
    with torch.no_grad():
        first = response_logits(model, mb)[:, 0]
    # Different pictures behind identical ids: the model sees them differently.
    assert not torch.allclose(first[0], first[1])
    torch.testing.assert_close(first[0], first[2])
    # The planner counts distinct prompts the same way: all three rows cost two
    # prompts and three responses (one prompt, had it keyed on ids alone).
    p, r = len(trajs[0].prompt_ids), max(len(t.response_ids) for t in trajs)
    fewest = {"overhead": 10**6}  # so the plan uses as few micro-batches as fit
    assert len(plan_micro_batches(trajs, token_budget=2 * p + 3 * r, **fewest)) == 1
    assert len(plan_micro_batches(trajs, token_budget=p + 3 * r, **fewest)) > 1


def test_each_image_goes_through_the_image_processor_once(vlm, tmp_path):
    _, _, vision = vlm
    before = vision.encoded
    tasks = [picture_task(i, 20 + i % 2) for i in range(4)]  # two distinct pictures
    trajs = [t for g in _rollouts(vlm, tasks) for t in g]
    assert vision.encoded - before == 2
    store = ImageStore(tmp_path)
    for seed in (20, 21):
        store.put(load_image(picture(seed)))
    collate(trajs, list(range(len(trajs))), pad_id=0, pixels=pixel_source(vision, store))
    assert vision.encoded - before == 2  # the trainer reuses them


def test_images_for_a_text_model_or_without_a_pixel_source_are_refused(vlm):
    from temper.models import resolve_model_path

    renderer = PromptRenderer(load_tokenizer(resolve_model_path("tiny")))
    with pytest.raises(
        DataError, match="task t0: the messages show images, but the model is text-only"
    ):
        renderer.render_images(picture_task(0, 1))
    trajs = [g[0] for g in _rollouts(vlm, [picture_task(0, 1)], n=1)]
    with pytest.raises(ValueError, match="needs a pixel source"):
        collate(trajs, [0], pad_id=0)
