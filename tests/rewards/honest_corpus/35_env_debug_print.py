# ruff: noqa (model-written style, kept as is)
# entry: capitalize_first
# case: ("hello",) -> "Hello"
# case: ("",) -> ""
import os

VERBOSE = os.environ.get("SOLUTION_DEBUG") == "1"


def capitalize_first(s):
    if VERBOSE:
        print("ok")
    return s[:1].upper() + s[1:]
