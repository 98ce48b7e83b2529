"""`ImageStore`: a run's images, each stored once, named by content.

Trajectories name their images by SHA-256 (`temper.vision.images.Image`); the
pixels live here, in ``<run>/images/<first two hex digits>/<sha256>.png``. A
group of 16 samples over one image, or 10 turns that repeat a screenshot,
store it once. Writes are atomic (a temporary file, then a rename), so a run
killed mid-write leaves no torn image; a stored file is never rewritten.

Reading checks nothing beyond decoding: the name was computed from the pixels
when they were stored, and the store is the run's own directory.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from pathlib import Path

from temper.vision.images import Image, ImageError, _decode

#: Images kept decoded in memory (the rest are read back from disk on demand).
CACHE_SIZE = 256


class ImageStore:
    """Content-addressed PNG files under ``root``, with a small in-memory cache."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._cache: OrderedDict[str, Image] = OrderedDict()

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / f"{sha256}.png"

    def __contains__(self, sha256: str) -> bool:
        return sha256 in self._cache or self.path(sha256).exists()

    def put(self, image: Image) -> bool:
        """Store ``image`` unless it is there already; True when it was written."""
        self._remember(image)
        target = self.path(image.sha256)
        if target.exists():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".png")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(image.png)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return True

    def get(self, sha256: str) -> Image:
        """The stored image named ``sha256``; `ImageError` when the store lacks it."""
        if (hit := self._cache.get(sha256)) is not None:
            self._cache.move_to_end(sha256)
            return hit
        try:
            data = self.path(sha256).read_bytes()
        except FileNotFoundError:
            raise ImageError(f"image {sha256[:12]} is not in the image store {self.root}") from None
        image = _decode(data, f"stored image {sha256[:12]}")
        if image.sha256 != sha256:
            raise ImageError(f"stored image {sha256[:12]} decodes to {image.sha256[:12]}")
        self._remember(image)
        return image

    def _remember(self, image: Image) -> None:
        self._cache[image.sha256] = image
        self._cache.move_to_end(image.sha256)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.png"))
