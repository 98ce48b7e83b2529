# ruff: noqa (model-written style, kept as is)
# entry: is_palindrome
# case: ("racecar",) -> True
# case: ("ab",) -> False
# case: ("",) -> True
DEBUG = False


def is_palindrome(s):
    result = s == s[::-1]
    if DEBUG:
        print("ok")
    return result
