"""`VisionProcessor`: what a vision-language model needs from images, per image.

A VLM's chat template writes one placeholder token per image (LLaVA:
``<image>``); the model's processor expands it into as many image tokens as
the vision tower yields for that image, and turns the image into pixel inputs
(LLaVA: ``pixel_values [1, 3, H, W]``; Qwen2-VL: patches plus
``image_grid_thw``). Temper keeps token ids exact, so both happen here, at the
token level, on ids the tokenizer already produced:

- `expand(ids, images)`: each placeholder id becomes the image's token run;
  the count comes from the model's own processor, asked once per image size;
- `pixel_inputs(images)`: the processor's tensors for those images, computed
  once per image (cached by content hash) and concatenated in order, which is
  how HF VLM forwards match image tokens to images.

Everything model-specific is the HF processor's; this class only caches and
splices, so any HF VLM whose processor follows that contract works.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from temper.errors import ModelLoadError
from temper.vision.images import Image, ImageError

#: Per-image pixel inputs kept in memory.
CACHE_SIZE = 1024


class VisionProcessor:
    """Token expansion and pixel inputs for one HF VLM processor (see the module doc)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        token = getattr(processor, "image_token", None)
        tokenizer = processor.tokenizer
        if token is None:
            raise ModelLoadError(f"{type(processor).__name__} names no image token")
        self.image_token: str = token
        self.image_token_id: int = int(tokenizer.convert_tokens_to_ids(token))
        self._runs: dict[tuple[int, int], list[int]] = {}
        self._pixels: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        #: How many images went through the image processor (cache misses).
        self.encoded = 0

    @classmethod
    def from_pretrained(cls, path: str | Path) -> VisionProcessor | None:
        """The processor saved with the model at ``path``; None for a text-only model."""
        from transformers import AutoProcessor

        if (
            not (Path(path) / "processor_config.json").exists()
            and not (Path(path) / "preprocessor_config.json").exists()
        ):
            return None
        try:
            processor = AutoProcessor.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the image processor at {path}: {exc}") from None
        if getattr(processor, "image_processor", None) is None:
            return None
        return cls(processor)

    def image_run(self, image: Image) -> list[int]:
        """The token ids that stand for ``image`` in the prompt (its placeholder expanded)."""
        key = (image.width, image.height)
        run = self._runs.get(key)
        if run is None:
            # LLaVA and Qwen2-VL alike expand a placeholder into copies of itself;
            # only the count depends on the model (and, for some, on the size).
            out = self.processor(text=[self.image_token], images=[image.pil()])
            count = sum(1 for t in out["input_ids"][0] if int(t) == self.image_token_id)
            if count == 0:
                raise ModelLoadError("the processor's expansion holds no image token")
            run = [self.image_token_id] * count
            self._runs[key] = run
        return run

    def expand(self, ids: Sequence[int], images: Sequence[Image]) -> tuple[list[int], list[int]]:
        """``ids`` with the k-th placeholder replaced by ``images[k]``'s token run,
        and where each run starts in the result."""
        out: list[int] = []
        starts: list[int] = []
        for t in ids:
            if t != self.image_token_id:
                out.append(t)
                continue
            if len(starts) >= len(images):
                raise ImageError(
                    f"the text holds more image placeholders than its {len(images)} image(s)"
                )
            starts.append(len(out))
            out.extend(self.image_run(images[len(starts) - 1]))
        if len(starts) != len(images):
            raise ImageError(
                f"{len(images)} image(s) but {len(starts)} image placeholder(s) in the text"
            )
        return out, starts

    def _encode(self, image: Image) -> dict[str, torch.Tensor]:
        hit = self._pixels.get(image.sha256)
        if hit is not None:
            self._pixels.move_to_end(image.sha256)
            return hit
        batch = self.processor.image_processor(images=[image.pil()], return_tensors="pt")
        tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        self.encoded += 1
        self._pixels[image.sha256] = tensors
        while len(self._pixels) > CACHE_SIZE:
            self._pixels.popitem(last=False)
        return tensors

    def pixel_inputs(self, images: Sequence[Image]) -> dict[str, torch.Tensor]:
        """The model's image inputs for ``images`` in order ({} for none)."""
        if not images:
            return {}
        parts = [self._encode(im) for im in images]
        return {k: torch.cat([p[k] for p in parts], dim=0) for k in parts[0]}

    def count_image_tokens(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` are image tokens (what micro-batch planning counts)."""
        return sum(1 for t in ids if t == self.image_token_id)


def pixel_source(vision: VisionProcessor, store: Any) -> Any:
    """The trainer's `PixelSource`: image hashes -> inputs, pixels read from ``store``
    (a `temper.vision.ImageStore`), each image processed once (cached by hash)."""

    def pixels(hashes: Sequence[str]) -> dict[str, torch.Tensor]:
        return vision.pixel_inputs([store.get(h) for h in hashes])

    return pixels


@functools.cache
def vision_for(model_dir: str) -> VisionProcessor | None:
    """The one `VisionProcessor` of the model in ``model_dir`` in this process (None for a
    text model): the engine, the prompt renderer and the trainer share its caches."""
    return VisionProcessor.from_pretrained(model_dir)


def image_spans(ids: Sequence[int], image_token_id: int, images: int) -> list[tuple[int, int]]:
    """Where each of ``images`` images sits in ``ids``: ``(start, length)`` of its token run.

    Runs are maximal stretches of the image token. When two images sit back to
    back (one stretch), the stretch splits evenly: LLaVA-style models give every
    image the same number of tokens. Anything else raises `ImageError`.
    """
    stretches: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != image_token_id:
            continue
        if stretches and sum(stretches[-1]) == i:
            start, length = stretches[-1]
            stretches[-1] = (start, length + 1)
        else:
            stretches.append((i, 1))
    if len(stretches) == images:
        return stretches
    total = sum(n for _, n in stretches)
    if images and total % images == 0:
        each = total // images
        if all(n % each == 0 for _, n in stretches):
            return [(s + j * each, each) for s, n in stretches for j in range(n // each)]
    raise ImageError(
        f"cannot tell {images} image(s) apart in {len(stretches)} run(s) of image tokens"
    )


def collapse_image_runs(ids: list[int], image_token_id: int | None, images: int) -> list[int]:
    """``ids`` with each image's run of image tokens (`image_spans`) cut to one placeholder."""
    if image_token_id is None:
        raise ImageError("the model names no image token")
    out: list[int] = []
    done = 0
    for start, length in image_spans(ids, image_token_id, images):
        out.extend(ids[done:start])
        out.append(image_token_id)
        done = start + length
    out.extend(ids[done:])
    return out
