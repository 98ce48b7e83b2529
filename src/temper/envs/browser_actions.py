"""Browser actions as JSON in the assistant's turn, parsed without trusting the model.

An action is a JSON object with an ``"action"`` key:

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
text. **One action per turn: the last well-formed one.** The candidates are
the outermost {...} objects of the turn, tried last first (braces inside JSON
strings do not count, nor a "{" that cannot open a JSON object, such as the
one in ``\\boxed{4}``), then the whole turn. The first candidate that is a
valid action is performed; the others are ignored. If none is, the error is
that of the first candidate that decoded as JSON (so, of the last object that
is JSON), else ``bad_json``, or ``no_json`` when the turn has no "{".

Bounds: the parser runs on the rollout's event loop, so it must be fast on
any text. Only the last `MAX_SCAN` characters of a turn are read, at most
`MAX_OBJECTS` candidates are decoded (their texts do not overlap), and
finding them is a pass over the text (a few when "{" are left open, see
`_objects`) with regexes that cannot match the same text two ways, so
nothing backtracks. 64 KiB built to be slow takes under 0.1 s of CPU; a
normal turn well under 1 ms. (A thread would not help: the work holds the
GIL.) Decoding goes through `temper.safe_json.loads`, so hostile text (deep
nesting, huge integers, NaN, lone surrogates) is one `ActionError`, never a
crash.

With ``boxed_click=True`` (for small text models that know ``\\boxed{}`` from
math but not JSON) a turn without a JSON object whose last ``\\boxed{...}``
holds an integer N reads as ``{"action": "click", "ref": N}``.
`ActionError.kind` is a short metric tag: ``no_json``, ``bad_json``,
``bad_action`` (not an object, no or unknown "action") or ``bad_args``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from temper.safe_json import JSONInputError, loads

ACTIONS = ("click", "click_xy", "type", "key", "scroll", "done")
#: Longest `type` text and `key` name accepted (a runaway turn is not typed for minutes).
MAX_TEXT = 500
MAX_KEY = 40
#: Largest element number accepted.
MAX_REF = 10**9
#: Largest coordinate or scroll distance accepted, in CSS pixels.
MAX_PIXELS = 10_000
#: Characters read from the end of a turn (64 KiB); an action is short and comes last.
MAX_SCAN = 65_536
#: Most candidates decoded per turn (the last objects, then the whole turn).
MAX_OBJECTS = 50
#: Passes over the text when objects are left open (see `_objects`).
_RESCANS = 3
#: A "{" that can open a JSON object: the next non-blank character is '"' or '}'.
_OPEN = re.compile(r'\{(?=\s*["}])')
#: Inside an object: an object opening, a closing brace, or a string's opening quote.
_INSIDE = re.compile(r'\{(?=\s*["}])|[}"]')
#: One JSON string from its opening quote; an unterminated one runs to the end.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
#: The content of a \boxed{...} holding no brace.
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
#: An element number written as a string: ASCII digits only ("²".isdigit() is true,
#: int("²") fails, and so does int("--5") after a lstrip("-") check).
_INT = re.compile(r"\s*-?[0-9]{1,10}\s*")


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


def _objects(text: str) -> list[str]:
    """The outermost {...} objects of `text`, first to last.

    A "{" left open (a stray ``{"`` in prose) may have put the quotes after it
    out of step, so the text after it is scanned again, a few times at most:
    still linear, and an action after one or two broken objects is found.
    """
    found: list[tuple[int, int]] = []
    pos = 0
    for _ in range(_RESCANS):
        spans, unclosed = _scan(text, pos)
        if unclosed is None:
            found += spans
            break
        found += [span for span in spans if span[0] < unclosed]
        pos = unclosed + 1
    return [text[a:b] for a, b in found]


def _scan(text: str, pos: int) -> tuple[list[tuple[int, int]], int | None]:
    """One pass from `pos`: spans of the outermost matched {...}, and the first "{"
    left open (None if all closed). A stack matches the braces; inside an object,
    strings are skipped whole (a "}" in a typed text does not close it)."""
    spans: list[tuple[int, int]] = []
    stack: list[int] = []
    while (m := (_INSIDE if stack else _OPEN).search(text, pos)) is not None:
        pos = m.end()
        if m.group() == '"':
            pos = _STRING.match(text, m.start()).end()  # type: ignore[union-attr]
        elif m.group() == "}":
            start = stack.pop()
            while spans and spans[-1][0] > start:
                spans.pop()  # nested in this one: the outer object is the candidate
            spans.append((start, pos))
        else:
            stack.append(m.start())
    return spans, (stack[0] if stack else None)


def _candidates(text: str) -> Iterator[str]:
    """Texts that may hold the action, in the order they are tried (module doc)."""
    seen: set[str] = set()
    # The whole turn comes last: it only matters when it is JSON but not an object.
    for candidate in [*_objects(text)[::-1], text]:
        candidate = candidate.strip()
        if candidate and candidate not in seen:
            seen.add(candidate)
            yield candidate


def _boxed_ref(text: str) -> int | None:
    """N from the last brace-free ``\\boxed{N}``, if N is an integer."""
    boxes = _BOXED.findall(text)
    if not boxes or not _INT.fullmatch(boxes[-1]) or abs(int(boxes[-1])) > MAX_REF:
        return None
    return int(boxes[-1])


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
    if isinstance(value, str) and _INT.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_REF:
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
    text = text[-MAX_SCAN:]  # bounds all the work below; the action comes last
    if boxed_click and "{" not in text.replace("\\boxed{", ""):
        ref = _boxed_ref(text)
        if ref is not None:
            return Action("click", ref=ref)
    rejected: ActionError | None = None
    decode_error = ""
    for candidate in islice(_candidates(text), MAX_OBJECTS):
        try:
            return _action(loads(candidate))
        except JSONInputError as exc:
            decode_error = decode_error or str(exc)
        except ActionError as exc:
            rejected = rejected or exc
    if rejected is not None:
        raise rejected
    if "{" not in text:
        raise ActionError(
            "no_json", 'no JSON object found; reply with e.g. {"action": "click", "ref": 3}'
        )
    raise ActionError("bad_json", f"the action is not valid JSON: {decode_error}")


def _action(obj: Any) -> Action:
    """The Action a decoded JSON value describes; `ActionError` if it is not one."""
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
