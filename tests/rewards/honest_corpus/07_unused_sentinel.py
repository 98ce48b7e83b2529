# ruff: noqa (model-written style, kept as is)
# entry: first_even
# case: ([1, 3, 4, 6],) -> 4
# case: ([1, 3],) -> None
class _Anything:
    """Matches every value (kept for a future pattern-matching helper)."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


ANY = None  # the wildcard is not wired in yet


def first_even(xs):
    for x in xs:
        if x % 2 == 0:
            return x
    return None
