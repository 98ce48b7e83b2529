"""Decoding JSON that comes from outside: model output, HTTP request bodies, dataset cells.

`json.loads` on such text can fail in more ways than `JSONDecodeError`:
``"[" * 1000`` raises `RecursionError`, an integer of 5,000 digits raises a
plain `ValueError` (Python's 4,300-digit limit), and it accepts things that
break whatever reads the value next: ``NaN``/``Infinity`` (not JSON), numbers
that overflow to ``inf``, and lone UTF-16 surrogates such as ``"\\ud800"``
(tokenizers refuse them with `TypeError`; UTF-8 cannot hold them).

`loads` turns all of these into `JSONInputError`, a `ValueError` whose message
is one line saying what is wrong. It also bounds the nesting depth of the
value (``max_depth``, default `MAX_DEPTH`), so code that walks the value
recursively afterwards (schema checks, ``json.dumps``, pydantic, Jinja
templates) cannot hit the recursion limit. `check_value` applies the same
checks to a value that was decoded some other way (TOML, for instance).

Users: the tool-call parser (and so the rollout, ``temper serve``, the
``tool_call_ast`` reward, replay and the dashboard), the ``tool_call_ast``
reward's JSON task columns, both servers' request bodies, and (through
`check_value`) the config loader.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

#: Deepest nesting accepted. Real tool calls and API bodies stay under ten
#: levels; the bound is far below Python's recursion limit (1000), leaving
#: room for whatever walks the value later.
MAX_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONInputError(ValueError):
    """Untrusted JSON that cannot be used; the message is one line."""


def _refuse_constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not valid JSON")


def _check_string(text: str, where: str) -> None:
    if not text.isascii():
        bad = _SURROGATE.search(text)
        if bad is not None:
            code = f"\\u{ord(bad.group()):04x}"
            raise JSONInputError(f"{where} holds a lone UTF-16 surrogate ({code})")


def _where(path: list[Any]) -> str:
    if not path:
        return "the value"
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def check_value(value: Any, max_depth: int = MAX_DEPTH, *, finite: bool = True) -> None:
    """Raise `JSONInputError` if ``value`` nests deeper than ``max_depth``, holds a
    string (or key) with a lone surrogate, or (with ``finite``) a non-finite float.

    Iterative, so a deep value cannot overflow the stack here.
    """
    stack: list[tuple[Any, int, list[Any]]] = [(value, 1, [])]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            _check_string(node, _where(path))
        elif isinstance(node, float):
            if finite and not math.isfinite(node):
                raise JSONInputError(f"{_where(path)} is a number out of range ({node})")
        elif isinstance(node, dict | list):
            if depth > max_depth:
                raise JSONInputError(f"the value is nested deeper than {max_depth} levels")
            if isinstance(node, dict):
                for key, item in node.items():
                    if isinstance(key, str):
                        _check_string(key, f"a key of {_where(path)}")
                    stack.append((item, depth + 1, [*path, key]))
            else:
                stack.extend((item, depth + 1, [*path, i]) for i, item in enumerate(node))


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """The value of JSON ``text``; `JSONInputError` (one line) for anything unusable.

    Bytes must be UTF-8 (a leading BOM is allowed). NaN and Infinity are
    refused, as are numbers that overflow a float, lone surrogates, nesting
    deeper than ``max_depth`` and integers over Python's digit limit.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise JSONInputError(
                f"not valid UTF-8 (byte 0x{text[exc.start]:02x} at position {exc.start})"
            ) from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except JSONInputError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONInputError(f"not valid JSON ({exc})") from None
    except RecursionError:
        raise JSONInputError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # the only other one: an integer over the digit limit
        if "digits" in str(exc):
            limit = sys.get_int_max_str_digits()
            raise JSONInputError(f"an integer has more than {limit} digits") from None
        raise JSONInputError(f"not valid JSON ({str(exc).splitlines()[0]})") from None
    check_value(value, max_depth)
    return value
