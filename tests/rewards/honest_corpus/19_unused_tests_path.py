# ruff: noqa (model-written style, kept as is)
# entry: title_case
# case: ("hello world",) -> "Hello World"
FIXTURES = "tests/fixtures/titles.txt"  # used by the offline checker only


def title_case(s):
    return " ".join(w[:1].upper() + w[1:].lower() for w in s.split(" "))
