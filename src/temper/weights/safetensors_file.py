"""`SafetensorsFileTransport`: weight versions as safetensors files, for external engines.

Each version is `<root>/v{version}/model.safetensors` plus `manifest.json` (the
`Manifest` of `temper.weights.transport`, with the byte offset of each tensor's
data in the file), written into a temporary directory and renamed into place,
so a reader sees a version whole or not at all. Engines that load weights from
disk (vLLM, SGLang) read the file; Temper's readers also check the checksums.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from temper.weights.transport import (
    CHUNK_BYTES,
    Manifest,
    TensorEntry,
    WeightTransportError,
    _check_version,
    _layout,
    _verify,
)

_ST_DIR = re.compile(r"^v(\d+)$")


class SafetensorsFileTransport:
    """`<root>/v{version}/model.safetensors` + `manifest.json`, for external engines.

    Each version is written into a hidden temporary directory and renamed to
    `v{version}` (atomic on one filesystem), so an engine that lists `root` sees
    whole versions only. The manifest's offsets are absolute byte offsets of each
    tensor's data in `model.safetensors`. Keeps the newest `keep` versions.
    """

    FILE = "model.safetensors"
    MANIFEST = "manifest.json"

    def __init__(self, root: str | os.PathLike[str], *, verify: bool = True, keep: int = 2) -> None:
        self.root = Path(root)
        self.verify, self.keep = verify, max(1, keep)
        self.root.mkdir(parents=True, exist_ok=True)

    def versions(self) -> list[int]:
        out = []
        for p in os.listdir(self.root):
            m = _ST_DIR.match(p)
            if m and (self.root / p / self.MANIFEST).exists():
                out.append(int(m.group(1)))
        return sorted(out)

    def latest_version(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def path(self, version: int) -> Path:
        """The directory of `version` (what an external engine loads)."""
        return self.root / f"v{version}"

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        from safetensors.torch import save_file

        _check_version(version, self.latest_version())
        tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
        manifest, _ = _layout(tensors, version, CHUNK_BYTES)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".v{version}."))
        try:
            save_file(tensors, str(tmp / self.FILE), metadata={"version": str(version)})
            offsets, size = _safetensors_offsets(tmp / self.FILE)
            entries = tuple(
                TensorEntry(e.name, e.dtype, e.shape, offsets[e.name], e.nbytes, e.crc32)
                for e in manifest.tensors
            )
            manifest = Manifest(version, size, manifest.chunk_bytes, entries)
            (tmp / self.MANIFEST).write_text(manifest.to_json())
            os.rename(tmp, self.path(version))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in self.versions()[: -self.keep]:
            (self.path(old) / self.MANIFEST).unlink(missing_ok=True)
            shutil.rmtree(self.path(old), ignore_errors=True)

    def receive(self, version: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
        if version is None:
            version = self.latest_version()
            if version is None:
                raise WeightTransportError(f"safetensors dir {self.root}: nothing published yet")
        d = self.path(version)
        try:
            manifest = Manifest.from_json((d / self.MANIFEST).read_text())
            data = (d / self.FILE).read_bytes()
        except FileNotFoundError:
            raise WeightTransportError(
                f"safetensors dir {self.root}: version {version} is not published "
                f"(have {self.versions()})"
            ) from None
        where = str(d / self.FILE)
        if len(data) != manifest.total_bytes:
            raise WeightTransportError(
                f"{where}: {len(data)} bytes, manifest says {manifest.total_bytes}"
            )
        mv = memoryview(data)
        if self.verify:
            _verify(manifest, [mv[e.offset : e.offset + e.nbytes] for e in manifest.tensors], where)
        from safetensors.torch import load

        try:
            loaded = load(data)
        except Exception as exc:
            raise WeightTransportError(f"{where}: not a valid safetensors file: {exc}") from exc
        return {e.name: loaded[e.name] for e in manifest.tensors}, version


def _safetensors_offsets(path: Path) -> tuple[dict[str, int], int]:
    """Absolute byte offsets of each tensor's data in a safetensors file, and its size."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        size = os.fstat(f.fileno()).st_size
    base = 8 + n
    return {k: base + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}, size
