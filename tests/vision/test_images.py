"""Images as data: every accepted form gives the same content-named `Image`; bad ones
get one-line errors; the run's store keeps each image once."""

from __future__ import annotations

import base64
import io

import pytest

from temper.vision import ImageError, ImageStore, content_parts, has_images, load_image
from tiny_llava import picture


def _png(im) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def test_every_form_names_the_same_pixels_the_same(tmp_path):
    im = picture(1)
    png = _png(im)
    jpeg_path = tmp_path / "p.png"
    jpeg_path.write_bytes(png)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    forms = [im, im.convert("RGBA"), png, url, str(jpeg_path), jpeg_path, {"bytes": png}]
    forms.append({"path": str(jpeg_path), "bytes": None})
    names = {load_image(f).sha256 for f in forms}
    assert len(names) == 1
    first = load_image(im)
    assert load_image(first) is first
    assert (first.width, first.height) == (40, 30)
    assert first.pil().tobytes() == im.tobytes()
    assert load_image(first.data_url()).sha256 == first.sha256
    assert load_image(picture(2)).sha256 != first.sha256


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("https://example.com/cat.png", "runs are hermetic"),
        ("data:image/png;base64,@@@", "invalid base64"),
        ("data:text/plain;base64,aGk=", "data:image/"),
        (b"not an image", "not a readable image"),
        ("/no/such/file.png", "/no/such/file.png"),
        ({"neither": 1}, "'bytes' or 'path'"),
        (3.5, "float"),
    ],
)
def test_unreadable_images_get_one_line_errors(value, words):
    with pytest.raises(ImageError) as info:
        load_image(value)
    message = str(info.value)
    assert words in message and "\n" not in message


def test_content_parts_normalise_openai_and_plain_forms():
    png = _png(picture(3))
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = content_parts(
        [
            {"type": "text", "text": "How many?"},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "image", "image": png},
        ]
    )
    assert [p["type"] for p in parts] == ["text", "image", "image"]
    assert parts[1]["image"].sha256 == parts[2]["image"].sha256
    assert content_parts("hi") == [{"type": "text", "text": "hi"}]
    assert has_images([{"role": "user", "content": parts}])
    assert not has_images([{"role": "user", "content": "plain"}])
    with pytest.raises(ImageError, match="unknown content part type 'audio'"):
        content_parts([{"type": "audio", "audio": b""}])
    with pytest.raises(ImageError, match="needs an 'image'"):
        content_parts([{"type": "image"}])


def test_store_keeps_each_image_once_and_reads_it_back(tmp_path):
    store = ImageStore(tmp_path / "images")
    a, b = load_image(picture(4)), load_image(picture(5))
    assert store.put(a) is True
    assert store.put(a) is False  # already there: not rewritten
    assert store.put(b) is True
    assert len(store) == 2 and a.sha256 in store
    assert not list((tmp_path / "images").glob("*/.tmp-*"))
    fresh = ImageStore(tmp_path / "images")  # another process reading the run's store
    assert fresh.get(a.sha256).png == a.png
    with pytest.raises(ImageError, match="not in the image store"):
        fresh.get("0" * 64)


def test_dataset_image_columns_become_content_parts(tmp_path):
    from temper.data.datasets import load_tasks
    from temper.errors import DataError

    png_a, png_b = _png(picture(10)), _png(picture(11))
    rows = [
        {"prompt": "Compare <image> with <image>: same?", "answer": "no", "images": [png_a, png_b]},
        {"prompt": "How many?", "answer": "2", "images": png_a},  # one image, no marker
        {"prompt": "Plain text", "answer": "1"},  # no image column: text-only
    ]
    first, second, third = load_tasks(rows)
    parts = first.prompt[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image", "text"]
    assert [p["text"] for p in parts if p["type"] == "text"] == ["Compare ", " with ", ": same?"]
    assert parts[1]["image"] is png_a and parts[3]["image"] is png_b
    assert [p["type"] for p in second.prompt[0]["content"]] == ["image", "text"]
    assert third.prompt == "Plain text" and "images" not in first.columns
    with pytest.raises(DataError, match=r"dataset row 0: the prompt has 2 <image> markers but"):
        load_tasks([{"prompt": "<image> and <image>", "answer": "x", "images": [png_a]}])
