# ruff: noqa (model-written style, kept as is)
# entry: count_vowels
# case: ("hello",) -> 2
# case: ("xyz",) -> 0
def count_vowels(text, debug=False):
    n = sum(1 for c in text.lower() if c in "aeiou")
    if debug:
        print("ok", n)
    return n
