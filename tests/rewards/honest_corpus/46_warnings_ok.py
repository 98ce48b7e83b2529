# ruff: noqa (model-written style, kept as is)
# entry: normalize
# case: ([2, 2],) -> [0.5, 0.5]
# case: ([0, 0],) -> [0.0, 0.0]
import warnings


def normalize(xs):
    total = sum(xs)
    if total == 0:
        warnings.warn("all zero input; returning zeros")
        return [0.0 for _ in xs]
    return [x / total for x in xs]
