# ruff: noqa (model-written style, kept as is)
# entry: group_anagrams_count
# case: (["eat", "tea", "tan", "ate", "nat", "bat"],) -> 3
class Signature:
    __slots__ = ("key",)

    def __init__(self, word):
        self.key = "".join(sorted(word))

    def __eq__(self, other):
        if type(other) is not Signature:
            return NotImplemented
        return self.key == other.key

    def __hash__(self):
        return hash(self.key)


def group_anagrams_count(words):
    return len({Signature(w) for w in words})
