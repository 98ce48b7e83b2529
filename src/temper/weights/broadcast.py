"""`BroadcastTransport`: weights from one rank to the others over `torch.distributed`.

The trainer (rank `src`) calls `publish(state_dict, version)`; every other rank
of the process group calls `receive()` at the same point in its program (these
are collectives: each publish is matched by exactly one receive on every other
rank). gloo carries CPU tensors, nccl CUDA tensors.

One publish is, in order:

1. a header via `broadcast_object_list`: the version, the `Manifest` (names,
   dtypes, shapes, byte counts, optional crc32 checksums) and the bucket size,
   so receivers know what to allocate and how the buckets are cut;
2. the data, in buckets: tensors are grouped by dtype (in state-dict order) and
   packed into flat buckets of at most `bucket_bytes`. A tensor larger than a
   bucket is split across buckets by element ranges; a piece that fills a
   bucket alone is broadcast straight from the source / into the destination,
   with no packing copy. Buckets go as raw bytes, so any dtype works;
3. an all-reduce of one status integer per rank (0 = ok, 1 = rejected: a
   checksum mismatch, or `into=` tensors that do not match the manifest),
   so `publish` returns only once every receiver holds the version and raises
   if one of them rejected it.

A rank that dies or stops answering makes the collectives fail; the process
group's timeout (`init_process_group(timeout=...)`) bounds the wait. The
failure is raised as `WeightTransportError` naming the version and the step,
and the process group should then be considered broken (destroy it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from temper.weights.transport import (
    CHUNK_BYTES,
    Manifest,
    TensorEntry,
    WeightTransportError,
    _check_version,
    _dtype_from_name,
    _dtype_name,
    _layout,
    _raw_bytes,
    _verify,
)

#: Default bucket size: large enough to amortise a collective, small enough that
#: the packing buffer stays a small fraction of the model.
BUCKET_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Piece:
    """Elements `[start, stop)` of the flattened tensor `name`, at `offset` elements
    into its bucket."""

    name: str
    start: int
    stop: int
    offset: int


@dataclass(frozen=True)
class Bucket:
    """One broadcast: `numel` elements of `dtype`, holding `pieces` back to back."""

    dtype: torch.dtype
    numel: int
    pieces: tuple[Piece, ...]


def plan_buckets(manifest: Manifest, bucket_bytes: int) -> list[Bucket]:
    """Cut the manifest's tensors into same-dtype buckets of at most `bucket_bytes`.

    Deterministic: sender and receivers compute the same plan from the same
    manifest. Tensors keep state-dict order within a dtype; a tensor that does
    not fit in the current bucket's remaining room continues in the next one.
    Empty tensors are in no bucket.
    """
    by_dtype: dict[str, list[TensorEntry]] = {}
    for e in manifest.tensors:
        by_dtype.setdefault(e.dtype, []).append(e)
    buckets: list[Bucket] = []
    for name, entries in by_dtype.items():
        dtype = _dtype_from_name(name)
        cap = max(1, bucket_bytes // dtype.itemsize)
        pieces: list[Piece] = []
        used = 0
        for e in entries:
            numel, start = e.nbytes // dtype.itemsize, 0
            while start < numel:
                take = min(numel - start, cap - used)
                pieces.append(Piece(e.name, start, start + take, used))
                start, used = start + take, used + take
                if used == cap:
                    buckets.append(Bucket(dtype, used, tuple(pieces)))
                    pieces, used = [], 0
        if pieces:
            buckets.append(Bucket(dtype, used, tuple(pieces)))
    return buckets


def _manifest(state: Mapping[str, torch.Tensor], version: int, checksum: bool) -> Manifest:
    """The manifest of `state`; crc32 needs the bytes on the CPU, so it is optional."""
    if checksum:
        return _layout({k: v.detach().cpu() for k, v in state.items()}, version, CHUNK_BYTES)[0]
    entries = tuple(
        TensorEntry(k, _dtype_name(t.dtype), tuple(t.shape), 0, t.numel() * t.element_size(), ())
        for k, t in state.items()
    )
    return Manifest(version, sum(e.nbytes for e in entries), CHUNK_BYTES, entries, False)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)


class BroadcastTransport:
    """Versioned weights over a `torch.distributed` process group (see the module doc).

    `group` defaults to the world group; `src` is the publishing rank.
    `bucket_bytes` is the sender's bucket size (receivers take it from the
    header). `checksum=True` makes the sender compute crc32 checksums (on the
    CPU; costs about one pass over the bytes) and receivers with `verify=True`
    check them. `device` is where communication buffers live: CUDA for nccl,
    CPU for gloo (the default picks by backend).

    `receive()` blocks until the sender's next `publish`. With `into=` (e.g. the
    engine's parameters by name) it writes into those tensors, which must match
    the manifest's dtypes and shapes; otherwise it allocates new tensors.
    `receive(version)` raises if the published version is a different one.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        src: int = 0,
        bucket_bytes: int = BUCKET_BYTES,
        checksum: bool = False,
        verify: bool = True,
        device: str | torch.device | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise WeightTransportError("BroadcastTransport needs torch.distributed initialized")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.group, self.src = group, src
        self.bucket_bytes, self.checksum, self.verify = bucket_bytes, checksum, verify
        self.rank = dist.get_rank(group)
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device(device or ("cuda" if nccl else "cpu"))
        self._latest: int | None = None
        #: The manifest of the last version published or received (names, shapes, crc32).
        self.last_manifest: Manifest | None = None
        self._scratch: dict[torch.dtype, torch.Tensor] = {}

    def latest_version(self) -> int | None:
        """The last version this rank published or received."""
        return self._latest

    def _buffer(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A reusable packing buffer of at least `numel` elements of `dtype`."""
        buf = self._scratch.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._scratch[dtype] = buf
        return buf[:numel]

    def _bcast(self, t: torch.Tensor) -> None:
        # Bytes, not elements: gloo lacks some dtypes (bool, some float8s).
        dist.broadcast(t.view(torch.uint8), self.src, group=self.group)

    def _fail(self, version: int, step: str, exc: BaseException) -> WeightTransportError:
        first = (str(exc).strip().splitlines() or [""])[0]
        return WeightTransportError(
            f"broadcast of weights version {version} failed during the {step} on rank "
            f"{self.rank}: a peer rank died or did not answer within the process group "
            f"timeout ({type(exc).__name__}: {first[:200]})"
        )

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Send `state_dict` as `version` to every other rank; returns once all hold it."""
        if self.rank != self.src:
            raise WeightTransportError(f"rank {self.rank} cannot publish: the sender is {self.src}")
        _check_version(version, self._latest)
        state = {k: v.detach() for k, v in state_dict.items()}
        manifest = _manifest(state, version, self.checksum)
        flat = {k: _flat(v.to(self.device).contiguous()) for k, v in state.items()}
        step = "header"
        try:
            dist.broadcast_object_list(
                [(version, manifest.to_json(), self.bucket_bytes)], self.src, group=self.group
            )
            step = "data"
            for bucket in plan_buckets(manifest, self.bucket_bytes):
                self._send_bucket(bucket, flat)
            step = "acknowledgement"
            status = torch.zeros(1, dtype=torch.int32, device=self.device)
            dist.all_reduce(status, group=self.group)
        except (RuntimeError, ValueError, OSError) as exc:
            raise self._fail(version, step, exc) from exc
        if int(status.item()):
            raise WeightTransportError(
                f"broadcast of weights version {version}: {int(status.item())} receiver(s) "
                "rejected it (checksum mismatch, or tensors unlike their receive(into=...))"
            )
        self._latest, self.last_manifest = version, manifest

    def _send_bucket(self, bucket: Bucket, flat: Mapping[str, torch.Tensor]) -> None:
        if len(bucket.pieces) == 1:  # no packing copy
            p = bucket.pieces[0]
            self._bcast(flat[p.name][p.start : p.stop])
            return
        buf = self._buffer(bucket.dtype, bucket.numel)
        for p in bucket.pieces:
            buf[p.offset : p.offset + p.stop - p.start].copy_(flat[p.name][p.start : p.stop])
        self._bcast(buf)

    def receive(
        self, version: int | None = None, *, into: Mapping[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, torch.Tensor], int]:
        """Take the sender's next publish; returns `({name: tensor}, version)`."""
        if self.rank == self.src:
            raise WeightTransportError(f"rank {self.rank} is the sender; it cannot receive")
        got, step = -1, "header"
        try:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, self.src, group=self.group)
            got, text, bucket_bytes = box[0]
            manifest = Manifest.from_json(text)
            out, bad = self._destinations(manifest, into)
            step = "data"
            for bucket in plan_buckets(manifest, bucket_bytes):
                self._recv_bucket(bucket, out)
            bad = bad or self._check(manifest, out)
            step = "acknowledgement"
            status = torch.tensor([int(bad is not None)], dtype=torch.int32, device=self.device)
            dist.all_reduce(status, group=self.group)
        except (RuntimeError, ValueError, OSError) as exc:
            raise self._fail(got, step, exc) from exc
        if bad is not None:
            raise bad
        if version is not None and got != version:
            raise WeightTransportError(f"expected weights version {version}, the sender sent {got}")
        self._latest, self.last_manifest = got, manifest
        return out, got

    def _destinations(
        self, manifest: Manifest, into: Mapping[str, torch.Tensor] | None
    ) -> tuple[dict[str, torch.Tensor], WeightTransportError | None]:
        """Where each tensor lands. A mismatching `into` is reported, not raised, so
        this rank still takes part in the collectives (the sender would hang); the
        data then lands in scratch tensors and `into` is left untouched."""
        problem = _mismatch(manifest, into) if into is not None else None
        if into is not None and problem is None:
            return {e.name: into[e.name] for e in manifest.tensors}, None
        out = {
            e.name: torch.empty(e.shape, dtype=_dtype_from_name(e.dtype), device=self.device)
            for e in manifest.tensors
        }
        if problem is None:
            return out, None
        return out, WeightTransportError(f"broadcast version {manifest.version}: {problem}")

    def _recv_bucket(self, bucket: Bucket, out: Mapping[str, torch.Tensor]) -> None:
        direct = len(bucket.pieces) == 1 and out[bucket.pieces[0].name].device == self.device
        if direct:  # straight into the destination
            p = bucket.pieces[0]
            self._bcast(_flat(out[p.name])[p.start : p.stop])
            return
        buf = self._buffer(bucket.dtype, bucket.numel)
        self._bcast(buf)
        for p in bucket.pieces:
            _flat(out[p.name])[p.start : p.stop].copy_(buf[p.offset : p.offset + p.stop - p.start])

    def _check(
        self, manifest: Manifest, out: Mapping[str, torch.Tensor]
    ) -> WeightTransportError | None:
        if not (self.verify and manifest.checksums):
            return None
        views = [_raw_bytes(out[e.name]) for e in manifest.tensors]
        try:
            _verify(manifest, views, f"broadcast rank {self.rank}")
        except WeightTransportError as exc:
            return exc
        return None


def _mismatch(manifest: Manifest, into: Mapping[str, torch.Tensor]) -> str | None:
    """Why `into` cannot hold the manifest's tensors in place, or None."""
    for e in manifest.tensors:
        t = into.get(e.name)
        if t is None or _dtype_name(t.dtype) != e.dtype or tuple(t.shape) != e.shape:
            have = "missing" if t is None else f"{_dtype_name(t.dtype)} {tuple(t.shape)}"
            return f"tensor {e.name!r} is {e.dtype} {e.shape}, the receiver's is {have}"
        if not t.is_contiguous():
            return f"the receiver's tensor {e.name!r} is not contiguous"
    return None
