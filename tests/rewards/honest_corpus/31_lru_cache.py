# ruff: noqa (model-written style, kept as is)
# entry: ways_to_climb
# case: (5,) -> 8
# case: (30,) -> 1346269
from functools import lru_cache


@lru_cache(maxsize=None)
def ways_to_climb(n):
    if n <= 1:
        return 1
    return ways_to_climb(n - 1) + ways_to_climb(n - 2)
