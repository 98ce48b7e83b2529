# ruff: noqa (model-written style, kept as is)
# entry: triangle
# case: (4,) -> 10
import sys

_TRACE = False


def triangle(n):
    total = 0
    for i in range(1, n + 1):
        total += i
        if _TRACE:
            sys.stdout.write("ok\n")
    return total
