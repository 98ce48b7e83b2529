"""Procedural visual-reasoning tasks: small images rendered with PIL, answers checked exactly.

Four single-turn kinds, each a 64x64 RGB picture on a white background and a question
whose answer goes in `\\boxed{...}`:

- `count`: 1 to 5 shapes of one kind (circle, square or triangle) in distinct cells of a
  4x4 grid; "How many circles are in the picture?" -> `3`.
- `number`: a two-digit number (10..99) drawn as seven-segment digits;
  "What number is shown?" -> `47`.
- `redder`: two colour swatches, left and right, whose redness (R minus the mean of G and
  B) differs by at least `MIN_REDNESS_GAP`; "Which square is redder, left or right?" ->
  `left`.
- `same_colour`: two swatches from `PALETTE`, the same colour half of the time;
  "Are the two squares the same colour?" -> `yes` / `no`.

A task is a user message of OpenAI-style content parts:
`[{"type": "image", "image": <PIL.Image>}, {"type": "text", "text": <question>}]`, so
any chat template that renders image parts (the tiny VLM's writes `<image>`) sees it.

Everything is seeded and hermetic: a task is named by its kind and a 48-bit key, and its
picture and answer are a pure function of that name (`render(kind, key)`), so the same
key always gives the same pixels (`png_bytes`) and answer. Every task belongs to one
split by a stable hash of its name (about 20% held out, as in `temper.data.arithmetic`):
`VisualTasks.sample` never yields a held-out task, `VisualTasks.heldout` only held-out ones.
"""

from __future__ import annotations

import hashlib
import io
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, ImageDraw

from temper.records import Task
from temper.rewards.answers import extract_boxed

SIZE = 64
KINDS: tuple[str, ...] = ("count", "number", "redder", "same_colour")
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
MAX_COUNT = 5
MIN_REDNESS_GAP = 60
#: Named colours for shapes and the same-colour task (all far from white and each other).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 70, 220),
    "orange": (240, 140, 20), "purple": (140, 40, 170), "black": (20, 20, 20),
    "brown": (130, 80, 30), "teal": (20, 150, 150),
}  # fmt: skip
HELDOUT_PERCENT = 20
_SPLIT_SALT = "temper-visual-v1:"
#: Seven-segment digits: which of the segments a, b, c, d, e, f, g are lit.
_SEGMENTS = {
    0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg",
    5: "acdfg", 6: "acdefg", 7: "abc", 8: "abcdefg", 9: "abcdfg",
}  # fmt: skip


@dataclass
class Scene:
    """One rendered task: the picture, the question, the answer and what was drawn."""

    kind: str
    key: int
    image: Image.Image
    question: str
    answer: str
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """`<kind>-<key>`: names the task and decides its split."""
        return f"{self.kind}-{self.key}"


def png_bytes(image: Image.Image) -> bytes:
    """The image as PNG bytes (deterministic for the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def is_heldout(kind: str, key: int) -> bool:
    """True if task `<kind>-<key>` is in the held-out split (stable across machines)."""
    digest = hashlib.sha256(f"{_SPLIT_SALT}{kind}-{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


# -- drawing -------------------------------------------------------------------------


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill: Any):
    """A filled circle, square or triangle inside `box` (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def draw_digit(draw: ImageDraw.ImageDraw, digit: int, x: int, y: int, w: int, h: int) -> None:
    """A seven-segment digit with its top-left corner at (x, y), `w` wide and `h` high."""
    t, mid = max(3, w // 5), y + h // 2
    bars = {
        "a": (x, y, x + w, y + t), "g": (x, mid - t // 2, x + w, mid - t // 2 + t),
        "d": (x, y + h - t, x + w, y + h), "f": (x, y, x + t, mid), "b": (x + w - t, y, x + w, mid),
        "e": (x, mid, x + t, y + h), "c": (x + w - t, mid, x + w, y + h),
    }  # fmt: skip
    for segment in _SEGMENTS[digit]:
        draw.rectangle(bars[segment], fill=(0, 0, 0))


def redness(colour: tuple[int, int, int]) -> float:
    """R minus the mean of G and B: how red a colour looks, for the `redder` task."""
    r, g, b = colour
    return r - (g + b) / 2


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    return image, ImageDraw.Draw(image)


def _count(rng: random.Random) -> tuple[Image.Image, str, str, dict[str, Any]]:
    image, draw = _canvas()
    shape, n = rng.choice(SHAPES), rng.randint(1, MAX_COUNT)
    cells = rng.sample(range(16), n)
    for cell in cells:
        cx, cy = (cell % 4) * 16, (cell // 4) * 16
        side = rng.randint(9, 13)
        x0, y0 = cx + rng.randint(1, 15 - side), cy + rng.randint(1, 15 - side)
        draw_shape(draw, shape, (x0, y0, x0 + side, y0 + side), PALETTE[rng.choice(list(PALETTE))])
    question = f"How many {shape}s are in the picture?"
    return image, question, str(n), {"shape": shape, "count": n, "cells": sorted(cells)}


def _number(rng: random.Random) -> tuple[Image.Image, str, str, dict[str, Any]]:
    image, draw = _canvas()
    n = rng.randint(10, 99)
    w, h = 20, 36
    x, y = rng.randint(2, SIZE - 2 * w - 8 - 2), rng.randint(2, SIZE - h - 2)
    draw_digit(draw, n // 10, x, y, w, h)
    draw_digit(draw, n % 10, x + w + 8, y, w, h)
    return image, "What number is shown?", str(n), {"number": n, "x": x, "y": y}


def _swatches(draw: ImageDraw.ImageDraw, left: Any, right: Any) -> None:
    """Two squares filling the left and right halves (whole 16x16 patches of the tiny VLM)."""
    draw.rectangle((0, 16, 31, 47), fill=left)
    draw.rectangle((32, 16, 63, 47), fill=right)


def _redder(rng: random.Random) -> tuple[Image.Image, str, str, dict[str, Any]]:
    image, draw = _canvas()
    while True:
        left = (rng.randint(0, 255), rng.randint(0, 230), rng.randint(0, 230))
        right = (rng.randint(0, 255), rng.randint(0, 230), rng.randint(0, 230))
        if abs(redness(left) - redness(right)) >= MIN_REDNESS_GAP:
            break
    _swatches(draw, left, right)
    answer = "left" if redness(left) > redness(right) else "right"
    question = "Which square is redder, left or right?"
    return image, question, answer, {"left": list(left), "right": list(right)}


def _same_colour(rng: random.Random) -> tuple[Image.Image, str, str, dict[str, Any]]:
    image, draw = _canvas()
    names = list(PALETTE)
    left = rng.choice(names)
    right = left if rng.random() < 0.5 else rng.choice([n for n in names if n != left])
    _swatches(draw, PALETTE[left], PALETTE[right])
    answer = "yes" if left == right else "no"
    question = "Are the two squares the same colour? Answer yes or no."
    return image, question, answer, {"left": left, "right": right}


_RENDERERS = {"count": _count, "number": _number, "redder": _redder, "same_colour": _same_colour}


def render(kind: str, key: int) -> Scene:
    """The scene named `<kind>-<key>`: a pure function of its two arguments."""
    if kind not in _RENDERERS:
        raise ValueError(f"unknown visual task kind {kind!r}; expected one of {KINDS}")
    image, question, answer, facts = _RENDERERS[kind](random.Random(f"{kind}:{key}"))
    return Scene(kind, key, image, question, answer, facts)


# -- tasks ---------------------------------------------------------------------------

ANSWER_HINT = "Answer with \\boxed{...}."


def user_content(image: Any, text: str) -> list[dict[str, Any]]:
    """OpenAI-style content parts: the image first, then the text."""
    return [{"type": "image", "image": image}, {"type": "text", "text": text}]


def to_task(scene: Scene) -> Task:
    """The Task for a scene: one user message (image + question), the exact answer."""
    content = user_content(scene.image, f"{scene.question} {ANSWER_HINT}")
    return Task(
        id=f"visual-{scene.name}",
        prompt=[{"role": "user", "content": content}],
        answer=scene.answer,
        category=scene.kind,
        columns={"kind": scene.kind, "key": scene.key},
    )


def is_correct(task: Task, completion: str) -> bool:
    """True if the completion's last `\\boxed{...}` equals the task's answer (case-blind)."""
    got = extract_boxed(completion)
    return got is not None and task.answer is not None and got.strip().lower() == task.answer


class VisualTasks:
    """Training tasks drawn from a seeded stream and a fixed held-out list, over `kinds`.

    `sample(rng, k)` draws k training-split tasks (kind uniform over `kinds`);
    `heldout(n, seed)` gives the same n distinct held-out tasks every time, kinds
    interleaved round-robin.
    """

    def __init__(self, kinds: Sequence[str] = KINDS, seed: int = 0) -> None:
        kinds = tuple(kinds)
        if not kinds or any(k not in KINDS for k in kinds):
            raise ValueError(f"visual kinds must be a non-empty subset of {KINDS}, got {kinds}")
        self.kinds, self.seed = kinds, seed
        self._rng = random.Random(seed)

    def sample_scene(self, rng: random.Random | None = None) -> Scene:
        """One training-split scene."""
        rng = rng if rng is not None else self._rng
        kind = rng.choice(self.kinds)
        while True:
            key = rng.getrandbits(48)
            if not is_heldout(kind, key):
                return render(kind, key)

    def sample(self, rng: random.Random | None = None, k: int = 1) -> list[Task]:
        """k training-split tasks drawn from `rng` (the instance's own stream if None)."""
        return [to_task(self.sample_scene(rng)) for _ in range(k)]

    @property
    def categories(self) -> tuple[str, ...]:
        """The task categories: the kinds (for task samplers)."""
        return self.kinds

    def sample_in(self, rng: random.Random, category: str) -> Task:
        """One training-split task of kind `category`."""
        if category not in self.kinds:
            raise ValueError(f"unknown visual kind {category!r}; have {self.kinds}")
        while True:
            key = rng.getrandbits(48)
            if not is_heldout(category, key):
                return to_task(render(category, key))

    def heldout_scenes(self, n: int = 200, seed: int = 1234) -> list[Scene]:
        """n held-out scenes, kinds round-robin (keys are 48-bit, so they are distinct)."""
        rng, out = random.Random(seed), []
        while len(out) < n:
            kind = self.kinds[len(out) % len(self.kinds)]
            key = rng.getrandbits(48)
            if is_heldout(kind, key):
                out.append(render(kind, key))
        return out

    def heldout(self, n: int = 200, seed: int = 1234) -> list[Task]:
        """The fixed held-out task list (same n and seed give the same list)."""
        return [to_task(s) for s in self.heldout_scenes(n, seed)]
