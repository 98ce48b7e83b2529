"""A small random LLaVA (CLIP vision tower + the built-in tiny Llama) for vision tests.

Built from configs in code and saved with its processor, once per session. It
is random, so it tests plumbing and numerics, not competence.
"""

from __future__ import annotations

import torch

IMAGE_TOKEN = "<image>"

# ChatML with content parts: a text part is its text, an image part the placeholder.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'text' %}{{- part.text }}{%- else %}{{- '<image>' }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tiny_llava(path):
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from temper.models import resolve_model_path

    base = resolve_model_path("tiny")
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    text = AutoConfig.from_pretrained(base)
    text.vocab_size = len(tok)
    vision = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=64,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    images = CLIPImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )
    model.save_pretrained(path)
    processor.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def picture(seed: int, size: tuple[int, int] = (40, 30)):
    """A seeded picture: coloured rectangles on a background."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    im = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(im)
    for _ in range(3):
        x, y = rng.randrange(size[0] - 8), rng.randrange(size[1] - 8)
        draw.rectangle((x, y, x + 8, y + 8), fill=tuple(rng.randrange(256) for _ in range(3)))
    return im


def picture_task(i: int, image_seed: int, text: str = "What is in the picture?"):
    """A one-message task showing ``picture(image_seed)`` with ``text``."""
    from temper.records import Task

    content = [{"type": "image", "image": picture(image_seed)}, {"type": "text", "text": text}]
    return Task(id=f"t{i}", prompt=[{"role": "user", "content": content}])


def assert_trainer_matches_engine(model, trajs, vision, store):
    """The trainer's forward over the stored ids and images gives back each trajectory's
    logprobs of its sampled tokens (fp32 parity); returns the collated micro-batch."""
    from fp32 import ENGINE_PARITY
    from temper.trainer.batching import collate
    from temper.trainer.forward import response_logits
    from temper.vision.processor import pixel_source

    mb = collate(trajs, list(range(len(trajs))), pad_id=0, pixels=pixel_source(vision, store))
    with torch.no_grad():
        logits = response_logits(model, mb)
    logprobs = torch.log_softmax(logits, -1).gather(2, mb.response_ids.unsqueeze(-1)).squeeze(-1)
    for row, t in enumerate(trajs):
        sampled = torch.tensor(t.loss_mask, dtype=torch.bool)
        got = logprobs[row, : len(t.response_ids)][sampled]
        want = torch.tensor(t.behaviour_logprobs)[sampled]
        torch.testing.assert_close(got, want, **ENGINE_PARITY)
    return mb


def picture_png(seed: int) -> bytes:
    """`picture(seed)` as PNG bytes, as a dataset row stores an image."""
    import io

    buf = io.BytesIO()
    picture(seed).save(buf, format="PNG")
    return buf.getvalue()


def picture_dataset(path, seeds) -> None:
    """A parquet dataset at ``path``: one row per seed, its picture and a question."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {
        "prompt": ["<image>How many squares are there? Answer with a number." for _ in seeds],
        "answer": ["3" for _ in seeds],
        "images": [[picture_png(s)] for s in seeds],
    }
    pq.write_table(pa.table(rows), path)
