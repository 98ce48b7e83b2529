"""`collapse_image_runs`: what the vLLM engine sends for a prompt whose image runs
are already expanded (vLLM expands one placeholder per image itself)."""

import pytest

from temper.vision.images import ImageError
from temper.vision.processor import collapse_image_runs

IMG = 9  # the image token


def test_each_run_becomes_one_placeholder():
    assert collapse_image_runs([1, IMG, IMG, IMG, 2, IMG, IMG, IMG, 3], IMG, 2) == [
        1,
        IMG,
        2,
        IMG,
        3,
    ]
    assert collapse_image_runs([1, 2], IMG, 0) == [1, 2]


def test_back_to_back_images_split_evenly():
    assert collapse_image_runs([1, IMG, IMG, IMG, IMG, 2], IMG, 2) == [1, IMG, IMG, 2]
    assert collapse_image_runs([IMG] * 6 + [5, IMG, IMG, IMG], IMG, 3) == [IMG, IMG, 5, IMG]


def test_runs_that_cannot_be_told_apart_are_refused():
    with pytest.raises(ImageError, match="cannot tell 2 image"):
        collapse_image_runs([1, IMG, IMG, IMG, 2], IMG, 2)
    with pytest.raises(ImageError, match="names no image token"):
        collapse_image_runs([1], None, 1)
