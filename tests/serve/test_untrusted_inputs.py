"""`temper serve` does not read the host for its clients, and types request fields strictly.

Real servers of the built-in tiny VLM on 127.0.0.1: an image part naming a
path or ``file:`` URL is a 400 that says nothing about whether the path exists
(a FIFO or /dev/zero included, and /health stays up meanwhile), unless the
server has an allowed image folder; then only regular files inside it are
read. ``n: "2"`` and its kind are 400s naming the field.
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
import threading
import time

import httpx
import pytest
from PIL import Image as PILImage

from temper.cli.main import main as cli_main
from temper.engine.hf import HFEngine
from temper.models import load_model, load_tokenizer, resolve_model_path
from temper.serve import start_server
from temper.vision.images import ImageError, UntrustedImages, load_image
from temper.vision.processor import VisionProcessor

QUESTION = {"type": "text", "text": "What is this?"}


def _png(path, color: str = "red"):
    PILImage.new("RGB", (16, 16), color).save(path)
    return path


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A folder standing for the host's disk: a PNG, a FIFO, and an allowed folder
    holding a PNG, a FIFO and a symlink out to the host PNG."""
    root = tmp_path_factory.mktemp("host")
    _png(root / "host.png")
    os.mkfifo(root / "pipe.png")
    allowed = root / "allowed"
    allowed.mkdir()
    _png(allowed / "pic.png", "blue")
    os.mkfifo(allowed / "pipe.png")
    os.symlink(root / "host.png", allowed / "out.png")
    with contextlib.suppress(PermissionError):  # /dev/zero's own node (needs root)
        os.mknod(allowed / "zero.png", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    return root


@pytest.fixture(scope="module")
def vlm():
    path = str(resolve_model_path("tiny_vlm"))
    tokenizer = load_tokenizer(path)
    vision = VisionProcessor.from_pretrained(path)
    return HFEngine(load_model(path), tokenizer, vision=vision), tokenizer, vision


@pytest.fixture(scope="module")
def plain(vlm):
    """No allowed folder: data URLs only."""
    engine, tokenizer, vision = vlm
    with start_server(engine, tokenizer, model_name="vlm", vision=vision) as handle:
        yield handle


@pytest.fixture(scope="module")
def folder(vlm, host):
    """Image paths allowed inside host/allowed."""
    engine, tokenizer, vision = vlm
    handle = start_server(
        engine, tokenizer, model_name="vlm", vision=vision, image_dir=host / "allowed"
    )
    with handle:
        yield handle


def _chat(url: str, image: str, timeout: float = 60, **extra) -> httpx.Response:
    part = {"type": "image_url", "image_url": {"url": image}}
    body = {"model": "vlm", "messages": [{"role": "user", "content": [part, QUESTION]}]}
    return httpx.post(f"{url}/v1/chat/completions", json={**body, **extra}, timeout=timeout)


def _refusal(reply: httpx.Response) -> str:
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "\n" not in message
    return message


def _host_paths(host) -> list[str]:
    """Names of existing and missing host files, as paths and file: URLs."""
    return [
        str(host / "host.png"),
        str(host / "missing.png"),
        f"file://{host / 'host.png'}",
        f"file://{host / 'missing.png'}",
        "file:///etc/passwd",
        "/etc/passwd",
        "/etc/no-such-file",
        "/dev/zero",
        "../host.png",
    ]


@pytest.mark.parametrize("server", ["plain", "folder"])
def test_host_paths_are_refused_alike_whether_they_exist_or_not(server, host, request):
    handle = request.getfixturevalue(server)
    messages = {_refusal(_chat(handle.url, path)) for path in _host_paths(host)}
    assert len(messages) == 1, messages  # one message: nothing to tell paths apart by
    (message,) = messages
    assert str(host) not in message and "passwd" not in message and "exist" not in message


def _unreadable(kind: str, server: str, host) -> str:
    """An image name that would hang or flood a server that read it."""
    inside = host / ("allowed" if server == "folder" else "")
    if kind == "zero" and server == "folder" and not (inside / "zero.png").exists():
        pytest.skip("mknod needs root")
    return {
        "fifo": str(inside / "pipe.png"),
        "fifo_url": f"file://{inside / 'pipe.png'}",
        "dev_zero": "/dev/zero",
        "zero": str(inside / "zero.png") if server == "folder" else "file:///dev/zero",
        "path": str(host / "host.png"),
    }[kind]


@pytest.mark.parametrize("kind", ["fifo", "fifo_url", "dev_zero", "zero", "path"])
@pytest.mark.parametrize("server", ["plain", "folder"])
def test_what_would_hang_or_flood_is_refused_while_health_answers(server, kind, host, request):
    """A FIFO (as a path and a file: URL), /dev/zero (and, for the folder server, a
    character device inside its folder) and a host path: each a 400, while /health
    answers. The deadline is generous: the failures it guards against are a server
    that never answers, or one that reads gigabytes."""
    handle = request.getfixturevalue(server)
    image = _unreadable(kind, server, host)
    replies: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: replies.append(_chat(handle.url, image, timeout=20)))
    t0 = time.monotonic()
    sender.start()
    health = httpx.get(f"{handle.url}/health", timeout=5)
    sender.join(20)
    assert health.status_code == 200
    assert replies and time.monotonic() - t0 < 10
    _refusal(replies[0])


def test_the_allowed_folder_serves_its_regular_files(folder, host):
    pic = host / "allowed" / "pic.png"
    for name in ("pic.png", str(pic), f"file://{pic}", f"file://localhost{pic}"):
        reply = _chat(folder.url, name, max_tokens=1, temperature=0)
        assert reply.status_code == 200, (name, reply.text)


def test_a_symlink_out_of_the_allowed_folder_is_refused_like_a_missing_file(folder, host):
    out = _refusal(_chat(folder.url, "out.png"))
    assert out == _refusal(_chat(folder.url, "missing.png"))
    assert "host.png" not in out


def test_image_parts_naming_a_path_are_refused_too(plain):
    # The data-URL rule holds for `"type": "image"` parts as well as image_url ones.
    part = {"type": "image", "image": "/etc/passwd"}
    body = {"model": "vlm", "messages": [{"role": "user", "content": [part, QUESTION]}]}
    reply = httpx.post(f"{plain.url}/v1/chat/completions", json=body, timeout=60)
    assert "passwd" not in _refusal(reply)


def test_an_oversized_file_is_refused_and_trusted_loading_still_reads_paths(tmp_path):
    pic = _png(tmp_path / "pic.png")
    with pytest.raises(ImageError, match="larger than 10 bytes"):
        UntrustedImages(tmp_path, max_bytes=10).load("pic.png")
    assert load_image(str(pic)).width == 16  # datasets name their images by path


def test_a_data_url_is_still_served(plain, host):
    data = base64.b64encode((host / "host.png").read_bytes()).decode()
    reply = _chat(plain.url, f"data:image/png;base64,{data}", max_tokens=1, temperature=0)
    assert reply.status_code == 200, reply.text


def test_a_missing_allowed_image_dir_is_a_one_line_error(tmp_path, capsys):
    assert cli_main(["serve", "--allowed-image-dir", str(tmp_path / "nope"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--allowed-image-dir" in err and "\n" not in err


# ------------------------------------------------------------------ strict field types
@pytest.mark.parametrize(
    ("endpoint", "field", "value"),
    [
        ("chat/completions", "n", "2"),
        ("chat/completions", "n", 2.0),
        ("chat/completions", "stream", "yes"),
        ("chat/completions", "stream", 1),
        ("chat/completions", "logprobs", "yes"),
        ("chat/completions", "max_tokens", "4"),
        ("chat/completions", "temperature", "0.5"),
        ("completions", "logprobs", "1"),
        ("completions", "echo", "no"),
        ("completions", "n", "2"),
    ],
)
def test_fields_of_the_wrong_type_are_400s_naming_them(plain, endpoint, field, value):
    if endpoint == "chat/completions":
        body = {"model": "vlm", "messages": [{"role": "user", "content": "hi"}]}
    else:
        body = {"model": "vlm", "prompt": "hi"}
    reply = httpx.post(f"{plain.url}/v1/{endpoint}", json={**body, field: value}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and field in error["message"]


def test_well_typed_fields_are_still_served(plain):
    body = {
        "model": "vlm",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "stream": False,
        "logprobs": True,
        "max_tokens": 2,
        "temperature": 0,  # an int where a float is expected is fine
    }
    reply = httpx.post(f"{plain.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"]) == 2
