"""Server-sent events for ``stream=true``, in OpenAI's chunk format.

The events are built from a finished `GenerationResult`: the engine protocol
returns whole samples, so the stream starts once the samples are done (the
client sees the same chunks as from vLLM, but the first one arrives with the
last). Each sampled token is one chunk carrying its piece of the text (and its
logprobs when asked); the pieces concatenate to exactly the text of the
non-streamed response, stop-string cut included (`text_pieces`). A chat reply
with parsed tool calls streams its content, then the calls, as one chunk each.
Every choice ends with a chunk holding its ``finish_reason``; with
``stream_options.include_usage`` a last chunk with no choices holds the usage;
``data: [DONE]`` closes the stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def text_pieces(tokenizer: Any, token_ids: list[int], text: str) -> list[str]:
    """One piece of ``text`` per token; the pieces join to exactly ``text``.

    Piece i ends where the decoded first i+1 tokens end, as long as that decode
    is a prefix of ``text`` (a token that ends mid-character, or text past a
    stop string, adds nothing until the text catches up); the last piece takes
    whatever is left.
    """
    pieces, sent = [], 0
    for i in range(len(token_ids)):
        upto = tokenizer.decode(token_ids[: i + 1], skip_special_tokens=True)
        end = min(len(upto), len(text))
        if end > sent and text.startswith(upto[:end]):
            pieces.append(text[sent:end])
            sent = end
        else:
            pieces.append("")
    if pieces:
        pieces[-1] += text[sent:]
    elif text:
        pieces.append(text)
    return pieces


@dataclass
class StreamChoice:
    """What one choice streams: a piece of text and a logprobs entry per token."""

    index: int
    pieces: list[str]
    logprobs: list[Any] | None  # per token, in the endpoint's logprobs format
    finish_reason: str
    tool_calls: list[dict[str, Any]] | None = None  # chat only
    content: str | None = None  # chat with tool calls: the text besides the calls


class Stream:
    """Chunk builder for one response: shared id, creation time and model."""

    def __init__(self, head: dict[str, Any], include_usage: bool) -> None:
        self.head = head
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict[str, Any]]) -> str:
        body = {**self.head, "choices": choices}
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def _end(self, usage: dict[str, Any]) -> Iterator[str]:
        if self.include_usage:
            yield sse({**self.head, "choices": [], "usage": usage})
        yield DONE

    def chat(self, choices: list[StreamChoice], usage: dict[str, Any]) -> Iterator[str]:
        for c in choices:
            yield self._chunk([_chat(c.index, {"role": "assistant", "content": ""})])
            if c.tool_calls is not None:
                if c.content:
                    yield self._chunk([_chat(c.index, {"content": c.content})])
                calls = [{"index": j, **call} for j, call in enumerate(c.tool_calls)]
                lp = {"content": c.logprobs, "refusal": None} if c.logprobs is not None else None
                yield self._chunk([_chat(c.index, {"tool_calls": calls}, lp)])
            else:
                for i, piece in enumerate(c.pieces):
                    if c.logprobs is None and not piece:
                        continue
                    lp = None
                    if c.logprobs is not None:
                        lp = {"content": [c.logprobs[i]], "refusal": None}
                    yield self._chunk([_chat(c.index, {"content": piece}, lp)])
            yield self._chunk([_chat(c.index, {}, finish=c.finish_reason)])
        yield from self._end(usage)

    def completions(self, choices: list[StreamChoice], usage: dict[str, Any]) -> Iterator[str]:
        for c in choices:
            for i, piece in enumerate(c.pieces):
                if c.logprobs is None and not piece:
                    continue
                lp = c.logprobs[i] if c.logprobs is not None else None
                yield self._chunk([_text(c.index, piece, lp)])
            yield self._chunk([_text(c.index, "", None, c.finish_reason)])
        yield from self._end(usage)


def _chat(
    index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _text(index: int, text: str, logprobs: Any, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
