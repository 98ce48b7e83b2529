"""SharedMemoryRingTransport: reused slots on real /dev/shm, a writer thread, a killed writer."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import uuid

import pytest
import torch
from test_transport import _check_stamp, _stamp, bitwise_equal, make_state

from temper.weights import WeightTransport, WeightTransportError
from temper.weights.shm_ring import HEADER, SharedMemoryRingTransport


@pytest.fixture
def ring():
    t = SharedMemoryRingTransport.create(f"test-{uuid.uuid4().hex[:10]}", checksum=True)
    yield t
    t.destroy()


def test_round_trip_versions_and_slots(ring):
    assert isinstance(ring, WeightTransport)
    with pytest.raises(WeightTransportError, match="nothing published"):
        ring.receive()
    for v in (1, 2):
        ring.publish(make_state(v), v)
    got2, v = ring.receive()
    assert v == 2 and bitwise_equal(make_state(2), got2)
    assert bitwise_equal(make_state(1), ring.receive(1)[0])
    assert sorted(p.name for p in ring.root.glob("slot*.bin")) == ["slot0.bin", "slot1.bin"]
    ring.publish(make_state(3), 3)  # reuses v1's slot; v2's views are untouched
    assert ring.versions() == [2, 3]
    assert ring.is_intact(2) and bitwise_equal(make_state(2), got2)
    with pytest.raises(WeightTransportError, match="version 1 is not published"):
        ring.receive(1)
    with pytest.raises(ValueError, match="not newer"):
        ring.publish(make_state(0), 3)
    ring.publish(make_state(4), 4)  # reuses v2's slot: the old views now show v4
    assert not ring.is_intact(2) and ring.versions() == [3, 4]
    assert bitwise_equal(make_state(4), got2)
    got2["scalar"].fill_(0)  # copy-on-write: the slot itself is unchanged
    assert bitwise_equal(make_state(4), ring.receive()[0])


def test_growing_state_dict_resizes_slots(ring):
    ring.publish({"w": torch.arange(10.0)}, 1)
    ring.publish({"w": torch.arange(10.0)}, 2)
    ring.publish({"w": torch.arange(5000.0), "b": torch.ones(3, dtype=torch.bfloat16)}, 3)
    got, v = ring.receive()
    assert v == 3 and torch.equal(got["w"], torch.arange(5000.0)) and got["b"].sum() == 3


def test_corruption_detected_with_checksums(ring):
    ring.publish(make_state(0), 1)
    entry = next(e for e in ring._read(1)[0].tensors if e.name == "layer.0.b")
    with open(ring.root / "slot0.bin", "r+b") as f:
        f.seek(HEADER + entry.offset + 2)
        b = f.read(1)
        f.seek(HEADER + entry.offset + 2)
        f.write(bytes([b[0] ^ 0x55]))
    with pytest.raises(WeightTransportError, match=r"checksum mismatch in tensor 'layer\.0\.b'"):
        ring.receive()
    unchecked = SharedMemoryRingTransport(ring.root, verify=False)
    assert not bitwise_equal(make_state(0), unchecked.receive()[0])


def test_reader_never_keeps_a_torn_version(ring):
    """A writer thread publishes as fast as it can; every version a reader copies
    while its slot still held it (seqlock check after the copy) is whole."""
    ring.publish(_stamp(1), 1)
    done = threading.Event()

    def writer():
        for v in range(2, 30):
            ring.publish(_stamp(v), v)
        done.set()

    th = threading.Thread(target=writer)
    th.start()
    reader = pickle.loads(pickle.dumps(SharedMemoryRingTransport(ring.root)))
    whole = 0
    while not done.is_set():
        got, v = reader.receive()
        copy = {k: t.clone() for k, t in got.items()}
        if reader.is_intact(v):
            _check_stamp(copy, v)
            whole += 1
    th.join()
    assert reader.latest_version() == 29 and whole >= 1
    _check_stamp(reader.receive()[0], 29)


def _publish_forever(root: str) -> None:
    t = SharedMemoryRingTransport(root)
    v = t.latest_version() + 1
    while True:
        t.publish(_stamp(v), v)
        v += 1


def test_writer_killed_mid_publish_leaves_last_complete(ring):
    ring.publish(_stamp(1), 1)
    p = mp.get_context("spawn").Process(target=_publish_forever, args=(str(ring.root),))
    p.start()
    deadline = time.monotonic() + 600  # a generous cap: a loaded machine starts slowly
    while ring.latest_version() < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.007)
    os.kill(p.pid, signal.SIGKILL)
    p.join(timeout=30)
    got, v = ring.receive()  # committed last and whole, from another process's writes
    assert v >= 4
    _check_stamp(got, v)
    assert ring.is_intact(v)
