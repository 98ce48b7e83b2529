"""Server-sent events for ``stream=true``, in OpenAI's chunk format.

Tokens are sent as the engine samples them when the engine can stream
(`EngineAbilities.stream`: the native engine reports each step's tokens);
other engines' samples are sent whole once done. Each chunk carries the new
piece of text (and the new tokens' logprobs when asked). `TextStream` decides
what text is safe to send: never a token that ends inside a multi-byte
character, never text that could be the start of a stop string, never text
past one. So the pieces concatenate to exactly the non-streamed text for the
same seed. With ``return_token_ids`` each chunk also carries its new token ids
(`TokenIds`). A chat request with tools is sent at the end instead (its content
without the tool-call blocks, then the calls as one ``delta.tool_calls``
chunk): which text is a call is known only once the sample is done.

Every choice ends with a chunk holding its ``finish_reason``; with
``stream_options.include_usage`` every chunk has ``usage: null`` and a last
chunk with no choices holds the usage; ``data: [DONE]`` closes the stream. An
engine failure after the first event is sent as one ``data: {"error": ...}``
event, then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from temper.engine.base import GenerationResult, TokenUpdate
from temper.serve.protocol import APIError

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class TextStream:
    """The text of one sample as its tokens arrive: what can be sent for good."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stops = stop_strings
        self.ids: list[int] = []
        self.sent = ""

    def push(self, ids: list[int]) -> str:
        """Add sampled ``ids``; return the new text that is safe to send."""
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for stop in self.stops:  # the text ends where a stop string starts
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
        end = len(text)
        while end > len(self.sent) and text[end - 1] == "\ufffd":
            end -= 1  # a token ending inside a character: wait for the rest
        end -= max(
            (k for s in self.stops for k in range(1, len(s)) if text[:end].endswith(s[:k])),
            default=0,
        )
        if end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) : end], text[:end]
        return piece

    def rest(self, final: str) -> str:
        """What is left of the final text (the non-streamed one) after what was sent."""
        if not final.startswith(self.sent):  # decoding was not prefix-stable: should not happen
            log.warning("streamed text %r is not a prefix of the final text", self.sent[-40:])
            return final[len(self.sent) :]
        return final[len(self.sent) :]


async def whole(engine: Any, ids: list[int], params: Any) -> AsyncIterator[TokenUpdate]:
    """A non-streaming engine's samples as one final update."""
    yield TokenUpdate(result=await engine.generate(ids, params))


async def merged(
    streams: list[AsyncIterator[TokenUpdate]],
) -> AsyncIterator[tuple[int, TokenUpdate]]:
    """Updates of several streams as they come, tagged with the stream's index.
    Closing this iterator closes (so cancels) every stream."""
    queue: asyncio.Queue[tuple[int, TokenUpdate | BaseException | None]] = asyncio.Queue()

    async def pump(j: int, stream: AsyncIterator[TokenUpdate]) -> None:
        try:
            async for update in stream:
                queue.put_nowait((j, update))
            queue.put_nowait((j, None))
        except BaseException as exc:  # handed to the consumer, cancellation included
            queue.put_nowait((j, exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    tasks = [asyncio.ensure_future(pump(j, s)) for j, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            j, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield j, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Chunks:
    """Chunk envelopes for one response: shared id, object, creation time, model."""

    def __init__(self, head: dict[str, Any], include_usage: bool) -> None:
        self.head = head
        self.include_usage = include_usage

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {**self.head, "choices": choices, **extra}
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def end(self, results: list[GenerationResult]) -> list[str]:
        events = []
        if self.include_usage:
            prompt = sum(len(r.prompt_token_ids) for r in results)
            completion = sum(len(s.token_ids) for r in results for s in r.samples)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            events.append(sse({**self.head, "choices": [], "usage": usage}))
        return [*events, DONE]


def chat_choice(
    index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def text_choice(index: int, text: str, logprobs: Any, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


class TokenIds:
    """vLLM's ``return_token_ids`` fields for streamed choices: each chunk of a choice
    carries the ids sampled since its last chunk (``token_ids``), its first chunk the
    prompt's ids too (completions: ``prompt_token_ids`` on the choice; chat sends
    them on the role chunk instead), and its finish chunk the ``stop_reason``."""

    def __init__(self, prompts: list[list[int]] | None, per_prompt: int) -> None:
        self.on = prompts is not None
        self.prompts = prompts or []
        self.per_prompt = per_prompt
        self.prompt_sent: set[int] = set()
        self.sent: dict[int, int] = {}  # choice -> how many of its ids were sent

    def wants_chunk(self, ids: list[int]) -> bool:
        """Whether new ``ids`` need a chunk even when there is no text to send."""
        return self.on and bool(ids)

    def add(
        self,
        choice: dict[str, Any],
        c: int,
        ids: list[int],
        *,
        prompt: bool = False,
        stop_reason: Any = None,
        finish: bool = False,
    ) -> dict[str, Any]:
        """``choice`` (choice ``c``) with the ids of ``ids`` not sent yet (``ids``
        being all its ids so far); with ``prompt``, the prompt ids on its first chunk."""
        if not self.on:
            return choice
        if prompt and c not in self.prompt_sent:
            self.prompt_sent.add(c)
            choice["prompt_token_ids"] = self.prompts[c // self.per_prompt]
        done = self.sent.get(c, 0)
        choice["token_ids"] = list(ids[done:])
        self.sent[c] = max(done, len(ids))
        if finish:
            choice["stop_reason"] = stop_reason
        return choice


async def chat_events(
    server: Any,
    updates: AsyncIterator[tuple[int, TokenUpdate]],
    params: Any,
    parse_tools: bool,
    want_logprobs: bool,
    chunks: Chunks,
    prompt_ids: list[int] | None = None,
) -> AsyncIterator[str]:
    """The events of a streamed chat completion (``server``: the `OpenAIServer`).
    With ``prompt_ids`` (``return_token_ids``), the role chunks carry them as
    ``prompt_token_ids`` and every later chunk its choice's new ``token_ids``."""
    texts = [TextStream(server.tokenizer, params.stop_strings) for _ in range(params.n)]
    sent = [0] * params.n  # tokens whose logprobs were sent, per choice
    drawn: list[list[int]] = [[] for _ in range(params.n)]  # ids streamed so far
    ids = TokenIds(None if prompt_ids is None else [prompt_ids], params.n)
    head = {} if prompt_ids is None else {"prompt_token_ids": prompt_ids}
    result: GenerationResult | None = None
    try:
        for i in range(params.n):
            yield chunks.chunk([chat_choice(i, {"role": "assistant", "content": ""})], **head)
        async for _, update in updates:
            if update.result is not None:
                result = update.result
            elif not parse_tools:  # with tools, the choice is sent whole at the end
                i = update.sample
                piece = texts[i].push(update.token_ids)
                lp = server.chat_logprobs(update, 0) if want_logprobs else None
                sent[i] += len(update.token_ids)
                drawn[i] += update.token_ids
                if piece or lp or ids.wants_chunk(update.token_ids):
                    choice = chat_choice(i, {"content": piece}, lp)
                    yield chunks.chunk([ids.add(choice, i, drawn[i])])
        assert result is not None
        for i, sample in enumerate(result.samples):
            message, finish = server._message(sample, parse_tools)
            rest = TokenUpdate(i, sample.token_ids, sample.logprobs, sample.top_logprobs)
            lp = server.chat_logprobs(rest, sent[i]) if want_logprobs else None
            if "tool_calls" in message:
                if message["content"] or lp:
                    choice = chat_choice(i, {"content": message["content"] or ""}, lp)
                    yield chunks.chunk([ids.add(choice, i, sample.token_ids)])
                calls = [{"index": j, **call} for j, call in enumerate(message["tool_calls"])]
                choice = chat_choice(i, {"tool_calls": calls})
                yield chunks.chunk([ids.add(choice, i, sample.token_ids)])
            else:
                piece = texts[i].rest(server._text(sample))
                if piece or lp:
                    choice = chat_choice(i, {"content": piece}, lp)
                    yield chunks.chunk([ids.add(choice, i, sample.token_ids)])
            choice = chat_choice(i, {}, finish=finish)
            end = ids.add(choice, i, sample.token_ids, stop_reason=sample.stop_reason, finish=True)
            yield chunks.chunk([end])
        for event in chunks.end([result]):
            yield event
    except Exception as exc:  # the response has begun: report in the stream
        yield error_event(exc)
        yield DONE
    finally:
        await updates.aclose()  # type: ignore[attr-defined]


async def completion_events(
    server: Any,
    updates: AsyncIterator[tuple[int, TokenUpdate]],
    params: list[Any],
    want_logprobs: bool,
    chunks: Chunks,
    prompt_ids: list[list[int]] | None = None,
) -> AsyncIterator[str]:
    """The events of a streamed text completion: choice ``j * n + i`` is sample i
    of prompt j. With ``prompt_ids`` (``return_token_ids``), each choice's first
    chunk carries its prompt's ``prompt_token_ids`` and every chunk its new
    ``token_ids``."""
    n = params[0].n
    texts = [TextStream(server.tokenizer, p.stop_strings) for p in params for _ in range(n)]
    sent = [0] * len(texts)
    offsets = [0] * len(texts)  # text_offset of the next token, per choice
    drawn: list[list[int]] = [[] for _ in texts]  # ids streamed so far, per choice
    ids = TokenIds(prompt_ids, n)
    results: dict[int, GenerationResult] = {}
    try:
        async for j, update in updates:
            if update.result is not None:
                results[j] = update.result
                continue
            c = j * n + update.sample
            piece = texts[c].push(update.token_ids)
            lp = None
            if want_logprobs:
                lp, offsets[c] = server.completion_logprobs(update, 0, offsets[c])
            sent[c] += len(update.token_ids)
            drawn[c] += update.token_ids
            if piece or lp or ids.wants_chunk(update.token_ids):
                choice = text_choice(c, piece, lp)
                yield chunks.chunk([ids.add(choice, c, drawn[c], prompt=True)])
        ordered = [results[j] for j in range(len(params))]
        for j, result in enumerate(ordered):
            for i, sample in enumerate(result.samples):
                c = j * n + i
                rest = TokenUpdate(i, sample.token_ids, sample.logprobs, sample.top_logprobs)
                lp = None
                if want_logprobs:
                    lp, offsets[c] = server.completion_logprobs(rest, sent[c], offsets[c])
                piece = texts[c].rest(server._text(sample))
                if piece or lp or ids.wants_chunk(sample.token_ids[sent[c] :]):
                    choice = text_choice(c, piece, lp)
                    yield chunks.chunk([ids.add(choice, c, sample.token_ids, prompt=True)])
                choice = text_choice(c, "", None, sample.finish_reason)
                end = ids.add(
                    choice,
                    c,
                    sample.token_ids,
                    prompt=True,
                    stop_reason=sample.stop_reason,
                    finish=True,
                )
                yield chunks.chunk([end])
        for event in chunks.end(ordered):
            yield event
    except Exception as exc:
        yield error_event(exc)
        yield DONE
    finally:
        await updates.aclose()  # type: ignore[attr-defined]


def error_event(exc: Exception) -> str:
    if isinstance(exc, APIError):
        return sse(exc.body())
    log.error("streamed request failed", exc_info=exc)
    message = f"internal server error: {type(exc).__name__}: {exc}"
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})
