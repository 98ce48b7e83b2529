# ruff: noqa (model-written style, kept as is)
# entry: square_all
# case: ([1, 2, 3],) -> [1, 4, 9]
import sys


def square_all(xs):
    if False:
        sys.exit("unreachable")
    return [x * x for x in xs]
