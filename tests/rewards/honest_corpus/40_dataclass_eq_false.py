# ruff: noqa (model-written style, kept as is)
# entry: same_shape
# case: ([[1, 2], [3, 4]], [[0, 0], [0, 0]]) -> True
# case: ([[1]], [[1, 2]]) -> False
from dataclasses import dataclass


@dataclass(eq=False)
class Shape:
    rows: int
    cols: tuple

    def __eq__(self, other):
        return (self.rows, self.cols) == (other.rows, other.cols)


def _shape(m):
    return Shape(len(m), tuple(len(r) for r in m))


def same_shape(a, b):
    return _shape(a) == _shape(b)
