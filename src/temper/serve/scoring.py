"""Scoring given tokens through `/v1/completions`: ``echo=true`` with ``max_tokens = 0``.

OpenAI's legacy completions (and vLLM's server) answer such a request with the
prompt itself and, with ``logprobs``, the logprob of each prompt token given the
ones before it (the first token has none: ``null``). That is what a distillation
teacher behind `temper serve` is asked for (`temper.rollout.remote_teacher`): the
student's sampled ids go in as a token-id prompt, their logprobs under the
teacher come back. The engine scores (`Engine.score`, `abilities.scoring`); an
engine that cannot is a 400.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temper.engine.base import TokenScores
from temper.serve.protocol import APIError


def legacy_logprobs(
    tokens: list[str], token_logprobs: list[Any], top: list[Any] | None, start: int = 0
) -> dict[str, Any]:
    """Legacy completions ``logprobs``: tokens, token_logprobs, top_logprobs and each
    token's text offset (from ``start``)."""
    offsets, pos = [], start
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


async def echo_choices(
    server: Any, prompts: list[list[int]], top: int, want_logprobs: bool
) -> list[dict[str, Any]]:
    """One completion choice per prompt (``server``: the `OpenAIServer`, whose engine,
    tokenizer and token strings it uses): its text and, with ``want_logprobs``, its
    tokens' logprobs (``top`` alternatives each, as token string -> logprob)."""
    engine = server.engine
    if want_logprobs and not engine.abilities.scoring:
        raise APIError(
            f"echo=true with logprobs needs an engine that scores given tokens; this "
            f"server's {type(engine).__name__} does not",
            param="echo",
        )

    async def score(ids: list[int]) -> TokenScores | None:
        if not want_logprobs:
            return None
        if len(ids) < 2:  # the first token has no logprob
            return TokenScores([], [] if top else None)
        return await engine.score(ids, top)

    scores = await asyncio.gather(*[score(ids) for ids in prompts])
    choices = []
    for index, (ids, scored) in enumerate(zip(prompts, scores, strict=True)):
        tokens = server._token_strings(ids)
        logprobs = None
        if scored is not None:
            top_entries = None
            if scored.top_logprobs is not None:
                top_entries = [None] + [
                    dict(zip(server._token_strings(list(alts)), alts.values(), strict=True))
                    for alts in scored.top_logprobs
                ]
            logprobs = legacy_logprobs(tokens, [None, *scored.logprobs], top_entries)
        text = server.tokenizer.decode(ids, skip_special_tokens=False)
        choices.append(
            {"index": index, "text": text, "logprobs": logprobs, "finish_reason": "length"}
        )
    return choices
