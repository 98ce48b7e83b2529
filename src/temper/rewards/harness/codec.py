"""Type-tagged JSON for plain data, and exact comparison (harness, candidate and host)."""

# ruff: noqa
import base64, json

MAX_DEPTH = 200


def encode(x, depth=0):
    """Plain builtin data -> JSON-able; exact types only (a subclass is refused)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [encode(v, depth + 1) for v in x]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [encode(v, depth + 1) for v in x]}
    if t is bytes:
        return {"b": base64.b64encode(x).decode()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    raise TypeError("unsupported type " + t.__name__ + " (plain builtin data only)")


def decode(x):
    """The inverse of encode; anything else raises ValueError."""
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [decode(v) for v in x]
    if t is dict and len(x) == 1:
        ((tag, v),) = x.items()
        if tag == "t" and type(v) is list:
            return tuple(decode(e) for e in v)
        if tag == "d" and type(v) is list:
            return {decode(k): decode(e) for k, e in v}
        if tag == "s" and type(v) is list:
            return {decode(e) for e in v}
        if tag == "f" and type(v) is list:
            return frozenset(decode(e) for e in v)
        if tag == "b" and type(v) is str:
            return base64.b64decode(v)
        if tag == "c" and type(v) is list and len(v) == 2:
            return complex(float(v[0]), float(v[1]))
    raise ValueError("malformed value")


def same(expected, got):
    """Exact type and value, recursively, with the EXPECTED type's own __eq__."""
    t = type(expected)
    if type(got) is not t:
        return False
    if t is list or t is tuple:
        return len(got) == len(expected) and all(same(e, g) for e, g in zip(expected, got))
    if t is dict:
        return got.keys() == expected.keys() and all(same(v, got[k]) for k, v in expected.items())
    return t.__eq__(expected, got) is True
