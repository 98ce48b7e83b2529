"""Browser actions as JSON in the assistant's turn, parsed without trusting the model.

One action per turn, a JSON object with an ``"action"`` key:

    {"action": "click", "ref": 12}                 click element [12]'s centre
    {"action": "click_xy", "x": 40, "y": 95}       click viewport pixel (x, y)
    {"action": "type", "text": "hello"}            type into the focused element
    {"action": "type", "ref": 7, "text": "hello"}  click [7] first, then type
    {"action": "key", "key": "Enter"}              press a key (Playwright names:
                                                   Enter, Tab, Backspace, ArrowDown,
                                                   Control+A, ...)
    {"action": "scroll", "dy": 100}                wheel scroll (dx optional) at
                                                   the pointer, or over [ref]
    {"action": "done"}                             end the episode now

The object may stand alone, sit in a ```json fence, or be surrounded by other
text (then each complete {...} value in it is tried, the last first). Decoding
goes through `temper.safe_json.loads`, so hostile text (deep nesting, huge
integers, NaN, lone surrogates) is one `ActionError`, never a crash.
With ``boxed_click=True`` (for small text models that know ``\\boxed{}`` from
math but not JSON) a turn without a JSON object whose last ``\\boxed{...}``
holds an integer N reads as ``{"action": "click", "ref": N}``.
`ActionError.kind` is a short metric tag: ``no_json``, ``bad_json``,
``bad_action`` (not an object, no or unknown "action") or ``bad_args``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from temper.rewards.answers import extract_boxed
from temper.safe_json import JSONInputError, loads

ACTIONS = ("click", "click_xy", "type", "key", "scroll", "done")
#: Longest `type` text and `key` name accepted (a runaway turn is not typed for minutes).
MAX_TEXT = 500
MAX_KEY = 40
#: Largest coordinate or scroll distance accepted, in CSS pixels.
MAX_PIXELS = 10_000
#: Most "{" positions tried as the start of the action object.
MAX_OBJECTS = 50
_FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL)


class ActionError(ValueError):
    """An assistant turn that is not a usable action; `kind` is a metric tag."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Action:
    """One parsed action; fields not used by `kind` keep their defaults."""

    kind: str
    ref: int | None = None
    x: float = 0.0
    y: float = 0.0
    text: str = ""
    key: str = ""
    dx: float = 0.0
    dy: float = 0.0


def _candidates(text: str) -> list[str]:
    """Texts that may hold the JSON object, most specific first: the whole text, fenced
    blocks (last first), then each complete {...} value in the text (last first)."""
    out = [text.strip()]
    out += [m.group(1).strip() for m in _FENCE.finditer(text)][::-1]
    decoder, spans, covered = json.JSONDecoder(), [], 0
    for m in list(re.finditer(r"\{", text))[:MAX_OBJECTS]:
        if m.start() < covered:
            continue  # inside an object already found: the outer one is the action
        try:  # only finds where a value ends; safe_json.loads then checks it
            _, end = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        spans.append(text[m.start() : end])
        covered = end
    return [c for c in out + spans[::-1] if c]


def _decode(text: str) -> Any:
    first_error = ""
    for candidate in _candidates(text):
        try:
            return loads(candidate)
        except JSONInputError as exc:
            first_error = first_error or str(exc)
    if "{" not in text:
        raise ActionError(
            "no_json", 'no JSON object found; reply with e.g. {"action": "click", "ref": 3}'
        )
    raise ActionError("bad_json", f"the action is not valid JSON: {first_error}")


def _number(obj: dict[str, Any], key: str, default: float | None = None) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ActionError("bad_args", f'"{key}" must be a number, got {_show(value)}')
    if not -MAX_PIXELS <= value <= MAX_PIXELS:
        raise ActionError("bad_args", f'"{key}" must be within ±{MAX_PIXELS}, got {value}')
    return float(value)


def _ref(obj: dict[str, Any], required: bool) -> int | None:
    value = obj.get("ref")
    if value is None and not required:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 12:
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 10**9:
        raise ActionError("bad_args", f'"ref" must be an element number, got {_show(value)}')
    return value


def _string(obj: dict[str, Any], key: str, limit: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ActionError("bad_args", f'"{key}" must be a string, got {_show(value)}')
    if len(value) > limit:
        raise ActionError("bad_args", f'"{key}" is longer than {limit} characters')
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_action(text: str, boxed_click: bool = False) -> Action:
    """The action in an assistant turn's text; `ActionError` says what is wrong."""
    if boxed_click and "{" not in text.replace("\\boxed{", ""):
        boxed = extract_boxed(text)
        if boxed is not None and boxed.lstrip("-").isdigit() and len(boxed) < 10:
            return Action("click", ref=int(boxed))
    obj = _decode(text)
    if not isinstance(obj, dict):
        raise ActionError(
            "bad_action", f"the action must be a JSON object, got {type(obj).__name__}"
        )
    kind = obj.get("action")
    if kind not in ACTIONS:
        raise ActionError(
            "bad_action", f'"action" must be one of {", ".join(ACTIONS)}; got {_show(kind)}'
        )
    if kind == "click":
        return Action("click", ref=_ref(obj, True))
    if kind == "click_xy":
        return Action("click_xy", x=_number(obj, "x"), y=_number(obj, "y"))
    if kind == "type":
        return Action("type", ref=_ref(obj, False), text=_string(obj, "text", MAX_TEXT))
    if kind == "key":
        return Action("key", key=_string(obj, "key", MAX_KEY))
    if kind == "scroll":
        return Action(
            "scroll", ref=_ref(obj, False), dx=_number(obj, "dx", 0), dy=_number(obj, "dy", 0)
        )
    return Action("done")
