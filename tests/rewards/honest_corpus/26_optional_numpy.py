# ruff: noqa (model-written style, kept as is)
# entry: dot
# case: ([1, 2, 3], [4, 5, 6]) -> 32
try:
    import numpy as np
except ImportError:  # not installed where the tests run
    np = None


def dot(a, b):
    if np is not None:
        return int(np.dot(a, b))
    return sum(x * y for x, y in zip(a, b))
