"""A vision-language model through vLLM: token ids with the image runs already
expanded, the images as multi-modal data; the trainer's forward over the stored
trajectory gives vLLM's logprobs back (fp32)."""

from __future__ import annotations

import asyncio

import pytest

from temper.data.base import Task
from temper.engine.base import SamplingParams
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.vision import ImageStore, load_image
from temper.vision.processor import VisionProcessor
from tiny_llava import assert_trainer_matches_engine, picture

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def test_vllm_samples_from_what_the_trainer_sees(tmp_path):
    """On the shipped tiny VLM: vLLM 0.32 reads LLaVA's vision tower only under the
    classic checkpoint names, which the shipped weights use (docs/vision.md)."""
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    from temper.engine.vllm_engine import VLLMEngine
    from temper.models import resolve_model_path

    llava_path = resolve_model_path("tiny_vlm")

    tokenizer = AutoTokenizer.from_pretrained(llava_path)
    vision = VisionProcessor.from_pretrained(llava_path)
    engine = VLLMEngine(str(llava_path), tokenizer, dtype="float32", max_context=256)
    assert engine.abilities.images
    tasks = [
        Task(
            id=f"t{seed}",
            prompt=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": picture(seed)},
                        {"type": "text", "text": "What is it?"},
                    ],
                }
            ],
        )
        for seed in (1, 2)
    ]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)

    async def run():
        try:
            return await rollout_groups(
                engine, PromptRenderer(tokenizer, vision=vision), tasks, params, seed=5
            )
        finally:
            await engine.close()

    trajs = [t for g in asyncio.run(run()) for t in g]
    store = ImageStore(tmp_path)
    for seed in (1, 2):
        store.put(load_image(picture(seed)))
    model = LlavaForConditionalGeneration.from_pretrained(llava_path).eval()
    assert_trainer_matches_engine(model, trajs, vision, store)
