"""`temper dash` serves only what lies in a run: a symlink planted in a run's images/
pointing out (at /etc/passwd) is a 400, not the file; a FIFO there does not hang the
request; a 5,000-character or control-character run name is a short 400, not a 500.
`temper dash` prints its URL only once the port accepts connections."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys

import httpx
import pytest
from PIL import Image as PILImage
from raw_http import raw_get

from temper.monitor.dashboard import DashboardServer


def _sha(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def _image_path(run, sha: str):
    folder = run / "images" / sha[:2]  # the `temper.vision.ImageStore` layout
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{sha}.png"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run "planted" holding a real PNG, a symlink inside the run to it, a symlink out
    to /etc/passwd, a symlink to a file beside the run and a FIFO, each named by a hash."""
    root = tmp_path_factory.mktemp("runs")
    run = root / "planted"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    PILImage.new("RGB", (8, 8), "red").save(_image_path(run, _sha("real")))
    os.symlink(_image_path(run, _sha("real")), _image_path(run, _sha("inside")))
    os.symlink("/etc/passwd", _image_path(run, _sha("passwd")))
    (root / "secret.png").write_bytes(b"not for the dashboard")
    os.symlink(root / "secret.png", _image_path(run, _sha("beside")))
    os.mkfifo(_image_path(run, _sha("fifo")))
    return root


@pytest.fixture(scope="module")
def server(runs):
    with DashboardServer(runs) as srv:
        yield srv


def test_real_images_and_symlinks_inside_the_run_are_served(server, runs):
    real = (_image_path(runs / "planted", _sha("real"))).read_bytes()
    for tag in ("real", "inside"):
        reply = httpx.get(f"{server.url}/api/runs/planted/images/{_sha(tag)}", timeout=10)
        assert reply.status_code == 200 and reply.content == real, tag


@pytest.mark.parametrize("tag", ["passwd", "beside"])
def test_a_symlink_out_of_the_run_is_a_400_not_the_file(server, tag):
    status, body = raw_get(server.port, f"/api/runs/planted/images/{_sha(tag)}")
    assert status == 400, body
    assert "root:" not in body and "not for the dashboard" not in body
    assert "not a regular file inside its run directory" in json.loads(body)["detail"]


def test_a_fifo_in_images_does_not_hang_the_request(server):
    # raw_get times out after 10 s; a FIFO is not a file: "no image".
    status, _ = raw_get(server.port, f"/api/runs/planted/images/{_sha('fifo')}")
    assert status == 404


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("r" * 5000, "longer than 255 bytes"),
        ("%C3%A9" * 200, "longer than 255 bytes"),  # "é" * 200: 400 bytes in UTF-8
        ("bad%0Aname", "control characters"),
        ("bad%01name", "control characters"),
        ("bad%00name", "control characters"),
        ("%20padded", "surrounding whitespace"),
    ],
)
def test_bad_run_names_are_short_400s(server, name, says):
    for path in (f"/api/runs/{name}", f"/api/runs/{name}/images/{_sha('real')}"):
        status, body = raw_get(server.port, path)
        assert status == 400, (path[:80], status, body[:200])
        detail = json.loads(body)["detail"]
        assert says in detail and len(detail) < 200 and "\n" not in detail


def test_a_long_unmatched_path_is_answered_briefly(server):
    status, body = raw_get(server.port, "/api/runs/x/" + "y" * 5000)
    assert status == 404 and len(body) < 400


def test_cli_dash_prints_its_url_once_it_accepts_connections(runs):
    proc = subprocess.Popen(
        [sys.executable, "-m", "temper.cli.main", "dash", str(runs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("dashboard: http://127.0.0.1:"), line + proc.stderr.read()
        port = int(line.split()[1].rsplit(":", 1)[1].split("/")[0])
        # Connect at once, no retry: the line promises the port is accepting.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert raw_get(port, "/api/runs")[0] == 200
    finally:
        proc.terminate()
        proc.wait(20)
