# ruff: noqa (model-written style, kept as is)
# entry: unique_versions
# case: (["1.0", "1.0.0", "2.1", "2.1.0.0"],) -> 2
class Version:
    def __init__(self, text):
        parts = [int(p) for p in text.split(".")]
        while parts and parts[-1] == 0:
            parts.pop()
        self.parts = tuple(parts)

    def __eq__(self, other):
        return isinstance(other, Version) and self.parts == other.parts

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(self.parts)


def unique_versions(texts):
    return len({Version(t) for t in texts})
