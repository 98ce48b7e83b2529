"""Images in Temper: canonical content-named images, the run's image store, and
what a vision-language model needs from them (placeholder expansion, pixel inputs).

See docs/vision.md.
"""

from temper.vision.images import (
    Image,
    ImageError,
    content_parts,
    has_images,
    load_image,
    message_images,
    normalize_messages,
)
from temper.vision.store import ImageStore

__all__ = [
    "Image",
    "ImageError",
    "ImageStore",
    "content_parts",
    "has_images",
    "load_image",
    "message_images",
    "normalize_messages",
]
