"""`PromptImages`: images in rendered conversations, for single prompts and episodes.

The rollout code renders messages through the chat template as before; this
object does the image side of it:

- `normalize(messages)`: image parts in any accepted form become `Image`s
  (an `ImageError` names a bad one); with no VLM, an image is refused;
- `splice(ids, messages, offset, placed)`: the template's placeholders in
  ``ids`` become each image's token run; ``placed`` gets ``(offset + start,
  image)`` for each, and the run's image store keeps the image;
- `generate(engine, ids, params, shown)`: the engine call, with every image
  shown so far when there are any (an engine that takes none refuses).

``PromptImages()`` (no processor) is the text-only case: text passes through
and an image is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from temper.errors import DataError
from temper.vision.images import Image, ImageError, has_images, message_images, normalize_messages
from temper.vision.processor import VisionProcessor
from temper.vision.store import ImageStore


@dataclass
class PromptImages:
    """A VLM's processor and the run's image store (both optional; see the module doc)."""

    processor: VisionProcessor | None = None
    store: ImageStore | None = None

    def normalize(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if not has_images(list(messages)):
            return list(messages)
        if self.processor is None:
            raise ImageError("the messages show images, but the model is text-only")
        return normalize_messages(list(messages))

    def splice(
        self,
        ids: list[int],
        messages: Sequence[dict[str, Any]],
        offset: int,
        placed: list[tuple[int, Image]],
        keep: bool = True,
    ) -> list[int]:
        images = message_images(list(messages))
        if not images:
            return ids
        assert self.processor is not None  # normalize refused images without one
        ids, starts = self.processor.expand(ids, images)
        for start, image in zip(starts, images, strict=True):
            placed.append((offset + start, image))
            if keep and self.store is not None:
                self.store.put(image)
        return ids

    async def generate(
        self, engine: Any, ids: list[int], params: Any, shown: Sequence[tuple[int, Image]]
    ) -> Any:
        if not shown:  # engines without image support need not take the argument
            return await engine.generate(ids, params)
        if not engine.abilities.images:
            raise DataError(f"{type(engine).__name__} takes no images; the prompt shows some")
        return await engine.generate(ids, params, images=[image for _, image in shown])
