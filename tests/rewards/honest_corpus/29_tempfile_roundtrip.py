# ruff: noqa (model-written style, kept as is)
# entry: roundtrip_lines
# case: (["a", "b", "c"],) -> ["a", "b", "c"]
import os
import tempfile


def roundtrip_lines(lines):
    fd, path = tempfile.mkstemp(suffix=".txt")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines))
        with open(path) as f:
            return f.read().split("\n") if lines else []
    finally:
        os.remove(path)
