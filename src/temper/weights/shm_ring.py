"""`SharedMemoryRingTransport`: shared-memory weights in a ring of reused, pre-sized buffers.

`SharedMemoryTransport` writes every version into a fresh /dev/shm file, so
every publish pays for the kernel allocating and zeroing new tmpfs pages, and
it checksums on both sides: about 15x a plain in-memory copy. This transport
keeps `slots` files (`slot{i}.bin`, default 2: double buffering) and the
writer keeps them mapped, so a publish is one `Tensor.copy_` per tensor into
warm pages; checksums are optional (`checksum=True` records them and readers
with `verify=True` check them).

Slot file layout: a 64-byte header (the little-endian uint64 version held, or
`WRITING` while a write is in progress), then the tensors back to back at the
manifest's offsets. Version N is committed by renaming `v{N}.json` (the
manifest plus its slot) into place after the data and header are written.

Guarantees:

- **No half-written version.** Before overwriting a slot the writer removes
  the manifest of the version it held and marks the header `WRITING`; a
  reader checks the header against the manifest's version before and after
  building (and verifying) its view, so it never returns a torn version; if
  the slot was reused under it, it moves to the newest version.
- **Versions strictly increase**, as in every transport; the newest `slots`
  versions stay readable (`slots - 1` while a publish is in progress).
- **Received tensors are views, not copies, and are not immutable**: they are
  a private copy-on-write map of the slot, so writes to them stay private, but
  pages the reader has not written still show the slot's current contents.
  They hold version N until the writer starts the `slots`-th newer publish.
  Copy them before that (`Engine.update_weights` copies into its parameters);
  `is_intact(N)` tells whether the slot still holds N. Use
  `SharedMemoryTransport` when received versions must stay valid indefinitely.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

from temper.weights.transport import (
    CHUNK_BYTES,
    Manifest,
    WeightTransportError,
    _atomic_write_text,
    _check_version,
    _layout,
    _tensor_from,
    _verify,
)

#: Bytes before the data in each slot file (keeps the data 64-byte aligned).
HEADER = 64
#: Header value while a slot is being written.
WRITING = 2**64 - 1
_MANIFEST = re.compile(r"^v(\d+)\.json$")


class SharedMemoryRingTransport:
    """Versioned weights in `slots` reused /dev/shm buffers (see the module doc).

    Picklable (the writer's open maps are not carried), so a reader in another
    process rebuilds it from the path. One writer per directory.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        slots: int = 2,
        checksum: bool = False,
        verify: bool = True,
    ) -> None:
        if slots < 2:
            raise ValueError(f"slots must be >= 2 (double buffering), got {slots}")
        self.root = Path(root)
        self.slots, self.checksum, self.verify = slots, checksum, verify
        self.root.mkdir(parents=True, exist_ok=True)
        self._maps: dict[int, mmap.mmap] = {}  # writer side: slot -> shared writable map

    @classmethod
    def create(cls, name: str, **kwargs) -> SharedMemoryRingTransport:
        """A transport under `/dev/shm/temper-ring-{name}`."""
        return cls(Path("/dev/shm") / f"temper-ring-{name}", **kwargs)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = {}
        return state

    # ------------------------------------------------------------ listing

    def versions(self) -> list[int]:
        """Committed versions, oldest first."""
        return sorted(int(m.group(1)) for p in os.listdir(self.root) if (m := _MANIFEST.match(p)))

    def latest_version(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def _read(self, version: int) -> tuple[Manifest, int]:
        """A committed version's manifest and slot; FileNotFoundError once it is gone."""
        text = (self.root / f"v{version}.json").read_text()
        return Manifest.from_json(text), int(json.loads(text)["slot"])

    def _slot_path(self, slot: int) -> Path:
        return self.root / f"slot{slot}.bin"

    # ------------------------------------------------------------ writer

    def _slot_map(self, slot: int, size: int) -> mmap.mmap:
        """The writer's shared map of `slot`, at least `size` bytes (grown if needed)."""
        m = self._maps.get(slot)
        if m is not None and len(m) >= size:
            return m
        if m is not None:
            m.close()
        fd = os.open(self._slot_path(slot), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            m = mmap.mmap(fd, max(size, os.fstat(fd).st_size), access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self._maps[slot] = m
        return m

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write `state_dict` into the slot after the newest version's, then commit it."""
        committed = self.versions()
        _check_version(version, committed[-1] if committed else None)
        slot = 0
        if committed:
            slot = (self._read(committed[-1])[1] + 1) % self.slots
        for old in committed:  # uncommit whatever the chosen slot held
            if self._read(old)[1] == slot:
                (self.root / f"v{old}.json").unlink(missing_ok=True)
        state = {k: v.detach() for k, v in state_dict.items()}
        manifest, _ = _layout(state, version, CHUNK_BYTES, with_crc=self.checksum)
        m = self._slot_map(slot, HEADER + manifest.total_bytes)
        struct.pack_into("<Q", m, 0, WRITING)
        data = memoryview(m)[HEADER:]
        try:
            for e in manifest.tensors:
                if e.nbytes:
                    dst = _tensor_from(data, e)
                    dst.copy_(state[e.name])  # strided sources are fine
                    del dst
        finally:
            data.release()
        struct.pack_into("<Q", m, 0, version)
        body = json.loads(manifest.to_json())
        body["slot"] = slot
        _atomic_write_text(self.root / f"v{version}.json", json.dumps(body))

    # ------------------------------------------------------------ reader

    def receive(self, version: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
        """The newest committed version (or `version`) as zero-copy tensors."""
        for _ in range(10):  # the newest slot can be reused between listing and reading
            v = self.latest_version() if version is None else version
            if v is None:
                raise WeightTransportError(f"shared-memory ring {self.root}: nothing published yet")
            try:
                out = self._receive(v)
            except FileNotFoundError:
                out = None
            if out is not None:
                return out, v
            if version is not None:
                raise WeightTransportError(
                    f"shared-memory ring {self.root}: version {version} is not published "
                    f"(have {self.versions()})"
                )
        raise WeightTransportError(f"shared-memory ring {self.root}: versions vanish while reading")

    def _receive(self, version: int) -> dict[str, torch.Tensor] | None:
        """Map the slot of `version`; None if the slot no longer holds it."""
        manifest, slot = self._read(version)
        where = f"shared-memory ring {self._slot_path(slot)} (version {version})"
        with open(self._slot_path(slot), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER + manifest.total_bytes:
                raise WeightTransportError(
                    f"{where}: file has {size} bytes, manifest needs "
                    f"{HEADER + manifest.total_bytes} (torn or mismatched)"
                )
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        if struct.unpack_from("<Q", m, 0)[0] != version:
            return None
        data = memoryview(m)[HEADER:]
        if self.verify and manifest.checksums:
            views = [data[e.offset : e.offset + e.nbytes] for e in manifest.tensors]
            try:
                _verify(manifest, views, where)
            except WeightTransportError:
                if struct.unpack_from("<Q", m, 0)[0] != version:
                    return None  # overwritten while we read: not corrupt, just gone
                raise
        out = {e.name: _tensor_from(data, e) for e in manifest.tensors}
        # Seqlock check: the slot still held this version after the views were built.
        return out if struct.unpack_from("<Q", m, 0)[0] == version else None

    def is_intact(self, version: int) -> bool:
        """Whether a slot still holds `version` (received views of it are still right)."""
        try:
            _, slot = self._read(version)
            with open(self._slot_path(slot), "rb") as f:
                head = f.read(8)
        except FileNotFoundError:
            return False
        return len(head) == 8 and struct.unpack("<Q", head)[0] == version

    def destroy(self) -> None:
        """Close the writer's maps and remove everything (readers keep their maps)."""
        for m in self._maps.values():
            m.close()
        self._maps.clear()
        shutil.rmtree(self.root, ignore_errors=True)
