"""Fixtures for the vision tests: one random tiny LLaVA per session (`tiny_llava`), and
its model, tokenizer and processor loaded once per test module (`vlm`)."""

from __future__ import annotations

import pytest

from tiny_llava import build_tiny_llava


@pytest.fixture(scope="session")
def llava_path(tmp_path_factory):
    return build_tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def vlm(llava_path):
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    from temper.vision.processor import VisionProcessor

    model = LlavaForConditionalGeneration.from_pretrained(llava_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(llava_path)
    vision = VisionProcessor.from_pretrained(llava_path)
    assert vision is not None
    return model, tokenizer, vision
