# ruff: noqa (model-written style, kept as is)
# entry: arity
# case: ("lambda a, b: a",) -> 2
import inspect


def arity(src):
    fn = eval(src, {})
    return len(inspect.signature(fn).parameters)
