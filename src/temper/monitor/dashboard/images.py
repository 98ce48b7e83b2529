"""Where a sample's images go in the trajectory browser.

A vision run's trajectory record names its images by hash: ``images`` is a
list of ``[offset, sha256]`` pairs, the offset being where the image's run of
image tokens starts in ``prompt_ids + response_ids``; multi-turn ``messages``
keep image parts as ``{"type": "image", "sha256": ...}`` (`temper.vision.images.loggable`).
The pixels are in ``<run>/images/`` and the server hands them out by hash
(``/api/runs/{name}/images/{sha256}``).

This module turns that into what the page draws:

- turn ``parts``: text and image parts in reading order. Message content lists
  give the order directly. A single-turn prompt is rendered text holding one
  placeholder per image (``<image>`` for LLaVA): the text is split at the
  placeholders, whose text is the image token's, decoded with the run's
  tokenizer. Without a tokenizer, or when the count of placeholders does not
  match, the images come first and the text after (the order LLaVA-style
  prompts use), rather than guessing a position.
- token chips: each image's run of image tokens in the response (observation
  pictures of multi-turn episodes) as one ``{start, length, sha256, url}``
  entry, so the token view draws one picture instead of 16+ identical tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _no_text(_token_id: int) -> str | None:
    return None


@dataclass(frozen=True)
class ImageLinks:
    """How a run's sample views name images: the URL prefix the server serves them
    under, and the text of an image token (from the run's tokenizer; None if unknown)."""

    url_prefix: str = ""
    token_text: Callable[[int], str | None] = field(default=_no_text)

    def part(self, sha256: str) -> dict[str, Any]:
        return {"type": "image", "sha256": sha256, "url": self.url_prefix + sha256}


def image_spans(record: dict[str, Any]) -> list[tuple[int, int, str]]:
    """(start, length, sha256) of each image's token run in ``prompt_ids + response_ids``.

    A run is the image token repeated from its offset, up to the next image's
    offset (two images back to back share one token id). Malformed entries are
    left out: a broken record must not take the page down.
    """
    ids = list(record.get("prompt_ids") or []) + list(record.get("response_ids") or [])
    pairs = [
        (p[0], p[1])
        for p in record.get("images") or []
        if isinstance(p, list | tuple)
        and len(p) == 2
        and isinstance(p[0], int)
        and not isinstance(p[0], bool)
        and isinstance(p[1], str)
        and 0 <= p[0] < len(ids)
    ]
    spans = []
    for k, (start, sha) in enumerate(pairs):
        end = pairs[k + 1][0] if k + 1 < len(pairs) and pairs[k + 1][0] > start else len(ids)
        n = 0
        while start + n < end and ids[start + n] == ids[start]:
            n += 1
        spans.append((start, n, sha))
    return spans


def prompt_parts(record: dict[str, Any], text: str, links: ImageLinks) -> list[dict[str, Any]]:
    """A single-turn prompt as text and image parts (empty when it shows no image)."""
    n_prompt = len(record.get("prompt_ids") or [])
    shown = [(start, sha) for start, _, sha in image_spans(record) if start < n_prompt]
    if not shown:
        return []
    placeholder = links.token_text(record["prompt_ids"][shown[0][0]])
    images = [links.part(sha) for _, sha in shown]
    if not placeholder or text.count(placeholder) != len(images):
        return [*images, *_text_part(text)]
    pieces = text.split(placeholder)
    parts = _text_part(pieces[0])
    for image, piece in zip(images, pieces[1:], strict=True):
        parts += [image, *_text_part(piece)]
    return parts


def message_parts(content: Any, links: ImageLinks) -> list[dict[str, Any]]:
    """A message's content list as text and image parts (empty when it shows no image)."""
    if not isinstance(content, list) or not any(
        isinstance(p, dict) and p.get("type") == "image" for p in content
    ):
        return []
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") == "image" and isinstance(p.get("sha256"), str):
            parts.append(links.part(p["sha256"]))
        elif isinstance(p.get("text"), str):
            parts += _text_part(p["text"])
        else:
            parts += _text_part(f"[{p.get('type', 'part')}]")
    return parts


def response_chips(record: dict[str, Any], links: ImageLinks) -> list[dict[str, Any]]:
    """The images inside the response tokens, as token-view chips (response indices)."""
    n_prompt = len(record.get("prompt_ids") or [])
    return [
        {"start": start - n_prompt, "length": n, **links.part(sha)}
        for start, n, sha in image_spans(record)
        if start >= n_prompt and n > 0
    ]


def _text_part(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []
