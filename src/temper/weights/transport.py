"""Versioned weight transports: the trainer publishes, engines receive.

One protocol (`WeightTransport`) with three implementations:

- `InProcessTransport`: hands over detached copies in memory (one process).
- `SharedMemoryTransport`: one flat file per version under /dev/shm, readers map
  it zero-copy; works across processes on one machine. (`shm_ring` reuses
  pre-sized buffers instead; `broadcast` sends over torch.distributed.)
- `SafetensorsFileTransport` (`temper.weights.safetensors_file`):
  `<dir>/v{version}/model.safetensors` plus `manifest.json`, for external
  engines (vLLM, SGLang) that load from disk.

Every version has a `Manifest`: tensor names, dtypes, shapes, byte offsets and
crc32 checksums of the raw bytes, one per `chunk_bytes` chunk (so checksums are
computed in parallel threads; zlib releases the GIL). A reader checks what it
got against the manifest and raises `WeightTransportError` on a mismatch.

Writes are atomic: data is written under a temporary name and the manifest is
renamed into place last, so a reader sees a version whole or not at all.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import tempfile
import threading
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from temper.errors import TemperError

#: Bytes per checksum chunk. Tensors larger than this get several crc32 values.
CHUNK_BYTES = 16 * 1024 * 1024
#: Byte alignment of each tensor inside a flat buffer.
ALIGN = 64

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="temper-weights"
            )
        return _POOL


class WeightTransportError(TemperError):
    """A published version is missing, torn, corrupt or does not match its manifest."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # e.g. "float32" (torch dtype name without the "torch." prefix)
    shape: tuple[int, ...]
    offset: int  # byte offset of the tensor's data in the version's flat buffer / file
    nbytes: int
    crc32: tuple[int, ...]  # one crc32 per CHUNK_BYTES chunk of the raw bytes


@dataclass(frozen=True)
class Manifest:
    """What a version holds. `total_bytes` is the size of the data buffer/file.

    `checksums=False` means the writer skipped crc32 (every `crc32` is empty):
    readers then check sizes only.
    """

    version: int
    total_bytes: int
    chunk_bytes: int
    tensors: tuple[TensorEntry, ...] = field(default_factory=tuple)
    checksums: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        tensors = tuple(
            TensorEntry(
                name=t["name"],
                dtype=t["dtype"],
                shape=tuple(t["shape"]),
                offset=t["offset"],
                nbytes=t["nbytes"],
                crc32=tuple(t["crc32"]),
            )
            for t in d["tensors"]
        )
        return cls(
            d["version"], d["total_bytes"], d["chunk_bytes"], tensors, d.get("checksums", True)
        )


@runtime_checkable
class WeightTransport(Protocol):
    """Trainer-to-engine weights, versioned.

    `publish` is called by the trainer with strictly increasing versions.
    `receive` returns the newest complete version (or a given one) as a fresh
    `{name: tensor}` dict and its version, after checking it against its
    manifest; it raises `WeightTransportError` if nothing is published or the
    data does not match. `latest_version` returns the newest complete version,
    or None if there is none. The result of `receive` plugs straight into
    `Engine.update_weights(state_dict, version)`.
    """

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...

    def receive(self, version: int | None = None) -> tuple[dict[str, torch.Tensor], int]: ...

    def latest_version(self) -> int | None: ...


# ---------------------------------------------------------------- helpers


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightTransportError(f"manifest names an unknown dtype {name!r}")
    return dtype


def _raw_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a flat uint8 memoryview (CPU, contiguous)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def _chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    if nbytes == 0:
        return [(0, 0)]
    return [(a, min(a + chunk, nbytes)) for a in range(0, nbytes, chunk)]


def _crc_many(views: list[memoryview]) -> list[int]:
    if len(views) <= 1:
        return [zlib.crc32(v) for v in views]
    return list(_pool().map(zlib.crc32, views))


def _tensor_crcs(buf: memoryview, chunk: int) -> tuple[int, ...]:
    return tuple(_crc_many([buf[a:b] for a, b in _chunks(len(buf), chunk)]))


def _layout(
    state_dict: Mapping[str, torch.Tensor], version: int, chunk: int, with_crc: bool = True
) -> tuple[Manifest, list[memoryview]]:
    """Plan a flat buffer: aligned offsets, and checksums of the source bytes."""
    entries, views, offset = [], [], 0
    all_chunks: list[memoryview] = []
    spans: list[tuple[int, int]] = []
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is {type(t).__name__}, not a tensor")
        buf = _raw_bytes(t)
        views.append(buf)
        offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        pieces = [buf[a:b] for a, b in _chunks(len(buf), chunk)]
        spans.append((len(all_chunks), len(all_chunks) + len(pieces)))
        all_chunks.extend(pieces)
        entries.append([name, _dtype_name(t.dtype), tuple(t.shape), offset, len(buf)])
        offset += len(buf)
    crcs = _crc_many(all_chunks) if with_crc else []
    tensors = tuple(
        TensorEntry(n, d, s, o, nb, tuple(crcs[a:b]) if with_crc else ())
        for (n, d, s, o, nb), (a, b) in zip(entries, spans, strict=True)
    )
    return Manifest(version, offset, chunk, tensors, checksums=with_crc), views


def _verify(manifest: Manifest, buffers: list[memoryview], where: str) -> None:
    """Check each tensor's bytes against the manifest's crc32 values."""
    pieces, expected, names = [], [], []
    for entry, buf in zip(manifest.tensors, buffers, strict=True):
        if len(buf) != entry.nbytes:
            raise WeightTransportError(
                f"{where}: tensor {entry.name!r} has {len(buf)} bytes, manifest says "
                f"{entry.nbytes} (torn or mismatched read)"
            )
        if not manifest.checksums:
            continue
        spans = _chunks(entry.nbytes, manifest.chunk_bytes)
        if len(spans) != len(entry.crc32):
            raise WeightTransportError(
                f"{where}: tensor {entry.name!r} has {len(entry.crc32)} checksums for "
                f"{len(spans)} chunks"
            )
        for (a, b), crc in zip(spans, entry.crc32, strict=True):
            pieces.append(buf[a:b])
            expected.append(crc)
            names.append(entry.name)
    got = _crc_many(pieces)
    for name, g, e in zip(names, got, expected, strict=True):
        if g != e:
            raise WeightTransportError(
                f"{where}: checksum mismatch in tensor {name!r} of version "
                f"{manifest.version} (crc32 {g:#010x}, manifest {e:#010x}): "
                "the data is corrupt or torn"
            )


def _check_version(version: int, latest: int | None) -> None:
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")
    if latest is not None and version <= latest:
        raise ValueError(f"version {version} is not newer than the latest published {latest}")


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.rename(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _tensor_from(buf, entry: TensorEntry) -> torch.Tensor:
    dtype = _dtype_from_name(entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
    return raw.view(dtype).reshape(entry.shape)


# ---------------------------------------------------------------- in process


class InProcessTransport:
    """Hands weights over in memory, within one process.

    `publish` stores detached CPU copies (`copy=False` stores references: then
    the trainer must not modify the tensors in place afterwards). `receive`
    returns a new dict over the stored tensors (shared, not copied again).
    Keeps the newest `keep` versions.
    """

    def __init__(self, *, copy: bool = True, verify: bool = True, keep: int = 2) -> None:
        self.copy, self.verify, self.keep = copy, verify, max(1, keep)
        self._versions: dict[int, tuple[Manifest, dict[str, torch.Tensor]]] = {}
        self._lock = threading.Lock()

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        _check_version(version, self.latest_version())
        stored = {
            k: (v.detach().to("cpu", copy=True) if self.copy else v.detach())
            for k, v in state_dict.items()
        }
        manifest, _ = _layout(stored, version, CHUNK_BYTES, with_crc=self.verify)
        with self._lock:
            self._versions[version] = (manifest, stored)
            for old in sorted(self._versions)[: -self.keep]:
                del self._versions[old]

    def latest_version(self) -> int | None:
        with self._lock:
            return max(self._versions, default=None)

    def receive(self, version: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
        with self._lock:
            if version is None:
                version = max(self._versions, default=None)
            if version is None or version not in self._versions:
                raise WeightTransportError(f"in-process transport: no version {version}")
            manifest, stored = self._versions[version]
        out = dict(stored)
        if self.verify:
            _verify(manifest, [_raw_bytes(out[e.name]) for e in manifest.tensors], "in-process")
        return out, version


# ---------------------------------------------------------------- shared memory

_SHM_MANIFEST = re.compile(r"^v(\d+)\.json$")


class SharedMemoryTransport:
    """One flat buffer per version in a directory on /dev/shm (tmpfs).

    Layout of `root`: `v{N}.bin` (all tensors back to back, 64-byte aligned) and
    `v{N}.json` (the manifest). `publish` writes `v{N}.bin` under a temporary
    name, renames it, then renames the manifest into place: the manifest's
    rename is the commit point. Files are never modified after commit, so a
    received version stays intact even after it is garbage collected (the
    reader's mapping keeps the pages alive). The newest `keep` versions are kept.

    `receive` maps the file copy-on-write (`MAP_PRIVATE`) and builds tensors over
    it with `torch.frombuffer`: no copy; writing to a received tensor changes
    only the reader's private page. The object is picklable (it is just a path),
    so pass it to other processes. `checksum=False` skips crc32 on the writer
    (readers then check sizes only). For the hot path see
    `temper.weights.shm_ring.SharedMemoryRingTransport` (reused buffers).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        verify: bool = True,
        keep: int = 2,
        checksum: bool = True,
    ) -> None:
        self.root = Path(root)
        self.verify, self.keep, self.checksum = verify, max(1, keep), checksum
        self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, name: str, **kwargs) -> SharedMemoryTransport:
        """A transport under `/dev/shm/temper-{name}`."""
        return cls(Path("/dev/shm") / f"temper-{name}", **kwargs)

    def versions(self) -> list[int]:
        """Committed versions, oldest first."""
        out = []
        for p in os.listdir(self.root):
            m = _SHM_MANIFEST.match(p)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def latest_version(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        _check_version(version, self.latest_version())
        manifest, views = _layout(state_dict, version, CHUNK_BYTES, with_crc=self.checksum)
        data = self.root / f"v{version}.bin"
        tmp = self.root / f".v{version}.bin.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.ftruncate(fd, manifest.total_bytes)
            jobs = []
            for entry, view in zip(manifest.tensors, views, strict=True):
                for a, b in _chunks(entry.nbytes, CHUNK_BYTES):
                    if b > a:
                        jobs.append((view[a:b], entry.offset + a))
            list(_pool().map(lambda j: _pwrite_all(fd, *j), jobs))
        finally:
            os.close(fd)
        try:
            os.rename(tmp, data)
            _atomic_write_text(self.root / f"v{version}.json", manifest.to_json())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._collect()

    def _collect(self) -> None:
        for old in self.versions()[: -self.keep]:
            # Manifest first: once it is gone no new reader picks this version.
            (self.root / f"v{old}.json").unlink(missing_ok=True)
            (self.root / f"v{old}.bin").unlink(missing_ok=True)

    def read_manifest(self, version: int) -> Manifest:
        try:
            text = (self.root / f"v{version}.json").read_text()
        except FileNotFoundError:
            raise WeightTransportError(
                f"shared memory {self.root}: version {version} is not published "
                f"(have {self.versions()})"
            ) from None
        return Manifest.from_json(text)

    def receive(self, version: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
        if version is not None:
            return self._receive(version), version
        for _ in range(5):  # the newest version can be collected between list and open
            latest = self.latest_version()
            if latest is None:
                raise WeightTransportError(f"shared memory {self.root}: nothing published yet")
            try:
                return self._receive(latest), latest
            except FileNotFoundError:
                continue
        raise WeightTransportError(f"shared memory {self.root}: versions vanish while reading")

    def _receive(self, version: int) -> dict[str, torch.Tensor]:
        manifest = self.read_manifest(version)
        where = f"shared memory {self.root / f'v{version}.bin'}"
        if manifest.version != version:
            raise WeightTransportError(f"{where}: manifest says version {manifest.version}")
        with open(self.root / f"v{version}.bin", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != manifest.total_bytes:
                raise WeightTransportError(
                    f"{where}: file has {size} bytes, manifest says {manifest.total_bytes} "
                    "(torn or mismatched)"
                )
            if size == 0:
                buf = bytearray(0)
            else:
                buf = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        if self.verify:
            mv = memoryview(buf)
            _verify(manifest, [mv[e.offset : e.offset + e.nbytes] for e in manifest.tensors], where)
            mv.release()
        return {e.name: _tensor_from(buf, e) for e in manifest.tensors}

    def destroy(self) -> None:
        """Remove the directory and everything published (readers keep their maps)."""
        shutil.rmtree(self.root, ignore_errors=True)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
