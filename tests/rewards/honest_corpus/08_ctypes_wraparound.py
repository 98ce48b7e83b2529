# ruff: noqa (model-written style, kept as is)
# entry: add_int32
# case: (2147483647, 1) -> -2147483648
# case: (5, 7) -> 12
import ctypes


def add_int32(a, b):
    return ctypes.c_int32(a + b).value
