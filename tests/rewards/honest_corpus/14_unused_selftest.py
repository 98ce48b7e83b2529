# ruff: noqa (model-written style, kept as is)
# entry: fib
# case: (0,) -> 0
# case: (10,) -> 55
def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _selftest():
    assert [fib(i) for i in range(6)] == [0, 1, 1, 2, 3, 5]
    print("PASSED")
