"""Images as data: one canonical form, named by its content.

Prompts, observations and dataset rows carry images in OpenAI-style content
parts. Whatever form an image arrives in, `load_image` turns it into an
`Image`: RGB pixels, encoded once as PNG, and named by the SHA-256 of its size
and pixels. The name is what trajectories, caches and the run's image store
key on, so the same picture is encoded, stored and run through a vision tower
once, however many samples or turns show it.

Accepted forms (`load_image`):

- a ``PIL.Image.Image`` (any mode; converted to RGB);
- ``bytes`` of an encoded image (PNG, JPEG, WebP, ...);
- a ``data:image/...;base64,...`` URL;
- a path (``str`` or ``Path``) to an image file;
- a dict as HF ``datasets`` stores its ``Image`` feature: ``{"bytes": ...}`` or
  ``{"path": ...}``;
- an `Image` (returned as is).

Remote ``http(s)://`` URLs are refused: a run must be hermetic, so a dataset
that needs the network is a dataset that breaks mid-run.

`load_image` trusts its caller: a dataset names image files on this machine.
Input from outside (a server's requests) goes through `UntrustedImages`
instead: data URLs only, and a path or ``file:`` URL only when it names a
regular file inside one folder the operator allowed.

Content parts (`content_parts`): ``{"type": "text", "text": ...}``,
``{"type": "image", "image": <any form above>}`` and OpenAI's
``{"type": "image_url", "image_url": {"url": ...}}`` all normalise to text
parts and ``{"type": "image", "image": Image}`` parts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from temper.errors import DataError

#: Images larger than this many pixels are refused (a 4096 x 4096 screenshot
#: is 16.8 M); a decompression bomb would otherwise fill memory.
MAX_PIXELS = 4096 * 4096

#: Largest image file `UntrustedImages` reads from its allowed folder: well above
#: any PNG of `MAX_PIXELS`, far below what would strain the server's memory.
MAX_FILE_BYTES = 20 * 2**20


class ImageError(DataError):
    """An image that cannot be read: says which and why, in one line."""


@dataclass(frozen=True)
class Image:
    """An RGB image: its PNG encoding, its size and its content name ``sha256``."""

    sha256: str
    png: bytes = field(repr=False)
    width: int
    height: int

    def pil(self) -> Any:
        """The image as a ``PIL.Image.Image`` (RGB), decoded from its PNG."""
        from PIL import Image as PILImage

        with PILImage.open(io.BytesIO(self.png)) as im:
            return im.convert("RGB")

    def data_url(self) -> str:
        """``data:image/png;base64,...`` (what an OpenAI-style API takes)."""
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


def image_from_pil(picture: Any) -> Image:
    """The `Image` of a PIL image (converted to RGB)."""
    rgb = picture.convert("RGB") if picture.mode != "RGB" else picture
    width, height = rgb.size
    if width * height > MAX_PIXELS:
        raise ImageError(f"image is {width}x{height}, more than {MAX_PIXELS} pixels")
    digest = hashlib.sha256(f"{width}x{height}:".encode())
    digest.update(rgb.tobytes())
    buf = io.BytesIO()
    rgb.save(buf, format="PNG")
    return Image(digest.hexdigest(), buf.getvalue(), width, height)


def _decode(data: bytes, what: str) -> Image:
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    PILImage.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with PILImage.open(io.BytesIO(data)) as im:
            im.load()
            return image_from_pil(im)
    except (UnidentifiedImageError, OSError, ValueError, PILImage.DecompressionBombError) as exc:
        raise ImageError(f"{what} is not a readable image ({type(exc).__name__}: {exc})") from None


def _from_data_url(url: str) -> Image:
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageError(f"image URL must be data:image/<format>;base64,..., got {url[:40]!r}")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image data URL holds invalid base64") from None
    return _decode(data, "image data URL")


def _from_string(value: str) -> Image:
    if value.startswith("data:"):
        return _from_data_url(value)
    if value.startswith(("http://", "https://")):
        raise ImageError(
            f"remote image URL {value[:60]!r} refused: runs are hermetic; "
            "give a path, bytes or a data: URL"
        )
    return _from_path(Path(value))


def _from_path(path: Path) -> Image:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(f"image file {str(path)!r}: {exc.strerror or exc}") from None
    return _decode(data, f"image file {str(path)!r}")


def load_image(value: Any) -> Image:
    """The `Image` of ``value`` in any accepted form (see the module doc)."""
    if isinstance(value, Image):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return _decode(bytes(value), "image bytes")
    if isinstance(value, str):
        return _from_string(value)
    if isinstance(value, Path):
        return _from_path(value)
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return _decode(bytes(value["bytes"]), "image bytes")
        if value.get("path"):
            return _from_path(Path(value["path"]))
        raise ImageError("image dict needs 'bytes' or 'path' (the HF datasets Image form)")
    if hasattr(value, "convert") and hasattr(value, "size") and hasattr(value, "mode"):
        return image_from_pil(value)
    raise ImageError(f"cannot read an image from a {type(value).__name__}")


# The same words whether a path exists or not, is a FIFO, a device or a symlink out:
# a refusal must not let a client map the server's file system.
_NO_FILES = "image must be a data:image/<format>;base64 URL (this server reads no image files)"
_NOT_ALLOWED = "image path names no readable image file in the server's allowed image folder"


@dataclass(frozen=True)
class UntrustedImages:
    """How input from outside (a server's requests) may name an image.

    A ``data:`` URL always; a path or ``file:`` URL only with ``allowed_dir``,
    and then only a regular file of at most ``max_bytes`` that resolves inside
    that folder (no symlink out, no FIFO or device, which would block or never
    end). Reads block: call `load` off an event loop.
    """

    allowed_dir: Path | None = None
    max_bytes: int = MAX_FILE_BYTES

    def __post_init__(self) -> None:
        if self.allowed_dir is not None:  # resolved once: containment compares real paths
            object.__setattr__(self, "allowed_dir", Path(self.allowed_dir).resolve())

    def load(self, value: Any) -> Image:
        """The `Image` a request names by ``value`` (a string); `ImageError` otherwise."""
        if not isinstance(value, str):
            raise ImageError(f"image must be a data: URL string, not {type(value).__name__}")
        if value.startswith("data:"):
            return _from_data_url(value)
        if value.startswith(("http://", "https://")):
            raise ImageError(
                f"remote image URL {value[:60]!r} refused: the server fetches nothing "
                "(runs are hermetic); send a data: URL"
            )
        if self.allowed_dir is None:
            raise ImageError(_NO_FILES)
        return _decode(self._read(value), "image file")

    def _read(self, value: str) -> bytes:
        assert self.allowed_dir is not None
        try:
            real = os.path.realpath(self.allowed_dir / _local_path(value))
            if not Path(real).is_relative_to(self.allowed_dir):
                raise ImageError(_NOT_ALLOWED)
            # O_NONBLOCK: opening a FIFO must not wait for a writer (fstat refuses it next).
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, ValueError):  # missing, unreadable, NUL byte, name too long
            raise ImageError(_NOT_ALLOWED) from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ImageError(_NOT_ALLOWED)
            too_big = ImageError(f"image file is larger than {self.max_bytes} bytes")
            if info.st_size > self.max_bytes:
                raise too_big
            data = f.read(self.max_bytes + 1)  # +1: a file that grew since fstat
        if len(data) > self.max_bytes:
            raise too_big
        return data


def _local_path(value: str) -> str:
    """The path a string or ``file:`` URL names (relative ones are under the folder)."""
    if not value.startswith("file:"):
        return value
    url = urlsplit(value)
    if url.netloc not in ("", "localhost"):
        raise ImageError(_NOT_ALLOWED)
    return unquote(url.path)


def _part(part: Any, untrusted: UntrustedImages | None = None) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise ImageError(f"content part must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise ImageError("text content part needs a string 'text'")
        return {"type": "text", "text": part["text"]}
    if kind == "image":
        if "image" not in part:
            raise ImageError("image content part needs an 'image'")
        load = untrusted.load if untrusted else load_image
        return {"type": "image", "image": load(part["image"])}
    if kind == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise ImageError("image_url content part needs image_url.url")
        return {"type": "image", "image": untrusted.load(url) if untrusted else _from_string(url)}
    raise ImageError(f"unknown content part type {kind!r} (expected text, image or image_url)")


def content_parts(content: Any, untrusted: UntrustedImages | None = None) -> list[dict[str, Any]]:
    """``content`` as canonical parts: text parts and image parts holding an `Image`.

    With ``untrusted`` (content from outside), images load under its rules
    instead of `load_image`'s.
    """
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [_part(p, untrusted) for p in content]
    raise ImageError(f"message content must be a string or a list of parts, not {content!r:.60}")


def has_images(messages: list[dict[str, Any]]) -> bool:
    """Whether any message's content holds an image part (in any form)."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in ("image", "image_url") for p in content
        ):
            return True
    return False


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with image-bearing content as canonical parts; text-only ones unchanged."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            m = {**m, "content": content_parts(content)}
        out.append(m)
    return out


def message_images(messages: list[dict[str, Any]]) -> list[Image]:
    """The images of normalised ``messages``, in order of appearance."""
    return [
        p["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image"
    ]


def loggable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalised messages with each image part as ``{"type": "image", "sha256": ...}``:
    what trajectories and logs keep (the pixels are in the run's image store)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = [
                {"type": "image", "sha256": p["image"].sha256}
                if p.get("type") == "image" and isinstance(p.get("image"), Image)
                else p
                for p in content
            ]
            m = {**m, "content": parts}
        out.append(m)
    return out
