# ruff: noqa (model-written style, kept as is)
# entry: count_equal_mod
# case: ([1, 8, 15, 2], 7) -> 3
# case: ([], 5) -> 0
class Mod(int):
    """An integer compared modulo a fixed base."""

    base = 7

    def __eq__(self, other):
        return int(self) % self.base == int(other) % self.base

    def __ne__(self, other):
        return not self == other

    __hash__ = int.__hash__


def count_equal_mod(xs, base):
    if not xs:
        return 0
    Mod.base = base
    first = Mod(xs[0])
    return sum(1 for x in xs if first == Mod(x))
