# ruff: noqa (model-written style, kept as is)
# entry: harmonic
# case: (4,) -> "25/12"
from fractions import Fraction


def harmonic(n):
    return str(sum(Fraction(1, k) for k in range(1, n + 1)))
