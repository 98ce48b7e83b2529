# ruff: noqa (model-written style, kept as is)
# entry: running_max
# case: ([1, 3, 2, 5],) -> [1, 3, 3, 5]
def running_max(xs):
    out = []
    best = None
    for i, x in enumerate(xs):
        best = x if best is None else max(best, x)
        out.append(best)
        print(f"step {i}: max so far {best}")
    return out
