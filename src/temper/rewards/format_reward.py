"""Format rewards: 1.0 when the completion has the required shape, else 0.0."""

from __future__ import annotations

import re

from temper.rewards.answers import find_last_boxed
from temper.rewards.base import RewardInput, RewardResult

#: A completion that ends with `\boxed{...}` (braces nested up to three deep),
#: optionally followed by whitespace.
BOXED_AT_END = r"\\boxed\{(?:[^{}]|\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\})*\}\s*\Z"


class FormatReward:
    """`match_score` when the regex `pattern` matches the completion, else `miss_score`.

    With `full_match=False` (default) the pattern may match anywhere
    (`re.search`); with `full_match=True` it must match the whole completion
    (`re.fullmatch`). `flags` defaults to `re.DOTALL`, so `.` also matches
    newlines. The default pattern accepts completions that end with
    `\\boxed{...}` plus optional whitespace.
    """

    def __init__(
        self,
        pattern: str = BOXED_AT_END,
        *,
        full_match: bool = False,
        flags: int = re.DOTALL,
        name: str = "format",
        match_score: float = 1.0,
        miss_score: float = 0.0,
    ) -> None:
        self.name = name
        self.regex = re.compile(pattern, flags)
        self.full_match = full_match
        self.match_score = match_score
        self.miss_score = miss_score

    def matches(self, text: str) -> bool:
        """Whether `text` has the required format."""
        if self.full_match:
            return self.regex.fullmatch(text) is not None
        return self.regex.search(text) is not None

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        """Score each completion by whether it matches."""
        out = []
        for item in inputs:
            value = self.match_score if self.matches(item.completion_text) else self.miss_score
            out.append(RewardResult(score=value, components={self.name: value}))
        return out


class BoxedFormatReward(FormatReward):
    """1.0 when the completion ends with a `\\boxed{...}` (any brace depth), else 0.0.

    Like `FormatReward()` with its default pattern, but braces are matched by
    counting, so any nesting depth is accepted. Only whitespace may follow.
    """

    def __init__(
        self, *, name: str = "boxed_format", match_score: float = 1.0, miss_score: float = 0.0
    ) -> None:
        super().__init__(name=name, match_score=match_score, miss_score=miss_score)

    def matches(self, text: str) -> bool:
        found = find_last_boxed(text)
        if found is None:
            return False
        _, start, end = found
        return text.startswith("\\boxed", start) and not text[end:].strip()
