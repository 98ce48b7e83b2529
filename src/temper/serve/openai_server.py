"""An OpenAI-compatible HTTP server in front of any Temper engine.

`create_app(engine, tokenizer)` builds a FastAPI app with `POST
/v1/chat/completions`, `POST /v1/completions`, `GET /v1/models` and `GET
/health`. A chat request is rendered once with the tokenizer's chat template
(tools included) and tokenised; the engine gets those ids (token-in) and its
sampled ids are decoded without special tokens (token-out). Tool calls in the
output are parsed with `temper.envs.tools.parse_tool_calls`. With
``return_token_ids`` (vLLM's extension, vLLM's field names) responses carry
those very prompt ids and sampled ids, and a completions ``prompt`` may be
token ids, so an outside harness stays token-exact.

Running it (background thread, `temper serve`) is in `temper.serve.runner`.

Also served: ``stream=true`` (`temper.serve.streaming`), top-k logprob
alternatives, presence/frequency penalties, and grammar-constrained output
(`temper.serve.grammar`) for ``response_format`` json_object / json_schema and
a forced ``tool_choice``. Not supported: logit bias, authentication (any
api_key is accepted).

Image content parts (a vision-language model) are data URLs; a path or
``file:`` URL is a 400 unless the server was given an allowed image folder
(``image_dir``, ``temper serve --allowed-image-dir``), and then only a regular
file inside it is read, off the event loop
(`temper.vision.images.UntrustedImages`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from temper.engine.base import (
    Engine,
    GenerationResult,
    SampleOutput,
    SamplingParams,
    StreamingEngine,
    TokenUpdate,
)
from temper.engine.structured import json_output, tool_call_output
from temper.errors import PromptTooLongError, TemperError
from temper.models.loader import longest_token_chars
from temper.models.tool_calls import parse_tool_calls, tool_call_blocks
from temper.serve import protocol as P
from temper.serve.grammar import Grammars
from temper.serve.limits import CLOSE, BodyError, HTTPLimits, read_body
from temper.serve.protocol import APIError
from temper.serve.scoring import echo_choices, legacy_logprobs
from temper.serve.streaming import Chunks, chat_events, completion_events, merged, whole
from temper.vision.images import Image, ImageError, UntrustedImages
from temper.vision.prompting import PromptImages

log = logging.getLogger(__name__)


class OpenAIServer:
    """The request handlers: validation, rendering, generation, response building."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        model_name: str,
        vision: Any | None = None,
        image_dir: Path | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        # Image content parts are taken when the model has an image processor and
        # the engine takes images (`temper.vision`); None refuses them.
        takes_images = vision is not None and engine.abilities.images
        self.images = PromptImages(vision if takes_images else None)
        self.untrusted = UntrustedImages(image_dir) if takes_images else None
        self.model_name = model_name
        self.created = int(time.time())
        # A text longer than this has at least max_context tokens: refused untokenized.
        self.max_chars = engine.max_context * longest_token_chars(tokenizer)
        self.grammars = Grammars(tokenizer)

    # ------------------------------------------------------------------ helpers
    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(
                f"model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                status=404,
                code="model_not_found",
            )

    def _encode(self, text: str, special: bool, param: str) -> list[int]:
        """Token ids of ``text``; a text too long for the context is refused before
        tokenizing, so a huge prompt costs neither the time nor the memory."""
        if len(text) > self.max_chars:
            raise APIError(
                f"{param} is {len(text)} characters, more than the model context of "
                f"{self.engine.max_context} tokens can hold (at most {self.max_chars})",
                param=param,
                code="context_length_exceeded",
            )
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _check_ids(self, ids: list[int], param: str) -> list[int]:
        """Token ids from the client: each must be in the tokenizer's vocabulary; the
        error names the element (``prompt[3]``) and its value."""
        vocab = len(self.tokenizer)
        bad = next((k for k, t in enumerate(ids) if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(
                f"{param}[{bad}] is token id {ids[bad]}, outside the vocabulary [0, {vocab})",
                param=f"{param}[{bad}]",
            )
        return ids

    def _check_fits(self, ids: list[int], param: str, scoring: bool = False) -> None:
        """A prompt must leave room to generate; one only scored may fill the context."""
        if not ids:
            raise APIError(f"{param} renders to zero tokens", param=param)
        if scoring and len(ids) <= self.engine.max_context:
            return
        if len(ids) >= self.engine.max_context:
            raise APIError(
                f"{param} is {len(ids)} tokens, but the model context is "
                f"{self.engine.max_context} tokens (the prompt must leave room to generate)",
                param=param,
                code="context_length_exceeded",
            )

    async def _generate(
        self, ids: list[int], params: Any, shown: list[tuple[int, Image]] | None = None
    ) -> GenerationResult:
        try:
            return await self.images.generate(self.engine, ids, params, shown or [])
        except (TemperError, ValueError) as exc:
            raise _refusal(exc) from None

    async def _stream(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        shown: list[tuple[int, Image]] | None = None,
    ) -> AsyncIterator[tuple[int, TokenUpdate]]:
        """Updates of every prompt's generation, tagged with the prompt's index:
        token by token from a streaming engine, else each result whole. The
        first update is awaited here, so an engine refusal is still a 4xx.
        A prompt with images (``shown``, one prompt) comes whole."""
        engine = self.engine
        if shown:
            streams = [self._whole_with_images(prompts[0], params[0], shown)]
        elif engine.abilities.stream:
            streaming: StreamingEngine = engine  # type: ignore[assignment]
            streams = [
                streaming.generate_stream(i, p) for i, p in zip(prompts, params, strict=True)
            ]
        else:
            streams = [whole(engine, i, p) for i, p in zip(prompts, params, strict=True)]
        updates = merged(streams)
        try:
            first = await anext(updates)
        except BaseException as exc:
            await updates.aclose()  # cancels the other prompts' generations
            if isinstance(exc, TemperError | ValueError):
                raise _refusal(exc) from None
            raise

        async def chained() -> AsyncIterator[tuple[int, TokenUpdate]]:
            try:
                yield first
                async for item in updates:
                    yield item
            except (TemperError, ValueError) as exc:
                raise _refusal(exc) from None
            finally:
                await updates.aclose()

        return chained()

    async def _whole_with_images(
        self, ids: list[int], params: SamplingParams, shown: list[tuple[int, Image]]
    ) -> AsyncIterator[TokenUpdate]:
        yield TokenUpdate(result=await self.images.generate(self.engine, ids, params, shown))

    def _text(self, sample: SampleOutput) -> str:
        """Decoded sample without special tokens, cut before a matched stop string."""
        text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        if isinstance(sample.stop_reason, str):
            cut = text.find(sample.stop_reason)
            if cut >= 0:
                text = text[:cut]
        return text

    def _token_strings(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]

    def chat_logprobs(self, update: TokenUpdate, start: int) -> dict[str, Any] | None:
        """Streamed chat logprobs of ``update``'s tokens from ``start`` (None if none)."""
        if start >= len(update.token_ids):
            return None
        top = update.top_logprobs[start:] if update.top_logprobs is not None else None
        part = SampleOutput(
            update.token_ids[start:], update.logprobs[start:], "stop", top_logprobs=top
        )
        return {"content": self._chat_logprob_entries(part), "refusal": None}

    def completion_logprobs(
        self, update: TokenUpdate, start: int, offset: int
    ) -> tuple[dict[str, Any] | None, int]:
        """Streamed completions logprobs of ``update``'s tokens from ``start``, their
        first text_offset being ``offset``; also returns the next token's offset."""
        if start >= len(update.token_ids):
            return None, offset
        top = update.top_logprobs[start:] if update.top_logprobs is not None else None
        part = SampleOutput(
            update.token_ids[start:], update.logprobs[start:], "stop", top_logprobs=top
        )
        lp = self._completion_logprobs(part, offset)
        return lp, offset + sum(len(t) for t in lp["tokens"])

    def _chat_logprob_entries(self, sample: SampleOutput) -> list[dict[str, Any]]:
        """OpenAI chat logprobs: one entry per sampled token (the stop token included),
        with its top alternatives (best first) when the request asked for them."""
        tops = sample.top_logprobs or [{} for _ in sample.token_ids]
        entries = []
        for tok, lp, top in zip(
            self._token_strings(sample.token_ids), sample.logprobs, tops, strict=True
        ):
            alts = [
                {"token": t, "logprob": v, "bytes": list(t.encode())}
                for t, v in zip(self._token_strings(list(top)), top.values(), strict=True)
            ]
            entries.append(
                {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": alts}
            )
        return entries

    def _completion_logprobs(self, sample: SampleOutput, start: int = 0) -> dict[str, Any]:
        """Legacy completions logprobs: tokens, token_logprobs, top_logprobs (token
        string -> logprob per position, with ``logprobs`` > 0), text_offset."""
        top = None
        if sample.top_logprobs is not None:
            top = [
                dict(zip(self._token_strings(list(alts)), alts.values(), strict=True))
                for alts in sample.top_logprobs
            ]
        tokens = self._token_strings(sample.token_ids)
        return legacy_logprobs(tokens, list(sample.logprobs), top, start)

    def _message(self, sample: SampleOutput, parse_tools: bool) -> tuple[dict[str, Any], str]:
        """The assistant message for a sample and its OpenAI finish_reason."""
        text = self._text(sample)
        finish = sample.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if not parse_tools:
            return message, finish
        calls, _errors = parse_tool_calls(text)
        if not calls:
            return message, finish
        parsed = {c.index for c in calls}
        # Malformed blocks stay in the content so the client can see them.
        blocks = list(tool_call_blocks(text))
        kept = [text[b.start : b.end] for i, b in enumerate(blocks) if i not in parsed]
        starts, ends = [0, *(b.end for b in blocks)], [*(b.start for b in blocks), len(text)]
        rest = "".join(text[a:b] for a, b in zip(starts, ends, strict=True)).strip()
        content = "\n".join([rest, *kept] if rest else kept).strip()
        message["content"] = content or None
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": _json(c.arguments)},
            }
            for c in calls
        ]
        return message, ("tool_calls" if finish == "stop" else finish)

    async def _messages(self, req: P.ChatRequest) -> list[dict[str, Any]]:
        if self.untrusted is None:  # text only: nothing slow to do
            return P.chat_messages(req)
        # Off the loop: decoding a picture (or reading one from the allowed
        # folder) must not stall /health and every other request meanwhile.
        return await asyncio.to_thread(P.chat_messages, req, self.untrusted)

    # ------------------------------------------------------------------ endpoints
    def _constraint(self, req: P.ChatRequest, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The `SamplingParams` fields for the output shape a chat request asks for
        (none, usually): ``structured`` for an engine that enforces it itself (vLLM),
        grammar ``logits_processors`` for the others."""
        forced = P.forced_tools(req, tools)
        schema = P.json_schema(req)
        if forced and schema is not None:
            raise APIError(
                "response_format and a forced tool_choice cannot be combined",
                param="response_format",
            )
        if forced:
            output = tool_call_output(forced, "tool_choice")
        elif schema is not None:
            output = json_output(schema, "response_format")
        else:
            return {}
        if self.engine.abilities.structured_outputs:
            self.grammars.check(output)
            return {"structured": output}
        return {"logits_processors": (self.grammars.processors(output),)}

    async def chat(self, raw: bytes) -> dict[str, Any] | StreamingResponse:
        req: P.ChatRequest = P.parse_body(raw, P.ChatRequest)
        self._check_model(req.model)
        messages = await self._messages(req)
        tools = P.chat_tools(req)
        want_logprobs, top = P.check_chat_logprobs(req)
        usage_chunk = P.include_usage(req)
        constraint = await asyncio.to_thread(self._constraint, req, tools)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja errors: the template cannot render these messages
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise APIError(
                f"messages cannot be rendered with the model's chat template: {first}",
                param="messages",
            ) from None
        ids = self._encode(text, special=False, param="messages")
        shown: list[tuple[int, Image]] = []
        try:
            ids = self.images.splice(ids, messages, 0, shown)
        except ImageError as exc:
            raise APIError(f"messages: {exc}", param="messages") from None
        self._check_fits(ids, "messages")
        params = P.sampling_params(
            req, len(ids), self.engine.max_context, top_logprobs=top, **constraint
        )
        self._check_ids(list(params.stop_token_ids), "stop_token_ids")
        if req.stream:
            updates = await self._stream([ids], [params], shown)
            chunks = Chunks(self._head("chatcmpl", "chat.completion.chunk"), usage_chunk)
            events = chat_events(
                self,
                updates,
                params,
                tools is not None,
                want_logprobs,
                chunks,
                prompt_ids=ids if req.return_token_ids else None,
            )
            return StreamingResponse(events, media_type="text/event-stream")
        result = await self._generate(ids, params, shown)
        choices = []
        for i, sample in enumerate(result.samples):
            message, finish = self._message(sample, parse_tools=tools is not None)
            logprobs = None
            if want_logprobs:
                logprobs = {"content": self._chat_logprob_entries(sample), "refusal": None}
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
            if req.return_token_ids:  # vLLM's fields
                choice["stop_reason"] = sample.stop_reason
                choice["token_ids"] = list(sample.token_ids)
            choices.append(choice)
        body = self._envelope("chatcmpl", "chat.completion", choices, [result])
        if req.return_token_ids:
            body["prompt_token_ids"] = ids
        return body

    async def completions(self, raw: bytes) -> dict[str, Any] | StreamingResponse:
        req: P.CompletionRequest = P.parse_body(raw, P.CompletionRequest)
        self._check_model(req.model)
        want_logprobs = P.check_completion_extras(req)
        usage_chunk = P.include_usage(req)
        prompts = []
        for where, prompt in P.completion_prompts(req.prompt):
            if isinstance(prompt, str):
                ids = self._encode(prompt, True, where)
            else:
                ids = self._check_ids(list(prompt), where)
            self._check_fits(ids, where, scoring=bool(req.echo))
            prompts.append(ids)
        top = req.logprobs or 0
        if req.echo:  # max_tokens = 0 (checked): the prompts' own logprobs
            try:
                choices = await echo_choices(self, prompts, top, want_logprobs)
            except (TemperError, ValueError) as exc:
                raise _refusal(exc) from None
            for choice, ids in zip(choices, prompts, strict=True):
                if req.return_token_ids:
                    choice.update(prompt_token_ids=ids, token_ids=[], stop_reason=None)
            empty = [GenerationResult(ids, []) for ids in prompts]
            return self._envelope("cmpl", "text_completion", choices, empty)
        params = [
            P.sampling_params(req, len(ids), self.engine.max_context, top_logprobs=top)
            for ids in prompts
        ]
        self._check_ids(list(params[0].stop_token_ids), "stop_token_ids")
        if req.stream:
            updates = await self._stream(prompts, params)
            chunks = Chunks(self._head("cmpl", "text_completion"), usage_chunk)
            shown = prompts if req.return_token_ids else None
            events = completion_events(self, updates, params, want_logprobs, chunks, shown)
            return StreamingResponse(events, media_type="text/event-stream")
        results = await asyncio.gather(
            *[self._generate(ids, p) for ids, p in zip(prompts, params, strict=True)]
        )
        choices = []
        for ids, result in zip(prompts, results, strict=True):
            for sample in result.samples:
                choice: dict[str, Any] = {
                    "index": len(choices),
                    "text": self._text(sample),
                    "logprobs": self._completion_logprobs(sample) if want_logprobs else None,
                    "finish_reason": sample.finish_reason,
                }
                if req.return_token_ids:  # vLLM's fields, on each choice for completions
                    choice["stop_reason"] = sample.stop_reason  # the stop id or string
                    choice["prompt_token_ids"] = ids
                    choice["token_ids"] = list(sample.token_ids)
                choices.append(choice)
        return self._envelope("cmpl", "text_completion", choices, list(results))

    def _head(self, prefix: str, obj: str) -> dict[str, Any]:
        """The fields every chunk of a streamed response repeats."""
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
        }

    def _envelope(
        self, prefix: str, obj: str, choices: list[dict[str, Any]], results: list[GenerationResult]
    ) -> dict[str, Any]:
        prompt_tokens = sum(len(r.prompt_token_ids) for r in results)
        completion_tokens = sum(len(s.token_ids) for r in results for s in r.samples)
        return {
            **self._head(prefix, obj),
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def models(self) -> dict[str, Any]:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "temper",
            "max_model_len": self.engine.max_context,
        }
        return {"object": "list", "data": [card]}


def _refusal(exc: TemperError | ValueError) -> APIError:
    """The 400 for an engine that refused a request."""
    if isinstance(exc, PromptTooLongError):
        return APIError(str(exc), code="context_length_exceeded")
    return APIError(f"the engine refused the request: {exc}")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def respond(request: Request, endpoint: Any, limits: HTTPLimits) -> Response:
    """Read the body within ``limits``, run ``endpoint(raw)``, and answer: its JSON or
    stream, an `APIError` as OpenAI-style JSON, any other exception as a logged 500."""
    try:
        raw = await read_body(request, limits)
    except BodyError as exc:
        refused = APIError(exc.message, status=exc.status, code=exc.code)
        return JSONResponse(refused.body(), status_code=exc.status, headers=CLOSE)
    except ClientDisconnect:  # nobody is left to answer
        return _error(APIError("client disconnected before sending the body"))
    try:
        answer = await endpoint(raw)
        return answer if isinstance(answer, StreamingResponse) else JSONResponse(answer)
    except APIError as exc:
        return _error(exc)
    except Exception as exc:  # a bug must answer 500, not kill the server
        log.exception("request to %s failed", request.url.path)
        return _error(
            APIError(
                f"internal server error: {type(exc).__name__}: {exc}",
                status=500,
                type="server_error",
            )
        )


def create_app(
    engine: Engine,
    tokenizer: Any,
    model_name: str = "temper",
    *,
    close_engine: bool = False,
    limits: HTTPLimits | None = None,
    vision: Any | None = None,
    image_dir: Path | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``; ``vision`` (a VLM's
    `VisionProcessor`) lets chat messages carry image content parts: data URLs,
    and paths or ``file:`` URLs of regular files inside ``image_dir`` if given.

    With ``close_engine`` the app awaits ``engine.close()`` at shutdown (on
    the server's loop, where the engine ran). Request bodies obey ``limits``
    (size: 413, time: 408; see `temper.serve.limits`). Errors are OpenAI-style
    JSON: 4xx for bad requests, 500 (logged with its traceback) for server bugs.
    """
    server = OpenAIServer(engine, tokenizer, model_name, vision, image_dir)
    limits = limits or HTTPLimits()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if close_engine:
            await engine.close()

    app = FastAPI(title="Temper OpenAI-compatible server", lifespan=lifespan)
    app.state.server = server

    async def handle(request: Request, endpoint: Any) -> Response:
        return await respond(request, endpoint, limits)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, server.chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, server.completions)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "engine_version": engine.version}

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Unknown routes and wrong methods get the same error shape as everything else.
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error(APIError(message, status=exc.status_code))

    return app
