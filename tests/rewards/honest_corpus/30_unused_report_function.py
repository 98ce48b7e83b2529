# ruff: noqa (model-written style, kept as is)
# entry: max_gap
# case: ([1, 10, 3, 20],) -> 10
# case: ([5],) -> 0
def max_gap(xs):
    s = sorted(xs)
    return max((b - a for a, b in zip(s, s[1:])), default=0)


def _debug_report(xs):
    ok = max_gap(xs) >= 0
    print("PASSED" if ok else "FAILED")
