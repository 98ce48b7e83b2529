"""Small C kernels for the native engine on CPU, compiled on first use.

The decode step of a small model on CPU is dominated by many small PyTorch ops,
not by arithmetic. `decode_attention` fuses one layer's decode attention (the
cache write of the new key/value, the scaled dot products, the softmax and the
weighted sum of values) into one pass over each row's keys and values; see
``kernels/decode_attention.c``.

The C source is compiled with the system C compiler (``$CC``, else ``cc`` or
``gcc``) into ``$TEMPER_CACHE_DIR/kernels`` (default ``~/.cache/temper``), keyed
by a hash of the source, the flags, the compiler and the CPU, so it is built
once per machine. It uses OpenMP through the ``libgomp`` that PyTorch has
already loaded, so it shares PyTorch's threads. Without a compiler, or if the
build or load fails, `decode_attention` returns None (with one warning) and the
engine uses its PyTorch path, which gives the same results up to float
rounding. ``TEMPER_CPU_KERNELS=0`` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "decode_attention.c"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}

#: ``(qkv, kv_layer, positions, out, heads, kv_heads, head_dim, scale)``; see `decode_attention`.
DecodeAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, float], None
]


def cache_dir() -> Path:
    root = os.environ.get("TEMPER_CACHE_DIR") or Path.home() / ".cache" / "temper"
    return Path(root) / "kernels"


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU model and its flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(keep)))


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str) -> Path:
    """Compile `SOURCE` (or reuse an earlier build); returns the shared library's path."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_id()]).encode()
    ).hexdigest()[:16]
    out = cache_dir() / f"decode_attention-{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builders never see a partial file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [compiler, *FLAGS, "-o", tmp, str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _library() -> ctypes.CDLL | None:
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        lib = None
        if os.environ.get("TEMPER_CPU_KERNELS", "1") != "0":
            compiler = _compiler()
            try:
                if compiler is None:
                    raise RuntimeError("no C compiler found (set CC, or install gcc)")
                lib = ctypes.CDLL(str(_build(compiler)))
                fn = lib.temper_decode_attention
                fn.restype = None
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                fn.argtypes = [
                    ptr,
                    i64,
                    ptr,
                    ptr,
                    i64,
                    i64,
                    i64,
                    i64,
                    i64,
                    i64,
                    ctypes.c_float,
                    ptr,
                ]
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as err:
                log.warning("CPU decode kernels unavailable (%s); using the PyTorch path", err)
                lib = None
        _loaded["lib"] = lib
        return lib


def decode_attention() -> DecodeAttention | None:
    """The fused decode-attention kernel, or None where it cannot be built or loaded.

    The returned function takes the float32 CPU tensors ``qkv [B, H + 2*Hk, D]``
    (rows contiguous in their last two dims), ``kv_layer [2, R, Hk, P, D]``
    (contiguous), ``positions [B]`` (int64) and ``out [B, H*D]`` (contiguous),
    then the head counts, head size and softmax scale. It writes each row's
    new key/value at its position in ``kv_layer`` and its attention output to
    ``out``. Shapes are not checked here; `LlamaFamilyModel.decode` owns them.
    """
    lib = _library()
    if lib is None:
        return None
    fn = lib.temper_decode_attention

    def run(
        qkv: torch.Tensor,
        kv_layer: torch.Tensor,
        positions: torch.Tensor,
        out: torch.Tensor,
        heads: int,
        kv_heads: int,
        head_dim: int,
        scale: float,
    ) -> None:
        fn(
            qkv.data_ptr(),
            qkv.stride(0),
            kv_layer.data_ptr(),
            positions.data_ptr(),
            qkv.shape[0],
            heads,
            kv_heads,
            head_dim,
            kv_layer.shape[1],
            kv_layer.shape[3],
            scale,
            out.data_ptr(),
        )

    return run


def reset_for_tests() -> None:
    """Forget the loaded library so the next call builds or loads again."""
    with _lock:
        _loaded.clear()
