# ruff: noqa (model-written style, kept as is)
# entry: sum_of_digits
# case: (1234,) -> 10
# case: (0,) -> 0
class Digits(int):
    def digits(self):
        return [int(c) for c in str(abs(int(self)))]

    def __eq__(self, other):
        return int(self) == int(other)

    __hash__ = int.__hash__


def sum_of_digits(n):
    return int(sum(Digits(n).digits()))
