"""Reward shaping and reward-hacking defenses.

- `OverlongPenalty`: DAPO's soft overlong punishment (Yu et al. 2025), a
  length-dependent penalty in [-1, 0] added as a reward component.
- `GatedReward`: wraps a (summed) reward and zeroes a sample's total reward when
  a detector flags its completion (`RepetitionDetector`: looping text;
  `GibberishDetector`: garbage characters or no diversity). Every detector's
  verdict is logged in the result's components as `"hack/<kind>"` (1.0 when
  detected, 0.0 otherwise), so a gated sample is never zeroed silently.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from temper.errors import ConfigError
from temper.rewards.base import Reward, RewardDefaults, RewardInput, RewardResult


def whitespace_tokens(text: str) -> int:
    """Number of whitespace-separated tokens in `text` (the fallback length unit)."""
    return len(text.split())


class OverlongPenalty(RewardDefaults):
    """DAPO's soft overlong punishment on the completion's length |y|.

    With `max_tokens` = L_max and `cache_tokens` = L_cache:

        0                                 if |y| <= L_max - L_cache
        (L_max - L_cache - |y|) / L_cache if L_max - L_cache < |y| <= L_max
        -1                                if |y| > L_max

    The length is, in order of preference: `length_fn(text)`; the number of
    sampled tokens (`RewardInput.completion_ids`, set by single-turn rollouts);
    `len(tokenizer.encode(text))` (special tokens are not added when the
    tokenizer accepts `add_special_tokens`); else the number of
    whitespace-separated tokens (`whitespace_tokens`), which undercounts
    subword tokens (about 1.3 BPE tokens per English word), so set
    `max_tokens` in those units. Runs built from a config pass the model's
    tokenizer.
    """

    def __init__(
        self,
        max_tokens: int,
        cache_tokens: int,
        *,
        tokenizer: Any = None,
        length_fn: Callable[[str], int] | None = None,
        name: str = "overlong",
    ) -> None:
        if cache_tokens < 1 or max_tokens < cache_tokens:
            raise ConfigError(
                f"OverlongPenalty needs 1 <= cache_tokens <= max_tokens, got "
                f"cache_tokens={cache_tokens}, max_tokens={max_tokens}"
            )
        self.max_tokens = max_tokens
        self.cache_tokens = cache_tokens
        self.tokenizer = tokenizer
        self.length_fn = length_fn
        self.name = name

    def length(self, text: str) -> int:
        """The completion's length in the configured unit (see the class docstring)."""
        if self.length_fn is not None:
            return self.length_fn(text)
        if self.tokenizer is not None:
            try:
                return len(self.tokenizer.encode(text, add_special_tokens=False))
            except TypeError:
                return len(self.tokenizer.encode(text))
        return whitespace_tokens(text)

    def penalty(self, length: int) -> float:
        """The penalty for a completion of `length` tokens, in [-1, 0]."""
        soft_start = self.max_tokens - self.cache_tokens
        if length <= soft_start:
            return 0.0
        if length <= self.max_tokens:
            return (soft_start - length) / self.cache_tokens
        return -1.0

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        out = []
        for item in inputs:
            if self.length_fn is None and item.completion_ids is not None:
                length = len(item.completion_ids)
            else:
                length = self.length(item.completion_text)
            value = self.penalty(length)
            out.append(RewardResult(score=value, components={self.name: value}))
        return out


class Detector(Protocol):
    """Flags a completion as a reward hack of a given `kind`."""

    kind: str

    def detect(self, text: str) -> bool: ...


class RepetitionDetector:
    """Flags looping text: the share of repeated n-grams exceeds `threshold`.

    Tokens are whitespace-separated words. With T n-grams of which U are
    distinct, the repeated share is 1 - U / T (0 for text without repeats,
    near 1 for a loop). Texts with fewer than `min_ngrams` n-grams are never
    flagged (too short to judge).
    """

    kind = "repetition"

    def __init__(self, n: int = 4, threshold: float = 0.5, min_ngrams: int = 20) -> None:
        if n < 1 or not 0.0 < threshold < 1.0 or min_ngrams < 1:
            raise ConfigError(
                f"RepetitionDetector needs n >= 1, 0 < threshold < 1, min_ngrams >= 1; got "
                f"n={n}, threshold={threshold}, min_ngrams={min_ngrams}"
            )
        self.n = n
        self.threshold = threshold
        self.min_ngrams = min_ngrams

    def repeated_share(self, text: str) -> float:
        """1 - distinct/total over the text's word n-grams (0.0 when there are none)."""
        words = text.split()
        grams = [tuple(words[i : i + self.n]) for i in range(len(words) - self.n + 1)]
        if not grams:
            return 0.0
        return 1.0 - len(set(grams)) / len(grams)

    def detect(self, text: str) -> bool:
        words = len(text.split())
        if words - self.n + 1 < self.min_ngrams:
            return False
        return self.repeated_share(text) > self.threshold


def _is_garbage_char(char: str) -> bool:
    return char == "\ufffd" or not (char.isprintable() or char.isspace())


class GibberishDetector:
    """Flags garbage text. Any one of these triggers it:

    - the share of non-printable (control, unassigned, private-use, surrogate)
      or U+FFFD replacement characters exceeds `threshold`;
    - the text has at least `min_chars` non-whitespace characters and at most
      `min_distinct_chars` distinct ones (e.g. "ababab..."), or a single
      character makes up more than `max_char_share` of them (e.g. "!!!!!...");
    - it has at least `min_tokens` whitespace tokens and a single token makes
      up more than `max_token_share` of them (e.g. "the the the ...").
    """

    kind = "gibberish"

    def __init__(
        self,
        threshold: float = 0.1,
        *,
        min_chars: int = 40,
        min_distinct_chars: int = 3,
        max_char_share: float = 0.5,
        min_tokens: int = 10,
        max_token_share: float = 0.5,
    ) -> None:
        shares = (threshold, max_char_share, max_token_share)
        if not all(0.0 < share < 1.0 for share in shares):
            raise ConfigError(
                "GibberishDetector needs threshold, max_char_share and max_token_share in "
                f"(0, 1); got {shares}"
            )
        self.threshold = threshold
        self.min_chars = min_chars
        self.min_distinct_chars = min_distinct_chars
        self.max_char_share = max_char_share
        self.min_tokens = min_tokens
        self.max_token_share = max_token_share

    def detect(self, text: str) -> bool:
        if text and sum(map(_is_garbage_char, text)) / len(text) > self.threshold:
            return True
        visible = [c for c in text if not c.isspace()]
        if len(visible) >= self.min_chars:
            if len(set(visible)) <= self.min_distinct_chars:
                return True
            if max(Counter(visible).values()) / len(visible) > self.max_char_share:
                return True
        tokens = text.split()
        return (
            len(tokens) >= self.min_tokens
            and max(Counter(tokens).values()) / len(tokens) > self.max_token_share
        )


class GatedReward:
    """`inner`'s reward, zeroed on samples that any detector flags.

    A flagged sample's score becomes `min(inner score, gated_score)` (default
    0.0): the reward is zeroed, and a negative total (e.g. an overlong penalty)
    is kept, so a gate never raises a reward. Its `correct` is kept as the
    inner reward judged it. Every result's components are the inner components
    plus `"hack/<kind>"` per detector (1.0 flagged, 0.0 not). A sample whose
    inner reward failed (`error` set) or is NaN ("drop") passes through with
    only the detection logged.
    """

    def __init__(
        self,
        inner: Reward,
        detectors: Sequence[Detector],
        *,
        gated_score: float = 0.0,
        name: str | None = None,
    ) -> None:
        kinds = [d.kind for d in detectors]
        if len(set(kinds)) != len(kinds):
            raise ConfigError(f"GatedReward: detector kinds must be unique, got {kinds}")
        self.inner = inner
        self.detectors = list(detectors)
        self.gated_score = gated_score
        self.name = name or inner.name

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        results = await self.inner.score(inputs)
        if len(results) != len(inputs):
            raise RuntimeError(
                f"reward {self.inner.name!r} returned {len(results)} results for {len(inputs)} inputs"
            )
        return [self._gate(item, result) for item, result in zip(inputs, results, strict=True)]

    def _gate(self, item: RewardInput, result: RewardResult) -> RewardResult:
        flags = {f"hack/{d.kind}": float(d.detect(item.completion_text)) for d in self.detectors}
        score = result.score
        if any(flags.values()) and result.error is None and not math.isnan(score):
            score = min(score, self.gated_score)
        return RewardResult(
            score=score,
            components={**result.components, **flags},
            error=result.error,
            correct=result.correct,
            traceback=result.traceback,
        )

    def close(self) -> None:
        """Close the inner reward."""
        self.inner.close()

    def __enter__(self) -> GatedReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
