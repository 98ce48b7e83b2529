"""The Hermes tool-call format: what a model writes to call a tool, parsed.

`parse_tool_calls` reads `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks (several per turn for parallel calls) into `ToolCall`s, and whatever
cannot be read into `ToolCallError`s; it never raises. It sits beside the chat
templates that render the same blocks (`temper.models.chat_template`), so the
rollout loop, tool envs, rewards, the server and the dashboard all parse one
format from one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from temper import safe_json


@dataclass(frozen=True)
class ToolCall:
    """One well-formed tool call parsed from an assistant turn.

    `index` is the call's position among the turn's tool-call blocks (errors
    included); `id` names it in the tool message that answers it. `arguments`
    is the decoded JSON object, not yet checked against the tool's schema.
    """

    name: str
    arguments: dict[str, Any]
    index: int = 0
    id: str = "call_0"
    raw: str = ""


@dataclass(frozen=True)
class ToolCallError:
    """A tool-call block that could not be parsed.

    `kind` is a short tag used as a metric key ("bad_json", "bad_format",
    "unclosed"); `message` says what is wrong in words the model can read.
    """

    kind: str
    message: str
    index: int = 0
    raw: str = ""


# Caps on what one turn's calls are read of. A model's turn is bounded by its token
# budget, but a client's message to `temper serve` or the gateway is not: past these,
# a block is an error without being decoded, and later blocks are not read at all.
MAX_CALLS = 64
MAX_CALL_CHARS = 100_000

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Block:
    """One `<tool_call>` block of a turn: ``text[start:end]`` is the whole block, tags
    included; ``body`` what is between them. An unclosed block ends where the next
    one opens, or at the end of the text."""

    start: int
    end: int
    body: str
    closed: bool


def tool_call_blocks(text: str) -> Iterator[Block]:
    """The turn's blocks, in order, in linear time: each `str.find` scans past a
    position at most once (a regex's lazy match retried the closing-tag lookahead at
    every character: 0.3 s for 10 MB)."""
    pos = text.find(_OPEN)
    close = -2  # the next closing tag at or after the current block; -1: none left
    while pos != -1:
        start = pos + len(_OPEN)
        after = text.find(_OPEN, start)
        if close != -1 and close < start:
            close = text.find(_CLOSE, start)
        if close != -1 and (after == -1 or close < after):
            yield Block(pos, close + len(_CLOSE), text[start:close], True)
        else:
            end = len(text) if after == -1 else after
            yield Block(pos, end, text[start:end], False)
        pos = after


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[ToolCallError]]:
    """Parse Hermes tool calls: `<tool_call>{"name": str, "arguments": {...}}</tool_call>`.

    Each block is one call (parallel calls are several blocks); whitespace
    around the JSON is ignored, and `arguments` may also be a JSON string
    holding an object. A block without its closing tag is an "unclosed"
    error; text outside blocks is ignored. It never raises: whatever the model
    wrote (nesting 1,000 deep, a 5,000-digit integer, NaN, a lone surrogate
    escape such as "\\ud800") is a "bad_json" or "bad_format" error, decoded by
    `temper.safe_json.loads`, which also bounds the nesting of the arguments.
    A block over `MAX_CALL_CHARS` is a "too_long" error, and the blocks past
    `MAX_CALLS` are one "too_many" error: parsing stays linear and bounded.
    """
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    for index, block in enumerate(tool_call_blocks(text)):
        if index == MAX_CALLS:
            msg = f"more than {MAX_CALLS} tool calls in one turn; the rest were not read"
            errors.append(ToolCallError("too_many", msg, index, ""))
            break
        if len(block.body) > MAX_CALL_CHARS:
            msg = f"tool call is {len(block.body):,} characters long; at most {MAX_CALL_CHARS:,}"
            errors.append(ToolCallError("too_long", msg, index, block.body[:200]))
            continue
        raw = block.body.strip()
        if not block.closed:
            errors.append(
                ToolCallError("unclosed", "tool call has no closing </tool_call>", index, raw)
            )
            continue
        try:
            obj = safe_json.loads(raw)
        except safe_json.JSONInputError as exc:
            errors.append(ToolCallError("bad_json", f"tool call is {_not_json(exc)}", index, raw))
            continue
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = safe_json.loads(args)
            except safe_json.JSONInputError as exc:
                msg = f'"arguments" of the tool call is a string that is {_not_json(exc)}'
                errors.append(ToolCallError("bad_format", msg, index, raw))
                continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            msg = 'tool call must be a JSON object with a string "name"'
            errors.append(ToolCallError("bad_format", msg, index, raw))
        elif not isinstance(args, dict):
            msg = f'"arguments" of tool call {obj["name"]!r} must be a JSON object'
            errors.append(ToolCallError("bad_format", msg, index, raw))
        else:
            calls.append(ToolCall(obj["name"], args, index, f"call_{index}", raw))
    return calls, errors


def _not_json(exc: safe_json.JSONInputError) -> str:
    """The words 'not valid JSON (...)' for any problem `safe_json.loads` reports."""
    text = str(exc)
    return text if text.startswith("not valid JSON") else f"not valid JSON ({text})"
