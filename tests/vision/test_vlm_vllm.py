"""A vision-language model through vLLM: token ids with the image runs already
expanded, the images as multi-modal data; the trainer's forward over the stored
trajectory gives vLLM's logprobs back (fp32)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from temper.engine.base import SamplingParams
from temper.records import Task
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.vision import ImageStore, load_image
from temper.vision.processor import VisionProcessor
from tiny_llava import assert_trainer_matches_engine, picture, picture_task

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


def test_vlm_weight_updates_reach_vllm_tower_projector_and_language_model(tmp_path):
    """The trainer publishes a VLM under its in-memory names; vLLM must load every part
    (vision tower, projector, language model), or its logprobs would not follow."""
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    from temper.engine.vllm_engine import VLLMEngine
    from temper.models import resolve_model_path
    from temper.weights.transport import InProcessTransport

    path = resolve_model_path("tiny_vlm")
    tokenizer = AutoTokenizer.from_pretrained(path)
    vision = VisionProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # change one tensor in each part
        for name, p in model.named_parameters():
            if name.endswith(
                (
                    "vision_tower.post_layernorm.weight",
                    "linear_2.weight",
                    "layers.3.mlp.up_proj.weight",
                )
            ):
                p.add_(0.05 * torch.randn_like(p))
    engine = VLLMEngine(str(path), tokenizer, dtype="float32", max_context=256)
    transport = InProcessTransport()
    transport.publish(model.state_dict(), 1)
    engine.load_weights(transport, 1)
    task = Task(
        id="t",
        prompt=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": picture(3)},
                    {"type": "text", "text": "What is it?"},
                ],
            }
        ],
    )
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)

    async def run():
        try:
            return await rollout_groups(
                engine, PromptRenderer(tokenizer, vision=vision), [task], params, seed=5
            )
        finally:
            await engine.close()

    trajs = [t for g in asyncio.run(run()) for t in g]
    assert all(v == 1 for t in trajs for v in t.versions)
    store = ImageStore(tmp_path)
    store.put(load_image(picture(3)))
    assert_trainer_matches_engine(model, trajs, vision, store)


def test_adapter_updates_reach_vllms_language_model_under_the_vlms_names(tmp_path):
    """A `[lora]` trainer of a VLM publishes adapters of its language model under the
    VLM's HF names (``model.language_model.*``); vLLM loads each as a LoRA of its
    LLaVA and serves the trainer's merged forward over the images (made at random
    here: this environment has no peft; tests/vision/test_vlm_lora.py has the trainer)."""
    from transformers import AutoTokenizer

    from temper.engine.vllm_engine import VLLMEngine
    from temper.models import load_model, resolve_model_path
    from temper.weights import push_weights
    from temper.weights.adapter import LORA_A, LORA_B, merge_into

    path = resolve_model_path("tiny_vlm")
    tokenizer = AutoTokenizer.from_pretrained(path)
    vision = VisionProcessor.from_pretrained(path)
    store = ImageStore(tmp_path)
    store.put(load_image(picture(3)))
    task = picture_task(0, 3, "What is it?")
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
    engine = VLLMEngine(
        str(path), tokenizer, dtype="float32", max_context=256, adapter_versions=1,
        max_lora_rank=4,
    )  # fmt: skip
    layers = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    async def rollouts():
        renderer = PromptRenderer(tokenizer, vision=vision)
        groups = await rollout_groups(engine, renderer, [task], params, seed=5)
        return [t for g in groups for t in g]

    try:
        for version in (1, 2):
            g = torch.Generator().manual_seed(version)
            update = {}
            for name, module in load_model(path).named_modules():
                if name.startswith("model.language_model.") and name.endswith(layers):
                    update[name + LORA_A] = torch.randn(4, module.in_features, generator=g) / 10
                    update[name + LORA_B] = torch.randn(module.out_features, 4, generator=g) / 10
            push_weights(engine, update, version)
            trajs = asyncio.run(rollouts())
            assert all(v == version for t in trajs for v in t.versions)
            merged = merge_into(load_model(path), update).eval()
            assert_trainer_matches_engine(merged, trajs, vision, store)
            with pytest.raises(AssertionError):  # the base would not: the adapter counts
                assert_trainer_matches_engine(load_model(path).eval(), trajs, vision, store)
    finally:
        asyncio.run(engine.close())
