"""A slot-based KV cache for the native engine.

Each active sequence owns one *row* (slot) of the cache. Rows are kept dense:
the active sequences always occupy rows ``0 .. B-1``, so a decode step reads
``k[layer, :B, :, :T]`` as a view without gathering. When a sequence finishes,
the engine moves the last rows into the holes (`move_rows`).

The tensors start small and grow on demand up to ``max_slots`` rows and
``max_context`` positions, so a large ``max_slots`` does not reserve
``max_slots * max_context`` entries up front: rows double, positions grow to
the requested length rounded up to a multiple of `POSITION_QUANTUM` (the
engine requests, at admission, the longest prompt + max_new_tokens in flight,
so decoding never regrows it). Growing copies the cache once; only `release`
shrinks it.

Keys and values live in one tensor, so a decode step writes both with one
scatter per layer. On Linux the tensor is placed in transparent huge pages
(`zeros_in_huge_pages`): a decode step reads the keys and values of every row,
and with 4 KiB pages that walk misses the TLB on most pages.

Entries beyond a row's length hold stale values: the attention mask built by
the caller must hide them. This class does no masking and no attention.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys

import torch

#: Positions are allocated in multiples of this.
POSITION_QUANTUM = 32

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def zeros_in_huge_pages(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``torch.zeros(shape)``, backed by 2 MiB-aligned memory advised as huge pages.

    Only on Linux CPU tensors of at least one huge page; elsewhere, or when
    ``madvise`` fails, this is plain ``torch.zeros`` (the kernel may still
    decline huge pages; the tensor is correct either way).
    """
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or not sys.platform.startswith("linux") or nbytes < _HUGE_PAGE:
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = torch.empty(nbytes + _HUGE_PAGE, dtype=torch.uint8)
    offset = -raw.data_ptr() % _HUGE_PAGE
    length = nbytes // _HUGE_PAGE * _HUGE_PAGE
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(
            ctypes.c_void_p(raw.data_ptr() + offset), ctypes.c_size_t(length), _MADV_HUGEPAGE
        )
    # Advised before the first write, so zeroing faults the pages in as huge pages.
    return raw[offset : offset + nbytes].view(dtype).view(shape).zero_()


class SlotKVCache:
    """Keys and values of shape ``[layers, rows, kv_heads, positions, head_dim]``.

    ``k`` and ``v`` are views of one tensor ``kv`` of shape
    ``[layers, 2, rows, kv_heads, positions, head_dim]``.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        max_slots: int,
        max_context: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        initial_slots: int = 16,
        initial_positions: int = POSITION_QUANTUM,
    ) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_slots = max_slots
        self.max_context = max_context
        self.dtype = dtype
        self.device = torch.device(device)
        self._initial = (min(initial_slots, max_slots), min(initial_positions, max_context))
        self._set(self._empty(*self._initial))
        self._decode_base: tuple[tuple[int, int, int], torch.Tensor] | None = None

    def _empty(self, rows: int, positions: int) -> torch.Tensor:
        shape = (self.num_layers, 2, rows, self.num_kv_heads, positions, self.head_dim)
        return zeros_in_huge_pages(shape, self.dtype, self.device)

    def _set(self, kv: torch.Tensor) -> None:
        self.kv = kv
        self.k, self.v = kv[:, 0], kv[:, 1]

    @property
    def row_capacity(self) -> int:
        return self.k.shape[1]

    @property
    def position_capacity(self) -> int:
        return self.k.shape[3]

    def nbytes(self) -> int:
        """Bytes held by the key and value tensors."""
        return self.kv.numel() * self.kv.element_size()

    def ensure(self, rows: int, positions: int) -> None:
        """Grow so that ``rows`` rows of ``positions`` positions fit (see the module doc).

        Raises `ValueError` past ``max_slots`` or ``max_context``.
        """
        if rows > self.max_slots or positions > self.max_context:
            raise ValueError(
                f"KV cache request of {rows} rows x {positions} positions exceeds "
                f"{self.max_slots} x {self.max_context}"
            )
        cur_rows, cur_pos = self.row_capacity, self.position_capacity
        if rows <= cur_rows and positions <= cur_pos:
            return
        new_rows, new_pos = cur_rows, cur_pos
        while new_rows < rows:
            new_rows = min(2 * new_rows, self.max_slots)
        if new_pos < positions:
            quanta = -(-positions // POSITION_QUANTUM)
            new_pos = min(quanta * POSITION_QUANTUM, self.max_context)
        new = self._empty(new_rows, new_pos)
        new[:, :, :cur_rows, :, :cur_pos] = self.kv
        self._set(new)

    def reset(self) -> None:
        """Forget all rows. Keeps the allocation (stale entries are masked anyway)."""
        self.kv.zero_()

    def release(self) -> None:
        """Free the memory: back to the initial (small) allocation."""
        self._set(self._empty(*self._initial))

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy the first ``length`` positions of rows ``src`` into rows ``dst``.

        ``src`` and ``dst`` must be disjoint (the copy is one batched gather and
        scatter, so chained moves are not supported).
        """
        if src.numel() == 0:
            return
        self.kv[:, :, dst, :, :length] = self.kv[:, :, src, :, :length]

    def write_prefill(
        self,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        dst_rows: torch.Tensor,
        src_rows: torch.Tensor | None,
    ) -> None:
        """Write prompt keys/values ``[P, kv_heads, L, head_dim]`` at positions ``0..L-1``.

        Row ``dst_rows[j]`` receives prompt ``src_rows[j]`` (so one prefill can
        fill the n rows of its n samples). ``src_rows=None`` means prompt j goes
        to ``dst_rows[j]``.
        """
        length = k.shape[2]
        if src_rows is not None:
            k = k.index_select(0, src_rows)
            v = v.index_select(0, src_rows)
        self.k[layer, dst_rows, :, :length] = k
        self.v[layer, dst_rows, :, :length] = v

    def decode_index(self, positions: torch.Tensor) -> torch.Tensor:
        """Flat indices for `write_decode`: rows ``0..B-1`` at ``positions [B]``.

        Valid until the cache next grows; compute it once per decode step.
        """
        b, hk = positions.shape[0], self.num_kv_heads
        key = (b, self.row_capacity, self.position_capacity)
        if self._decode_base is None or self._decode_base[0] != key:
            # Entry j of row r: key head j (j < hk) or value head j - hk, at position 0.
            rows = torch.arange(b, device=positions.device).unsqueeze(1)
            j = torch.arange(2 * hk, device=positions.device)
            is_v, head = j // hk, j % hk
            planes = (is_v * self.row_capacity + rows) * hk + head
            self._decode_base = key, (planes * self.position_capacity).view(-1)
        return self._decode_base[1] + positions.repeat_interleave(2 * hk)

    def write_decode(self, layer: int, kv: torch.Tensor, index: torch.Tensor) -> None:
        """Write one new key and value per row at `decode_index` ``index``.

        ``kv`` is ``[B, 2 * kv_heads, head_dim]``: the key heads, then the value heads.
        """
        d = self.head_dim
        self.kv[layer].view(-1, d).index_copy_(0, index, kv.reshape(-1, d))

    def view(self, layer: int, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of rows ``0..rows-1``, positions ``0..length-1`` (views, no copy)."""
        return self.k[layer, :rows, :, :length], self.v[layer, :rows, :, :length]

    def view_rows(
        self, layer: int, rows: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``rows`` (any order), positions ``0..length-1`` (copies)."""
        return self.k[layer, rows, :, :length], self.v[layer, rows, :, :length]

    def read_row(self, row: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of row ``row``'s first ``length`` positions, all layers: ``[layers, Hk, T, D]``."""
        return self.k[:, row, :, :length].clone(), self.v[:, row, :, :length].clone()

    def write_rows(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[layers, Hk, T, D]`` into positions ``0..T-1`` of every row in ``rows``."""
        length = k.shape[2]
        self.k[:, rows, :, :length] = k.unsqueeze(1)
        self.v[:, rows, :, :length] = v.unsqueeze(1)
