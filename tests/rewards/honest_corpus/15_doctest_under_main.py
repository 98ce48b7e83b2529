# ruff: noqa (model-written style, kept as is)
# entry: reverse_words
# case: ("hello big world",) -> "world big hello"
def reverse_words(s):
    """Reverse the order of words.

    >>> reverse_words("a b c")
    'c b a'
    """
    return " ".join(reversed(s.split()))


if __name__ == "__main__":
    import doctest

    failures, _ = doctest.testmod()
    print("ok" if not failures else "FAILED")
