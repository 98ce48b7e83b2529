"""Batch-shape planning for the native engine (pure functions, no tensors).

`group_by_length` splits newly admitted prompts into prefill forwards of
similar length; `attention_chunks` splits the running rows into ranges whose
decode attention reads only up to each range's longest row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def group_by_length(lengths: list[int], overhead: int, budget: int) -> list[list[int]]:
    """Split prompt indices into prefill groups of similar length.

    Sorts the prompts by length and picks the contiguous split that minimises
    ``padded tokens + overhead * groups`` (``overhead`` is the rough cost of one
    more forward, in tokens), with each group's padded size at most ``budget``
    tokens (a longer prompt gets a group of its own). Dynamic programming over
    the sorted lengths, O(len(lengths) * group size).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [lengths[k] for k in order]
    n = len(sizes)
    best = [0] + [0] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        width = sizes[j - 1]
        best[j], cut[j] = best[j - 1] + overhead + width, j - 1
        i = j - 2
        while i >= 0 and width * (j - i) <= budget:
            cost = best[i] + overhead + width * (j - i)
            if cost < best[j]:
                best[j], cut[j] = cost, i
            i -= 1
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def attention_chunks(lengths: Sequence[int], overhead: int) -> list[tuple[int, int]]:
    """Split rows ``0..B-1`` into 1, 2, 4 or 8 equal ranges for decode attention.

    Each range reads the cache up to its own longest row, so when rows are
    grouped by length the split skips padding. Picks the split with the least
    ``sum(rows * longest) + overhead * (ranges - 1)``. Ranges are equal-sized,
    not optimal; rows are not reordered here.
    """
    b = len(lengths)
    best, best_cost = [(0, b)], b * max(lengths)
    k = 2
    while k <= 8 and b // k >= 4:
        bounds = [i * b // k for i in range(k + 1)]
        pairs = list(itertools.pairwise(bounds))
        cost = sum((r1 - r0) * max(lengths[r0:r1]) for r0, r1 in pairs) + (k - 1) * overhead
        if cost < best_cost:
            best, best_cost = pairs, cost
        k *= 2
    return best
