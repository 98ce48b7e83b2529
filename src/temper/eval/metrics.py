"""Eval statistics: unbiased pass@k, Wilson intervals, majority vote (for maj@k)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb, sqrt


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, Codex).

    pass@k = 1 - C(n-c, k) / C(n, k): the probability that at least one of k
    samples drawn without replacement from the n is correct. Requires k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if k > n:
        raise ValueError(f"pass_at_k needs k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, always including n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    ks.append(n)
    return ks


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a success rate (Wilson 1927); z=1.96 gives 95%.

    center = (p + z²/2n) / (1 + z²/n), half-width = z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n),
    with p = successes / n. Unlike the normal approximation it stays inside
    [0, 1] and is sensible at p = 0 or 1. Returns (0, 1) when n = 0.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n, got {successes}, {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """The most common non-None answer (ties: the one seen first); None if all are None."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)
