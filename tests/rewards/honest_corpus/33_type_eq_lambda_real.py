# ruff: noqa (model-written style, kept as is)
# entry: count_distinct_keys
# case: ([["a", 1], ["b", 2], ["a", 3]],) -> 2
Key = type(
    "Key",
    (),
    {
        "__init__": lambda self, k: setattr(self, "k", k),
        "__eq__": lambda self, other: self.k == other.k,
        "__hash__": lambda self: hash(self.k),
    },
)


def count_distinct_keys(pairs):
    return len({Key(k) for k, _ in pairs})
