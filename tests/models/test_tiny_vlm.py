"""The built-in tiny VLM (LLaVA): files, processor, chat template, forward with an image."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from temper.data.visual import VisualTasks, is_correct, render, user_content
from temper.errors import ModelLoadError
from temper.models import TINY_VLM_DIR, is_vision_language, load_model, load_processor
from temper.models.chat_template import IMAGE_TOKEN
from temper.models.loader import resolve_model_path
from temper.rewards.answers import extract_boxed

IMAGE_TOKENS = 16  # (64 / 16) ** 2 patches, the CLS feature dropped


@pytest.fixture(scope="module")
def processor():  # type: ignore[no-untyped-def]
    return AutoProcessor.from_pretrained(TINY_VLM_DIR)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return LlavaForConditionalGeneration.from_pretrained(TINY_VLM_DIR).eval()


def encode(processor, messages, *, generation_prompt=True):  # type: ignore[no-untyped-def]
    return processor.apply_chat_template(
        messages,
        add_generation_prompt=generation_prompt,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )


def test_shipped_files_size_and_config():
    names = {p.name for p in TINY_VLM_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "processor_config.json", "generation_config.json", "README.md"} <= names  # fmt: skip
    assert sum(p.stat().st_size for p in TINY_VLM_DIR.iterdir()) < 25 * 1024 * 1024
    config = json.loads((TINY_VLM_DIR / "config.json").read_text())
    assert config["model_type"] == "llava" and config["image_seq_length"] == IMAGE_TOKENS
    assert (
        config["vision_config"]["image_size"] == 64 and config["vision_config"]["patch_size"] == 16
    )
    assert "_name_or_path" not in config["text_config"]
    assert resolve_model_path("tiny_vlm") == resolve_model_path("builtin:tiny_vlm") == TINY_VLM_DIR
    assert is_vision_language("tiny_vlm") and not is_vision_language("tiny")


def test_template_renders_image_parts_and_the_processor_expands_them(processor):
    tok = processor.tokenizer
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    assert tok.convert_ids_to_tokens(tok(IMAGE_TOKEN, add_special_tokens=False)["input_ids"]) == [
        IMAGE_TOKEN
    ]
    scene = render("count", 3)
    messages = [{"role": "user", "content": user_content(scene.image, "How many?")}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n<image>How many?<|im_end|>\n<|im_start|>assistant\n"
    enc = encode(processor, messages)
    assert (enc["input_ids"][0] == image_id).sum().item() == IMAGE_TOKENS
    assert tuple(enc["pixel_values"].shape) == (1, 3, 64, 64)
    # String content renders exactly as the text model's template does.
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tok.apply_chat_template(plain, tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    )


def test_forward_with_an_image_gives_finite_logprobs_that_depend_on_the_image(processor, model):
    task = VisualTasks(kinds=["same_colour"]).heldout(1)[0]
    messages = [*task.messages(), {"role": "assistant", "content": "\\boxed{yes}"}]
    enc = encode(processor, messages, generation_prompt=False)
    with torch.no_grad():
        logits = model(**enc).logits
        other = render("same_colour", 7).image
        enc_other = encode(processor, [*messages[:0], {"role": "user", "content": user_content(
            other, messages[0]["content"][1]["text"])}, messages[1]], generation_prompt=False)  # fmt: skip
        logits_other = model(**enc_other).logits
    logprobs = torch.log_softmax(logits[0, :-1], -1)
    ids = enc["input_ids"][0, 1:]
    picked = logprobs.gather(1, ids[:, None])[:, 0]
    assert torch.isfinite(picked).all() and (picked <= 0).all()
    assert not torch.allclose(logits[0, -6:], logits_other[0, -6:])  # the picture matters


def greedy(processor, model, tasks):  # type: ignore[no-untyped-def]
    tok = processor.tokenizer
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template(t.messages(), add_generation_prompt=True, tokenize=False)
        for t in tasks
    ]
    images = [t.prompt[0]["content"][0]["image"] for t in tasks]
    enc = processor(images=images, text=texts, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def test_greedy_answers_are_well_formed_and_the_pretrained_model_sees_colours(processor, model):
    replies = greedy(processor, model, VisualTasks().heldout(8))
    assert all(extract_boxed(r) is not None for r in replies), replies
    # Pretraining made the picture matter: same-colour questions (yes/no, half each)
    # are answered well above chance on held-out pictures (37 of 50 when written;
    # 33 or more has a 1.6% chance for a coin).
    tasks = VisualTasks(kinds=["same_colour"]).heldout(50)
    replies = greedy(processor, model, tasks)
    assert sum(is_correct(t, r) for t, r in zip(tasks, replies, strict=True)) >= 33


def test_load_model_takes_the_alias_and_any_hf_llava_checkpoint(tmp_path, model):
    loaded = load_model("tiny_vlm")
    assert isinstance(loaded, LlavaForConditionalGeneration) and not loaded.training
    # transformers' own key layout (the shipped file uses the classic one vLLM reads).
    model.save_pretrained(tmp_path)
    load_processor("tiny_vlm").save_pretrained(tmp_path)
    again = load_model(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert type(load_processor(tmp_path)).__name__ == "LlavaProcessor"
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match="cannot load an image-text model from"):
        load_model(tmp_path)
