# ruff: noqa (model-written style, kept as is)
# entry: take_until
# case: ([1, 2, 0, 3],) -> [1, 2]
# case: ([5, 6], 6) -> [5]
def take_until(xs, quit_on=0):
    out = []
    for x in xs:
        if x == quit_on:
            break
        out.append(x)
    return out
