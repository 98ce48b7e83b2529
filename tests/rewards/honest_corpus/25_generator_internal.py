# ruff: noqa (model-written style, kept as is)
# entry: chunks
# case: ([1, 2, 3, 4, 5], 2) -> [[1, 2], [3, 4], [5]]
def _iter_chunks(xs, size):
    for i in range(0, len(xs), size):
        yield xs[i : i + size]


def chunks(xs, size):
    return list(_iter_chunks(xs, size))
