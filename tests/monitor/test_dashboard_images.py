"""Images in the dashboard: the image endpoint, and where the sample views put them.

The runs come from real rollouts of the built-in tiny VLM (`vision_runs`): "vision"
holds single-turn picture questions (one prompt shows two pictures back to back),
"grid" multi-turn `visual_grid` episodes whose observations are pictures.
"""

from __future__ import annotations

import io
import json

import httpx
import pytest
from PIL import Image as PILImage
from raw_http import raw_get

from temper.monitor.dashboard import DashboardServer
from temper.monitor.dashboard.samples import sample_view
from temper.monitor.sinks import read_jsonl

IMAGE_TOKEN = "<image>"  # the tiny VLM's placeholder (its chat template writes one per image)


@pytest.fixture(scope="module")
def server(vision_runs):
    with DashboardServer(vision_runs) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _records(vision_runs, run):
    return read_jsonl(vision_runs / run / "trajectories" / "step_000001.jsonl")


def _stored(vision_runs, run):
    return sorted((vision_runs / run / "images").glob("*/*.png"))


def test_image_endpoint_serves_the_stored_png(client, vision_runs):
    for run in ("vision", "grid"):
        files = _stored(vision_runs, run)
        shown = {sha for r in _records(vision_runs, run) for _, sha in r["images"]}
        assert {f.stem for f in files} == shown and len(shown) >= 2
        for f in files:
            r = client.get(f"/api/runs/{run}/images/{f.stem}")
            assert r.status_code == 200 and r.headers["content-type"] == "image/png"
            assert r.content == f.read_bytes()
            assert "immutable" in r.headers["cache-control"]
            assert PILImage.open(io.BytesIO(r.content)).size == (64, 64)


@pytest.mark.parametrize(
    ("sha", "says"),
    [
        ("abc", "got 3 characters"),
        ("e" * 65, "got 65 characters"),
        ("E" * 64, "'E' is not one"),
        ("g" * 64, "'g' is not one"),
        ("%20" + "e" * 63, "' ' is not one"),
    ],
)
def test_malformed_image_hashes_are_one_line_400s(client, sha, says):
    r = client.get(f"/api/runs/vision/images/{sha}")
    assert r.status_code == 400, r.text
    assert "\n" not in r.text
    detail = r.json()["detail"]
    assert "image hash" in detail and "64 lowercase hex digits" in detail and says in detail


def test_unknown_images_and_runs_are_404s(client, vision_runs):
    other_run = _stored(vision_runs, "grid")[0].stem
    if other_run in {f.stem for f in _stored(vision_runs, "vision")}:
        pytest.skip("the two runs share this picture")
    r = client.get(f"/api/runs/vision/images/{other_run}")  # grid's picture, not vision's
    assert r.status_code == 404 and f"run 'vision' has no image {other_run}" in r.json()["detail"]
    r = client.get(f"/api/runs/nope/images/{other_run}")
    assert r.status_code == 404 and "no run named 'nope'" in r.json()["detail"]


def _raw_get(server, path: str) -> tuple[int, str]:
    return raw_get(server.port, path)


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/vision/images/..%2Fconfig.toml",
        "/api/runs/vision/images/..%2F..%2Fgrid%2Fconfig.toml",
        "/api/runs/vision/images/../config.toml",
        "/api/runs/vision/images/%2e%2e",
        "/api/runs/vision/images/%2Fetc%2Fpasswd",
        "/api/runs/..%2Fvision/images/" + "e" * 64,
        "/api/runs/vision%2F..%2Fgrid/images/" + "e" * 64,
    ],
)
def test_image_path_traversal_is_refused(server, path):
    status, body = _raw_get(server, path)
    assert status == 400, (path, status, body)
    assert "[run]" not in body and "root:" not in body  # neither config.toml nor /etc/passwd
    detail = json.loads(body)["detail"]
    assert "image hash" in detail or "run name" in detail


def test_single_turn_prompt_shows_its_images_where_the_placeholders_are(client, vision_runs):
    body = client.get("/api/runs/vision/trajectories/1").json()
    records = _records(vision_runs, "vision")
    for s, rec in zip(body["samples"], records, strict=True):
        prompt, answer = s["turns"]
        parts = prompt["parts"]
        shas = [p["sha256"] for p in parts if p["type"] == "image"]
        assert shas == [sha for _, sha in rec["images"]]
        for p in parts:
            if p["type"] == "image":
                assert p["url"] == f"/api/runs/vision/images/{p['sha256']}"
        # Text and images in reading order give back the prompt, placeholders and all.
        joined = "".join(p["text"] if p["type"] == "text" else IMAGE_TOKEN for p in parts)
        assert joined == rec["prompt_text"] == prompt["content"]
        assert parts[0] == {"type": "text", "text": "<|im_start|>user\n"}
        assert "parts" not in answer
        assert s["tokens"]["images"] == []  # the images are in the prompt, not the response
    two = next(s for s in body["samples"] if s["task_id"] == "two-pictures")
    kinds = [p["type"] for p in two["turns"][0]["parts"]]
    assert kinds == ["text", "image", "image", "text"]  # back to back, each its own image


def test_multi_turn_observations_show_their_pictures_in_each_turn(client, vision_runs):
    body = client.get("/api/runs/grid/trajectories/1").json()
    chipped = 0
    for s, rec in zip(body["samples"], _records(vision_runs, "grid"), strict=True):
        shown = [
            p["sha256"] for t in s["turns"] for p in t.get("parts", []) if p["type"] == "image"
        ]
        assert shown == [sha for _, sha in rec["images"]]
        for t, m in zip(s["turns"], rec["messages"], strict=True):
            pictures = isinstance(m["content"], list)
            assert ("parts" in t) == pictures  # text-only turns (errors, answers) as before
            if pictures:
                assert t["parts"][0]["type"] == "image" and t["parts"][1]["type"] == "text"
                assert t["parts"][1]["text"] == m["content"][1]["text"]
        # Observation pictures in the response are chips: one per image token run.
        n_prompt = len(rec["prompt_ids"])
        chips = s["tokens"]["images"]
        observed = [(o - n_prompt, sha) for o, sha in rec["images"] if o >= n_prompt]
        assert [(c["start"], c["sha256"]) for c in chips] == observed
        chipped += bool(chips)
        for c in chips:
            run = rec["response_ids"][c["start"] : c["start"] + c["length"]]
            assert c["length"] == 16 and len(set(run)) == 1  # the tiny VLM's 16 image tokens
            assert s["tokens"]["mask"][c["start"] : c["start"] + c["length"]] == [0] * 16
            assert s["tokens"]["text"][c["start"]] == IMAGE_TOKEN
    assert chipped  # some episode went on past a move, with a picture back


def test_without_a_tokenizer_the_prompt_images_come_before_the_text(vision_runs):
    rec = _records(vision_runs, "vision")[-1]  # two pictures
    parts = sample_view(rec, 0, 1)["turns"][0]["parts"]
    assert [p["type"] for p in parts] == ["image", "image", "text"]
    assert parts[2]["text"] == rec["prompt_text"]


def test_text_only_samples_have_no_parts_or_chips():
    rec = {
        "prompt_ids": [1, 2],
        "response_ids": [3, 4],
        "loss_mask": [1, 1],
        "prompt_text": "What is 2 + 2?",
        "response_text": "4",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    view = sample_view(rec, 0, 1)
    assert all("parts" not in t for t in view["turns"])
    assert view["tokens"]["images"] == []
    del rec["messages"]
    assert all("parts" not in t for t in sample_view(rec, 0, 1)["turns"])
