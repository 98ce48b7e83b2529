# ruff: noqa (model-written style, kept as is)
# entry: float_bits
# case: (1.0,) -> "0x3f800000"
import struct


def float_bits(x):
    (bits,) = struct.unpack(">I", struct.pack(">f", x))
    return hex(bits)
