# ruff: noqa (model-written style, kept as is)
# entry: double
# case: (2,) -> 4
# case: (-3,) -> -6
def double(x):
    return 2 * x


# Checked on import: "ok" is printed only when the checks above it held.
assert double(2) == 4
assert double(-3) == -6
print("ok")
