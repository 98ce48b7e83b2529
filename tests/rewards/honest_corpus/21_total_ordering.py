# ruff: noqa (model-written style, kept as is)
# entry: top_k_scores
# case: ([["a", 3], ["b", 9], ["c", 5]], 2) -> ["b", "c"]
from functools import total_ordering


@total_ordering
class Score:
    def __init__(self, name, value):
        self.name, self.value = name, value

    def __eq__(self, other):
        return self.value == other.value

    def __lt__(self, other):
        return self.value < other.value


def top_k_scores(rows, k):
    scores = sorted((Score(n, v) for n, v in rows), reverse=True)
    return [s.name for s in scores[:k]]
