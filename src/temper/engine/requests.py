"""Request and sequence bookkeeping shared by the engines.

A `Request` is one `generate` call (one prompt, ``params.n`` samples); each
sample is a `Sequence`. `StopChecker` decides when a sequence is finished. This
module does no model compute and no scheduling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from temper.engine.base import (
    FinishReason,
    GenerationResult,
    SampleOutput,
    SamplingParams,
    TokenUpdate,
)
from temper.errors import PromptTooLongError, TemperError


def validate_prompt(
    prompt_token_ids: Seq[int], max_context: int, vocab_size: int | None
) -> list[int]:
    """Return the prompt as a list of ints, or raise a `TemperError` naming the problem."""
    prompt = [int(t) for t in prompt_token_ids]
    if not prompt:
        raise TemperError("prompt_token_ids is empty: the engine needs at least one prompt token")
    if len(prompt) >= max_context:
        raise PromptTooLongError(
            f"prompt has {len(prompt)} tokens but the engine context is {max_context} tokens "
            f"(prompt must be shorter than the context to leave room for generation)"
        )
    return _in_vocabulary(prompt, vocab_size, "prompt")


def _in_vocabulary(ids: list[int], vocab_size: int | None, what: str) -> list[int]:
    if vocab_size is not None:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise TemperError(
                f"{what} token id {bad[0]} is outside the model vocabulary [0, {vocab_size})"
            )
    return ids


def validate_scored(token_ids: Seq[int], max_context: int, vocab_size: int | None) -> list[int]:
    """`validate_prompt` for ids to score (`Engine.score`): up to the whole context,
    and at least two ids (the first has no logprob)."""
    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        raise TemperError(f"{len(ids)} token id(s) to score: scoring needs at least 2")
    if len(ids) > max_context:
        raise PromptTooLongError(
            f"{len(ids)} tokens to score but the engine context is {max_context} tokens"
        )
    return _in_vocabulary(ids, vocab_size, "scored")


def eos_token_ids(model: Any) -> frozenset[int]:
    """End-of-sequence ids from the model's generation_config, else its config."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        ids = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
        if ids:
            break
    return frozenset(ids)


@dataclass(eq=False)
class Sequence:
    """One sample in flight: its generated tokens so far and where it stands."""

    request: Request
    index: int
    key: int  # random-stream key (see temper.engine.sampling)
    length: int  # prompt + generated tokens
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    #: This sample's logits processors (penalties, grammar), run by the worker.
    processors: list[Any] = field(default_factory=list)
    #: Top-logprob alternatives per token (only with params.top_logprobs > 0).
    top: list[dict[int, float]] = field(default_factory=list)


@dataclass(eq=False)
class Request:
    """One `generate` call waiting for or undergoing generation."""

    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[GenerationResult]
    stop_ids: frozenset[int]
    outputs: list[SampleOutput | None] = field(default_factory=list)
    pending: int = 0
    #: Called with each `TokenUpdate` as tokens arrive (streaming requests only).
    listener: Callable[[TokenUpdate], None] | None = None
    #: The prompt's images in order, and where each one's token run sits (start, length).
    images: list[Any] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    #: What caches match this prompt by (`temper.engine.image_encoder.image_key`): the
    #: ids, with image tokens standing for their image. Set in `__post_init__` for text.
    key: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.outputs = [None] * self.params.n
        self.pending = self.params.n
        if self.key is None:
            self.key = np.asarray(self.prompt, dtype=np.int64)

    @property
    def aborted(self) -> bool:
        """True once the caller stopped waiting (cancelled) or the request failed."""
        return self.future.done()

    def finish(self, seq: Sequence, reason: FinishReason, stop_reason: int | str | None) -> None:
        """Record a finished sample; resolve the future when all n are done."""
        self.outputs[seq.index] = SampleOutput(
            token_ids=seq.tokens,
            logprobs=seq.logprobs,
            finish_reason=reason,
            policy_versions=seq.versions,
            stop_reason=stop_reason,
            top_logprobs=seq.top if self.params.top_logprobs else None,
        )
        self.pending -= 1
        if self.pending == 0 and not self.future.done():
            samples = [o for o in self.outputs if o is not None]
            self.future.set_result(GenerationResult(list(self.prompt), samples))


class StopChecker:
    """Decides whether a sequence stops after its newest token.

    Priority when several apply to the same token: stop token (including eos),
    then stop string, then the length limits (``max_new_tokens`` or the
    context). Stop strings are searched only in the decoded tail of the
    sequence (enough tokens to cover the longest stop string), and only for
    requests that have stop strings.
    """

    def __init__(self, tokenizer: Any | None, max_context: int) -> None:
        self.tokenizer = tokenizer
        self.max_context = max_context

    def check(self, seq: Sequence, token: int) -> tuple[FinishReason, int | str | None] | None:
        req = seq.request
        if token in req.stop_ids:
            return "stop", token
        params = req.params
        if params.stop_strings:
            hit = self.stop_string(seq.tokens, params.stop_strings)
            if hit is not None:
                return "stop", hit
        if len(seq.tokens) >= params.max_new_tokens or seq.length >= self.max_context:
            return "length", None
        return None

    def stop_string(self, tokens: list[int], stop_strings: Iterable[str]) -> str | None:
        """The first stop string found in the decoded tail of ``tokens``, if any."""
        strings = tuple(stop_strings)
        window = max(len(s) for s in strings) + 8
        text = self.tokenizer.decode(tokens[-window:], skip_special_tokens=False)
        for s in strings:
            if s in text:
                return s
        return None

    def cut(
        self, prompt_len: int, tokens: list[int], params: SamplingParams, stop_ids: Iterable[int]
    ) -> tuple[int, FinishReason, int | str | None]:
        """Where a finished raw row ends under these rules: (kept tokens, finish reason,
        stop reason). For engines that generate a whole row first (HF, vLLM)."""
        stops = set(stop_ids)
        for i, tok in enumerate(tokens):
            if tok in stops:
                return i + 1, "stop", tok
            if params.stop_strings:
                hit = self.stop_string(tokens[: i + 1], params.stop_strings)
                if hit is not None:
                    return i + 1, "stop", hit
            if i + 1 >= params.max_new_tokens or prompt_len + i + 1 >= self.max_context:
                return i + 1, "length", None
        # The engine ended the row for a reason these rules did not see (e.g. a stop
        # string across the prompt boundary).
        return len(tokens), "stop", None
