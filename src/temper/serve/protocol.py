"""Request models and validation for the OpenAI-compatible server.

This module turns a JSON request body into what the engine needs (chat
messages ready for the chat template, `SamplingParams`) or raises `APIError`
with an OpenAI-style message that names the offending parameter. It does no
rendering, no generation and no HTTP; `temper.serve.openai_server` does.

Unsupported OpenAI features are refused loudly (400 naming the parameter)
rather than ignored: `logit_bias`, `echo`, `suffix`, `best_of` > n and
image content parts unless the model is a vision-language model. Numbers must
be finite and in OpenAI's ranges. Fields are typed strictly: ``"n": "2"`` or
``"stream": "yes"`` is a 400 naming the field, not a value guessed at. Images
come as data URLs only, or from the operator's allowed folder
(`temper.vision.images.UntrustedImages`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from temper import safe_json
from temper.engine.base import SamplingParams
from temper.engine.structured import StructuredOutput
from temper.vision.images import ImageError, UntrustedImages, content_parts

ROLES = ("system", "user", "assistant", "tool")


class APIError(Exception):
    """A request the server refuses; rendered as `{"error": {...}}` with `status`."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Request(BaseModel):
    """Fields shared by chat and text completions. Unknown fields are ignored.

    Strict: no coercion ("2" is not 2, "yes" is not true), so a client's
    mistake is a 400 naming the field instead of a request it did not mean.
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM-style); -1 or 0 = off
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # extension
    seed: int | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False  # extension (vLLM's name): prompt and sampled token ids


class ChatRequest(_Request):
    messages: list[Any]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: Any  # checked by `completion_prompts`, which names the bad element
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """Decode and validate a request body; `APIError` names the first bad field.

    The JSON is decoded by `temper.safe_json.loads`: nesting deeper than 64,
    integers over 4,300 digits, NaN/Infinity and lone surrogates are 400s.
    """
    try:
        data = safe_json.loads(raw)
    except safe_json.JSONInputError as exc:
        raise APIError(f"request body: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(f"request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise APIError(f"invalid {param}: {err['msg']}", param=param) from None


#: Most top-logprob alternatives a request may ask for (vLLM's default max_logprobs).
MAX_TOP_LOGPROBS = 20


def _refuse_unsupported(req: _Request) -> None:
    if req.logit_bias:
        raise APIError("logit_bias is not supported by this server", param="logit_bias")
    values = dict(req)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = values[name]
        if value is not None and not math.isfinite(value):
            raise APIError(f"{name} must be a finite number, got {value}", param=name)
    for name in ("presence_penalty", "frequency_penalty"):
        value = values[name]
        if value is not None and not -2 <= value <= 2:
            raise APIError(f"{name} must be in [-2, 2], got {value}", param=name)


def include_usage(req: _Request) -> bool:
    """Whether a streamed response ends with a usage chunk (``stream_options``)."""
    if req.stream_options is None:
        return False
    if not req.stream:
        raise APIError("stream_options is only allowed with stream=true", param="stream_options")
    value = req.stream_options.get("include_usage", False)
    if not isinstance(value, bool):
        raise APIError(
            "stream_options.include_usage must be a boolean", param="stream_options.include_usage"
        )
    return value


def sampling_params(
    req: ChatRequest | CompletionRequest,
    prompt_len: int,
    max_context: int,
    *,
    top_logprobs: int = 0,
    logits_processors: tuple[Any, ...] = (),
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    """`SamplingParams` for a validated request whose prompt has `prompt_len` tokens.

    Without a token limit the sample may run to the end of the context. A limit
    beyond the context is allowed: the engine stops at the context with
    finish_reason "length" (the same rule as training rollouts).
    """
    _refuse_unsupported(req)
    if req.n < 1:
        raise APIError(f"n must be at least 1, got {req.n}", param="n")
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < 0:
        raise APIError(f"temperature must be >= 0, got {temperature}", param="temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0 < top_p <= 1:
        raise APIError(f"top_p must be in (0, 1], got {top_p}", param="top_p")
    top_k = req.top_k if req.top_k is not None else 0
    if top_k < -1:
        raise APIError(f"top_k must be >= 0 (or -1 for off), got {top_k}", param="top_k")
    limit_name, limit = "max_tokens", req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        limit_name, limit = "max_completion_tokens", req.max_completion_tokens
    if limit is not None and limit < 1:
        raise APIError(f"{limit_name} must be at least 1, got {limit}", param=limit_name)
    if req.seed is not None and not -(2**63) <= req.seed < 2**64:
        raise APIError(f"seed must fit in 64 bits, got {req.seed}", param="seed")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stops):
        raise APIError("stop strings must be non-empty", param="stop")
    return SamplingParams(
        n=req.n,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        max_new_tokens=limit if limit is not None else max(1, max_context - prompt_len),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        stop_strings=tuple(stops),
        seed=req.seed,
        top_logprobs=top_logprobs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logits_processors=logits_processors,
        structured=structured,
    )


def _text_content(
    content: Any, where: str, images: UntrustedImages | None = None
) -> str | list | None:
    """Message content as one string (a string, or a list of text parts joined), or,
    when ``images`` is given and the parts hold images, as canonical content parts
    (each image loaded under ``images``' rules)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        has_image = False
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image_url", "image"):
                if not images:
                    raise APIError(
                        f"{where}[{j}]: image content parts need a vision-language model; "
                        "this server's model takes text only",
                        param=f"{where}[{j}]",
                    )
                has_image = True
                continue
            if kind != "text" or not isinstance(part.get("text"), str):
                raise APIError(
                    f"{where}[{j}]: content parts must be text or image_url, got type {kind!r}",
                    param=f"{where}[{j}]",
                )
            parts.append(part["text"])
        if not has_image:
            return "".join(parts)
        try:
            return content_parts(content, images)
        except ImageError as exc:
            raise APIError(f"{where}: {exc}", param=where) from None
    raise APIError(f"{where} must be a string or a list of content parts", param=where)


def _check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise APIError(f"{where} must be a list", param=where)
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(
                f"{where}[{j}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'arguments': ...}}}}",
                param=f"{where}[{j}]",
            )
    return calls


def chat_messages(req: ChatRequest, images: UntrustedImages | None = None) -> list[dict[str, Any]]:
    """The request's messages normalised for the chat template.

    "developer" becomes "system"; text-part lists become strings; with
    ``images`` (a vision-language model), parts holding images stay parts, each
    image decoded under ``images``' rules (`temper.vision.content_parts`), which
    may read a file: call it off the event loop. An assistant message may have
    no content when it has tool calls.
    """
    if not req.messages:
        raise APIError("messages must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(req.messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise APIError(f"{where} must be an object with role and content", param=where)
        role = "system" if msg.get("role") == "developer" else msg.get("role")
        if role not in ROLES:
            raise APIError(
                f"{where}.role must be one of {', '.join(ROLES)}, got {msg.get('role')!r}",
                param=f"{where}.role",
            )
        content = _text_content(msg.get("content"), f"{where}.content", images)
        item: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            if msg.get("tool_calls"):
                item["tool_calls"] = _check_tool_calls(msg["tool_calls"], f"{where}.tool_calls")
            elif content is None:
                item["content"] = ""
        elif content is None:
            raise APIError(f"{where}.content is missing", param=f"{where}.content")
        for key in ("name", "tool_call_id"):
            if key in msg:
                item[key] = msg[key]
        out.append(item)
    return out


def chat_tools(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The request's tools (OpenAI function schemas), or None when tools are off.

    `tool_choice` "none" renders no tools; see `forced_tools` for the forced kinds.
    """
    choice = req.tool_choice
    if not req.tools or choice == "none":
        return None
    for i, tool in enumerate(req.tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}",
                param=f"tools[{i}]",
            )
    return list(req.tools)


def forced_tools(req: ChatRequest, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tools one of which the reply must call: all of them for "required",
    the named one for ``{"type": "function", "function": {"name": ...}}``, none
    for "auto"/"none"/absent."""
    choice = req.tool_choice
    if choice is None or choice in ("auto", "none"):
        return []
    if choice == "required":
        if not tools:
            raise APIError("tool_choice 'required' needs a non-empty tools list", param="tools")
        return tools
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise APIError(
            "tool_choice must be 'auto', 'none', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    named = [t for t in tools or [] if t["function"]["name"] == name]
    if not named:
        raise APIError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    return named[:1]


def json_schema(req: ChatRequest) -> dict[str, Any] | None:
    """The JSON schema the reply must follow (``response_format``), or None for text.

    ``json_object`` is any JSON object; ``json_schema`` takes
    ``{"json_schema": {"name": ..., "schema": {...}}}``.
    """
    fmt = req.response_format
    kind = None if fmt is None else fmt.get("type", "text")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                "response_format.json_schema must be {'name': ..., 'schema': {...}}",
                param="response_format.json_schema",
            )
        return schema
    raise APIError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format.type",
    )


def check_chat_logprobs(req: ChatRequest) -> tuple[bool, int]:
    """Whether to return logprobs, and how many top alternatives per token."""
    top = req.top_logprobs or 0
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise APIError(
            f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", param="top_logprobs"
        )
    if top and not req.logprobs:
        raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
    return bool(req.logprobs), top


def _shown(value: Any) -> str:
    """A client's value as it sent it (JSON), cut short."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _id_list(value: list[Any], where: str) -> list[int]:
    for k, item in enumerate(value):
        if not _is_id(item):
            raise APIError(
                f"{where}[{k}] must be a token id (an integer), got {_shown(item)}",
                param=f"{where}[{k}]",
            )
    return value


def completion_prompts(prompt: Any) -> list[tuple[str, str | list[int]]]:
    """The prompts of a text completion, each with the name of its field: a string,
    a list of strings, a list of token ids, or a list of id lists (vLLM's forms;
    strings and id lists may be mixed). Ids are checked to be integers here; the
    server checks them against the vocabulary."""
    if isinstance(prompt, str):
        return [("prompt", prompt)]
    if not isinstance(prompt, list):
        raise APIError(
            "prompt must be a string, a list of strings, a list of token ids or a list "
            f"of token-id lists, got {_shown(prompt)}",
            param="prompt",
        )
    if not prompt:
        raise APIError("prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int | float):  # meant as ids: a float or bool is named
        return [("prompt", _id_list(prompt, "prompt"))]
    out: list[tuple[str, str | list[int]]] = []
    for j, item in enumerate(prompt):
        where = f"prompt[{j}]"
        if isinstance(item, str):
            out.append((where, item))
        elif isinstance(item, list):
            out.append((where, _id_list(item, where)))
        else:
            raise APIError(
                f"{where} must be a string or a list of token ids, got {_shown(item)}",
                param=where,
            )
    return out


def check_completion_extras(req: CompletionRequest) -> bool:
    """Refuse suffix, best_of and echo other than scoring (``max_tokens = 0``); return whether to include logprobs (``req.logprobs``
    alternatives per token)."""
    if req.echo:  # scoring: the logprobs of the prompt's own tokens, nothing generated
        if req.max_tokens != 0:
            raise APIError(
                "echo=true is supported with max_tokens = 0: the server scores the prompt's "
                f"tokens and generates none (got max_tokens = {req.max_tokens})",
                param="echo",
            )
        if req.stream:
            raise APIError("echo=true with max_tokens = 0 does not stream", param="stream")
        if req.n != 1:
            raise APIError(
                f"echo=true scores each prompt once: n must be 1, got {req.n}", param="n"
            )
    if req.suffix:
        raise APIError("suffix is not supported by this server", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError("best_of other than n is not supported", param="best_of")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise APIError(
            f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.logprobs}", param="logprobs"
        )
    return req.logprobs is not None
