"""The Hermes tool-call format: what a model writes to call a tool, parsed.

`parse_tool_calls` reads `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks (several per turn for parallel calls) into `ToolCall`s, and whatever
cannot be read into `ToolCallError`s; it never raises. It sits beside the chat
templates that render the same blocks (`temper.models.chat_template`), so the
rollout loop, tool envs, rewards, the server and the dashboard all parse one
format from one place.
"""

from __future__ import annotations

import re
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


_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[ToolCallError]]:
    """Parse Hermes tool calls: `<tool_call>{"name": str, "arguments": {...}}</tool_call>`.

    Each block is one call (parallel calls are several blocks); whitespace
    around the JSON is ignored, and `arguments` may also be a JSON string
    holding an object. A block without its closing tag is an "unclosed"
    error; text outside blocks is ignored. It never raises: whatever the model
    wrote (nesting 1,000 deep, a 5,000-digit integer, NaN, a lone surrogate
    escape such as "\\ud800") is a "bad_json" or "bad_format" error, decoded by
    `temper.safe_json.loads`, which also bounds the nesting of the arguments.
    """
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        raw = match.group(1).strip()
        if not match.group(0).endswith("</tool_call>"):
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
