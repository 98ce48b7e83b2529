"""Procedural visual tasks: seeded pictures, answers that the pixels confirm, the split."""

from __future__ import annotations

import random
from collections import deque

import pytest
from PIL import Image

from temper.builder.rewards import build_reward
from temper.builder.tasks import build_tasks
from temper.config.schema import DataConfig
from temper.data.visual import (
    KINDS,
    MIN_REDNESS_GAP,
    PALETTE,
    SIZE,
    VisualTasks,
    is_correct,
    is_heldout,
    png_bytes,
    redness,
    render,
)


def components(image: Image.Image) -> int:
    """Connected regions (4-neighbour) of non-white pixels."""
    pixels, seen, count = image.load(), set(), 0
    for y in range(SIZE):
        for x in range(SIZE):
            if (x, y) in seen or pixels[x, y] == (255, 255, 255):
                continue
            count += 1
            todo = deque([(x, y)])
            seen.add((x, y))
            while todo:
                cx, cy = todo.popleft()
                for nx, ny in ((cx + 1, cy), (cx - 1, cy), (cx, cy + 1), (cx, cy - 1)):
                    inside = 0 <= nx < SIZE and 0 <= ny < SIZE
                    if inside and (nx, ny) not in seen and pixels[nx, ny] != (255, 255, 255):
                        seen.add((nx, ny))
                        todo.append((nx, ny))
    return count


def test_same_key_same_pixels_and_answer_and_a_seeded_stream_replays():
    for kind in KINDS:
        a, b = render(kind, 12345), render(kind, 12345)
        assert png_bytes(a.image) == png_bytes(b.image) and a.answer == b.answer
        assert a.image.size == (SIZE, SIZE) and a.image.mode == "RGB"
    first = VisualTasks(seed=3).sample(random.Random(7), 12)
    again = VisualTasks(seed=3).sample(random.Random(7), 12)
    assert [t.id for t in first] == [t.id for t in again]
    image = [png_bytes(t.prompt[0]["content"][0]["image"]) for t in first]
    assert image == [png_bytes(t.prompt[0]["content"][0]["image"]) for t in again]
    assert len({t.id for t in first}) == 12 and len(set(image)) == 12


def test_a_task_is_one_user_message_of_image_and_text_parts():
    task = VisualTasks(kinds=["count"]).sample(random.Random(0), 1)[0]
    (message,) = task.messages()
    assert message["role"] == "user"
    image, text = message["content"]
    assert image["type"] == "image" and isinstance(image["image"], Image.Image)
    assert text["type"] == "text" and text["text"].startswith("How many ")
    assert "\\boxed{...}" in text["text"]
    assert task.category == "count" and task.answer in {"1", "2", "3", "4", "5"}


def test_count_answers_match_the_shapes_in_the_picture():
    for key in range(60):
        scene = render("count", key)
        assert components(scene.image) == int(scene.answer) == scene.facts["count"]
        assert scene.facts["shape"] in scene.question


def test_number_answers_match_the_lit_segments():
    lit = {0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg",
           5: "acdfg", 6: "acdefg", 7: "abc", 8: "abcdefg", 9: "abcdfg"}  # fmt: skip
    for key in range(40):
        scene = render("number", key)
        x0, y0 = scene.facts["x"], scene.facts["y"]
        pixels = scene.image.load()
        read = ""
        for x in (x0, x0 + 28):  # two digits 20 px wide, 8 px apart, 36 px high
            centres = {"a": (x + 10, y0 + 1), "d": (x + 10, y0 + 34), "g": (x + 10, y0 + 18),
                       "f": (x + 1, y0 + 9), "b": (x + 18, y0 + 9),
                       "e": (x + 1, y0 + 27), "c": (x + 18, y0 + 27)}  # fmt: skip
            on = "".join(s for s in "abcdefg" if pixels[centres[s]] == (0, 0, 0))
            read += str(next(d for d, segs in lit.items() if segs == on))
        assert read == scene.answer == str(scene.facts["number"])


def test_colour_answers_match_the_swatch_pixels():
    for key in range(40):
        scene = render("redder", key)
        left, right = scene.image.getpixel((16, 32)), scene.image.getpixel((48, 32))
        assert abs(redness(left) - redness(right)) >= MIN_REDNESS_GAP
        assert scene.answer == ("left" if redness(left) > redness(right) else "right")
        scene = render("same_colour", key)
        left, right = scene.image.getpixel((16, 32)), scene.image.getpixel((48, 32))
        assert left in PALETTE.values() and right in PALETTE.values()
        assert scene.answer == ("yes" if left == right else "no")


def test_training_draws_are_never_held_out_and_the_held_out_list_is_fixed():
    gen = VisualTasks()
    for task in gen.sample(random.Random(1), 200):
        assert not is_heldout(task.columns["kind"], task.columns["key"])
    held = gen.heldout(40)
    assert all(is_heldout(t.columns["kind"], t.columns["key"]) for t in held)
    assert [t.id for t in held] == [t.id for t in VisualTasks().heldout(40)]
    assert [t.category for t in held[:4]] == list(KINDS)


def test_is_correct_reads_the_last_boxed_answer():
    task = render("redder", 5)
    from temper.data.visual import to_task

    t = to_task(task)
    assert is_correct(t, f"\\boxed{{{t.answer}}}")
    assert is_correct(t, f"I think \\boxed{{{t.answer.upper()}}}")
    assert not is_correct(t, t.answer)  # no box
    assert not is_correct(t, "\\boxed{up}")


def test_data_type_visual_builds_a_sampler_and_held_out_tasks():
    cfg = DataConfig(type="visual", kinds=["count", "same_colour"], eval_size=6)
    sampler, held = build_tasks(cfg, seed=0)
    assert {t.category for t in sampler.sample(20)} == {"count", "same_colour"}
    assert len(held) == 6 and {t.category for t in held} == {"count", "same_colour"}
    with pytest.raises(ValueError, match="kinds"):
        DataConfig(type="visual", kinds=["clock"])


def test_the_exact_reward_component_scores_visual_answers():
    import asyncio

    from temper.config.schema import RewardConfig
    from temper.rewards.base import RewardInput

    reward = build_reward(RewardConfig(components=[{"type": "exact"}]))
    tasks = VisualTasks().heldout(4)
    inputs = [RewardInput(t, "", f"\\boxed{{{t.answer}}}") for t in tasks]
    inputs += [RewardInput(t, "", "\\boxed{maybe}") for t in tasks]
    scores = [r.score for r in asyncio.run(reward.score(inputs))]
    assert scores == [1.0] * 4 + [0.0] * 4
