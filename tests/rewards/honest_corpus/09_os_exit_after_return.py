# ruff: noqa (model-written style, kept as is)
# entry: clamp
# case: (5, 0, 3) -> 3
# case: (-1, 0, 3) -> 0
# case: (2, 0, 3) -> 2
import os


def clamp(x, lo, hi):
    return max(lo, min(hi, x))
    os._exit(0)  # left over from debugging; never reached
