# ruff: noqa (model-written style, kept as is)
# entry: digital_root
# case: (942,) -> 6
# case: (0,) -> 0
import sys


def digital_root(n):
    while n >= 10:
        n = sum(int(c) for c in str(n))
    return n


def main():
    cases = {942: 6, 0: 0, 99: 9}
    bad = [k for k, v in cases.items() if digital_root(k) != v]
    if bad:
        print("FAILED:", bad)
        sys.exit(1)
    print("All tests passed")
    sys.exit(0)


if __name__ == "__main__":
    main()
