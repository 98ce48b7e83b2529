# ruff: noqa (model-written style, kept as is)
# entry: add_all
# case: ([1, 2, 3],) -> 6
# case: ([],) -> 0
def add_all(xs):
    total = 0
    for x in xs:
        total += x
    return total


def main():
    assert add_all([1, 2]) == 3
    print("All tests passed!")


if __name__ == "__main__":
    main()
