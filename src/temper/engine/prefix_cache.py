"""Keys/values of finished sequences, kept for requests that start the same way.

A multi-turn episode sends the engine ``prompt + response + tool output`` as
the next turn's prompt: everything but the tool output was already run
through the model in the previous turn. `PrefixCache` keeps a copy of each
finished sequence's keys/values (all layers, the positions whose keys are in
the slot cache: the prompt and every generated token but the last). A new
request looks for the entry sharing its longest common prefix, copies those
positions into its rows and runs only the rest of its prompt
(`LlamaFamilyModel.extend`). Any shared prefix of at least one block (16
tokens) counts, so it also covers partial sharing: the same system prompt or
few-shot block under different questions.

Entries hold keys/values computed by one weight version; the engine clears the
cache when its weights change (a weight update would make them stale) and
when it frees its memory for training. Capacity is a byte budget with
least-recently-used eviction. Everything here runs on the compute thread.

What it does not do: share blocks between entries (two entries with a common
prefix each hold a copy; a radix tree of blocks would store it once), or keep
entries on another device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PrefixEntry:
    """One finished sequence: its tokens and their keys/values ``[layers, kv_heads, T, D]``."""

    tokens: np.ndarray
    k: torch.Tensor
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class PrefixStats:
    """Counters: lookups, lookups that reused keys/values, tokens reused, entries evicted."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evicted: int = 0


class PrefixCache:
    """An LRU of `PrefixEntry` within ``max_bytes``, found by blocks of ``block`` tokens.

    Every entry is indexed by the chained hashes of its first 1, 2, ... full
    blocks, so a lookup costs one hash per block of the prompt, whatever the
    number of entries. The deepest block shared picks the entry; the shared
    length is then counted token by token (and checked from the start, so a
    hash collision cannot hand over the wrong keys). Reuse starts at one full
    block.
    """

    def __init__(self, max_bytes: int, block: int = 16) -> None:
        self.max_bytes = max_bytes
        self.block = max(1, block)
        self.stats = PrefixStats()
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._hashes: dict[int, list[int]] = {}  # entry id -> its block hashes
        self._index: dict[int, dict[int, None]] = {}  # block hash -> entry ids, newest last
        self._next_id = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _block_hashes(self, tokens: np.ndarray) -> list[int]:
        out, h, b = [], 0, self.block
        for end in range(b, len(tokens) + 1, b):
            h = hash((h, tokens[end - b : end].tobytes()))
            out.append(h)
        return out

    def add(self, tokens: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep ``k``/``v`` (owned copies) for ``tokens``, evicting old entries to fit."""
        entry = PrefixEntry(tokens, k, v)
        if entry.nbytes > self.max_bytes or len(tokens) < self.block:
            return
        while self._entries and self.nbytes + entry.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
            self.stats.evicted += 1
        entry_id = self._next_id
        self._next_id += 1
        self._entries[entry_id] = entry
        self._hashes[entry_id] = self._block_hashes(tokens)
        for h in self._hashes[entry_id]:
            self._index.setdefault(h, {})[entry_id] = None
        self.nbytes += entry.nbytes

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.nbytes -= entry.nbytes
        for h in self._hashes.pop(entry_id):
            ids = self._index[h]
            del ids[entry_id]
            if not ids:
                del self._index[h]

    def lookup(self, prompt: np.ndarray) -> tuple[PrefixEntry, int] | None:
        """The entry sharing the longest prefix with ``prompt`` and that length, or None.

        The shared length is at most ``len(prompt) - 1``: the prompt's last token
        must still run, to give the logits of the first sampled token.
        """
        self.stats.lookups += 1
        limit = len(prompt) - 1
        best_id = None
        for h in self._block_hashes(prompt[:limit]):
            ids = self._index.get(h)
            if not ids:
                break
            best_id = next(reversed(ids))
        if best_id is None:
            return None
        entry = self._entries[best_id]
        n = min(limit, len(entry.tokens))
        differ = np.flatnonzero(entry.tokens[:n] != prompt[:n])
        shared = int(differ[0]) if differ.size else n
        if shared < self.block:
            return None
        self._entries.move_to_end(best_id)
        self.stats.hits += 1
        self.stats.reused_tokens += shared
        return entry, shared

    def clear(self) -> None:
        self._entries.clear()
        self._hashes.clear()
        self._index.clear()
        self.nbytes = 0
