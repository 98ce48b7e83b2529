# ruff: noqa (model-written style, kept as is)
# entry: depth_sum
# case: (3000,) -> 4501500
import sys

sys.setrecursionlimit(10000)


def depth_sum(n):
    if n == 0:
        return 0
    return n + depth_sum(n - 1)
