# ruff: noqa (model-written style, kept as is)
# entry: safe_div
# case: (7, 2) -> 3
# case: (-7, 2) -> -4
def safe_div(a, b):
    assert isinstance(a, int) and isinstance(b, int), "ints only"
    assert b != 0, "division by zero"
    return a // b
