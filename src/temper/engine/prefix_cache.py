"""Keys/values of finished sequences, kept for requests that start the same way.

A multi-turn episode sends the engine ``prompt + response + tool output`` as
the next turn's prompt: everything but the tool output was already run
through the model in the previous turn. `PrefixCache` keeps a copy of each
finished sequence's keys/values (all layers, the positions whose keys are in
the slot cache: the prompt and every generated token but the last). A new
request looks for the entry sharing its longest common prefix, copies those
positions into its rows and runs only the rest of its prompt
(`LlamaFamilyModel.extend`). The match is token by token, so it also covers
partial sharing: the same system prompt or few-shot block under different
questions, or a group's prompt re-sent with a longer history.

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
    """Counters: lookups that reused at least ``min_tokens``, tokens reused, entries dropped."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evicted: int = 0


class PrefixCache:
    """An LRU of `PrefixEntry` within ``max_bytes``; ``min_tokens`` is the shortest reuse."""

    def __init__(self, max_bytes: int, min_tokens: int = 16) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self.stats = PrefixStats()
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._next_id = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, tokens: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep ``k``/``v`` (owned copies) for ``tokens``, evicting old entries to fit."""
        entry = PrefixEntry(tokens, k, v)
        if entry.nbytes > self.max_bytes or len(tokens) < self.min_tokens:
            return
        while self._entries and self.nbytes + entry.nbytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
            self.stats.evicted += 1
        self._entries[self._next_id] = entry
        self._next_id += 1
        self.nbytes += entry.nbytes

    def lookup(self, prompt: np.ndarray) -> tuple[PrefixEntry, int] | None:
        """The entry sharing the longest prefix with ``prompt`` and that length, or None.

        The shared length is at most ``len(prompt) - 1``: the prompt's last token
        must still run, to give the logits of the first sampled token.
        """
        self.stats.lookups += 1
        limit = len(prompt) - 1
        best_id, best_len = -1, 0
        for entry_id, entry in self._entries.items():
            n = min(limit, len(entry.tokens))
            if n <= best_len:
                continue
            differ = np.flatnonzero(entry.tokens[:n] != prompt[:n])
            shared = int(differ[0]) if differ.size else n
            if shared > best_len:
                best_id, best_len = entry_id, shared
        if best_len < self.min_tokens:
            return None
        self._entries.move_to_end(best_id)
        self.stats.hits += 1
        self.stats.reused_tokens += best_len
        return self._entries[best_id], best_len

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
