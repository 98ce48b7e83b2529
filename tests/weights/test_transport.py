"""Weight transports: real files, real shared memory, a real second process."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import uuid

import pytest
import torch

from temper.weights import (
    InProcessTransport,
    SafetensorsFileTransport,
    SharedMemoryTransport,
    WeightTransport,
    WeightTransportError,
)


def make_state(seed: int, big: int = 1000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(big, 16, generator=g),
        "layer.0.w": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "layer.0.b": torch.randn(5, generator=g, dtype=torch.float64),
        "scalar": torch.tensor(3.5),
        "ids": torch.arange(11, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(6, 4, generator=g).t(),  # non-contiguous
    }


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    if list(a) != list(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        xb = x.contiguous().reshape(-1).view(torch.uint8)
        yb = y.contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(xb, yb):
            return False
    return True


@pytest.fixture
def shm_root():
    t = SharedMemoryTransport.create(f"test-{uuid.uuid4().hex[:10]}")
    yield t.root
    t.destroy()


@pytest.fixture(params=["inprocess", "shm", "safetensors"])
def transport(request, shm_root, tmp_path) -> WeightTransport:
    if request.param == "inprocess":
        return InProcessTransport()
    if request.param == "shm":
        return SharedMemoryTransport(shm_root)
    return SafetensorsFileTransport(tmp_path / "weights")


def test_protocol(transport):
    assert isinstance(transport, WeightTransport)


def test_round_trip_bitwise(transport):
    state = make_state(0)
    assert transport.latest_version() is None
    with pytest.raises(WeightTransportError, match=r"nothing published|no version"):
        transport.receive()
    transport.publish(state, 1)
    got, version = transport.receive()
    assert version == 1
    assert bitwise_equal(state, got)


def test_versions_ordered_and_latest(transport):
    for v in (1, 2, 5):
        transport.publish(make_state(v), v)
    assert transport.latest_version() == 5
    got, version = transport.receive()
    assert version == 5 and bitwise_equal(make_state(5), got)
    got2, _ = transport.receive(2)  # keep=2 by default: 2 and 5 remain
    assert bitwise_equal(make_state(2), got2)
    with pytest.raises(WeightTransportError, match="version 1"):
        transport.receive(1)
    with pytest.raises(ValueError, match="not newer"):
        transport.publish(make_state(0), 5)
    with pytest.raises(ValueError, match="not newer"):
        transport.publish(make_state(0), 3)


def test_inprocess_copy_isolates_trainer():
    t = InProcessTransport()
    state = make_state(0)
    t.publish(state, 1)
    state["embed.weight"].add_(1.0)  # the trainer keeps training in place
    got, _ = t.receive()
    assert bitwise_equal(make_state(0), got)


def test_inprocess_corruption_detected():
    t = InProcessTransport()
    t.publish(make_state(0), 1)
    got, _ = t.receive()
    got["embed.weight"][3, 3] += 1.0  # shares storage with the stored version
    with pytest.raises(WeightTransportError, match=r"checksum mismatch in tensor 'embed\.weight'"):
        t.receive()


def _flip_byte(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_shm_corruption_detected(shm_root):
    t = SharedMemoryTransport(shm_root)
    t.publish(make_state(0), 1)
    entry = next(e for e in t.read_manifest(1).tensors if e.name == "layer.0.b")
    _flip_byte(shm_root / "v1.bin", entry.offset + 3)
    with pytest.raises(WeightTransportError, match=r"checksum mismatch in tensor 'layer\.0\.b'"):
        t.receive()
    # A truncated data file is refused too.
    os.truncate(shm_root / "v1.bin", 100)
    with pytest.raises(WeightTransportError, match="torn or mismatched"):
        t.receive()


def test_safetensors_corruption_detected(tmp_path):
    t = SafetensorsFileTransport(tmp_path)
    t.publish(make_state(0), 1)
    path = t.path(1) / "model.safetensors"
    assert path.exists() and (t.path(1) / "manifest.json").exists()
    from safetensors.torch import load_file

    assert bitwise_equal(  # an external engine can read the file directly
        {k: v for k, v in make_state(0).items()},
        {k: load_file(path)[k] for k in make_state(0)},
    )
    import json

    m = json.loads((t.path(1) / "manifest.json").read_text())
    entry = next(e for e in m["tensors"] if e["name"] == "ids")
    _flip_byte(path, entry["offset"])
    with pytest.raises(WeightTransportError, match="checksum mismatch in tensor 'ids'"):
        t.receive()


def test_shm_received_version_survives_collection(shm_root):
    t = SharedMemoryTransport(shm_root, keep=1)
    t.publish(make_state(1), 1)
    got, _ = t.receive()
    t.publish(make_state(2), 2)  # v1 files are unlinked
    assert t.versions() == [2]
    assert bitwise_equal(make_state(1), got)
    got["scalar"].fill_(0)  # private copy-on-write: the published file is untouched
    assert bitwise_equal(make_state(2), t.receive()[0])


def _child_receive(root: str, queue) -> None:
    t = SharedMemoryTransport(root)
    got, version = t.receive()
    queue.put((version, bitwise_equal(make_state(version), got)))


def test_shm_other_process_receives(shm_root):
    t = SharedMemoryTransport(shm_root)
    t.publish(make_state(7), 7)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_receive, args=(str(shm_root), q))
    p.start()
    try:
        assert q.get(timeout=60) == (7, True)
    finally:
        p.join(timeout=30)
    assert p.exitcode == 0


def _stamp(version: int) -> dict[str, torch.Tensor]:
    # Large enough that a write takes a while; content tied to the version.
    return {f"w{i}": torch.full((1 << 20,), float(version + i)) for i in range(4)}


def _check_stamp(got: dict[str, torch.Tensor], version: int) -> None:
    for i in range(4):
        assert torch.equal(got[f"w{i}"], torch.full((1 << 20,), float(version + i)))


def test_torn_write_never_visible_concurrent(shm_root):
    t = SharedMemoryTransport(shm_root, keep=3)
    t.publish(_stamp(1), 1)
    done = threading.Event()

    def writer():
        for v in range(2, 12):
            t.publish(_stamp(v), v)
        done.set()

    th = threading.Thread(target=writer)
    th.start()
    reader = SharedMemoryTransport(shm_root)
    seen = set()
    while not done.is_set():
        got, v = reader.receive()  # verifies checksums: raises on any torn read
        _check_stamp(got, v)
        seen.add(v)
    th.join()
    assert reader.latest_version() == 11
    assert len(seen) >= 1


def _publish_forever(root: str) -> None:
    t = SharedMemoryTransport(root)
    v = t.latest_version() + 1
    while True:
        t.publish(_stamp(v), v)
        v += 1


def test_writer_killed_mid_publish_leaves_last_complete(shm_root):
    t = SharedMemoryTransport(shm_root)
    t.publish(_stamp(1), 1)
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_publish_forever, args=(str(shm_root),))
    p.start()
    deadline = time.monotonic() + 600  # a generous cap: a loaded machine starts slowly
    while t.latest_version() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.013)
    os.kill(p.pid, signal.SIGKILL)
    p.join(timeout=30)
    got, v = t.receive()  # whatever was committed last is whole
    assert v >= 3
    _check_stamp(got, v)


def test_shm_without_checksums_checks_sizes_only(shm_root):
    t = SharedMemoryTransport(shm_root, checksum=False)
    t.publish(make_state(0), 1)
    manifest = t.read_manifest(1)
    assert not manifest.checksums and all(e.crc32 == () for e in manifest.tensors)
    assert bitwise_equal(make_state(0), t.receive()[0])
    entry = next(e for e in manifest.tensors if e.name == "ids")
    _flip_byte(shm_root / "v1.bin", entry.offset)
    assert not bitwise_equal(make_state(0), t.receive()[0])  # nothing to check it against
    os.truncate(shm_root / "v1.bin", 100)
    with pytest.raises(WeightTransportError, match="torn or mismatched"):
        t.receive()
