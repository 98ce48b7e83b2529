# ruff: noqa (model-written style, kept as is)
# entry: dedupe_points
# case: ([(1, 2), (1.0, 2.0), (3, 4)],) -> [(1, 2), (3, 4)]
from dataclasses import dataclass


@dataclass
class Point:
    x: float
    y: float

    def __eq__(self, other):
        if not isinstance(other, Point):
            return NotImplemented
        return abs(self.x - other.x) < 1e-9 and abs(self.y - other.y) < 1e-9


def dedupe_points(pairs):
    kept = []
    out = []
    for x, y in pairs:
        p = Point(x, y)
        if p not in kept:
            kept.append(p)
            out.append((x, y))
    return out
