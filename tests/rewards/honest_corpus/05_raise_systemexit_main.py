# ruff: noqa (model-written style, kept as is)
# entry: gcd
# case: (12, 18) -> 6
# case: (7, 0) -> 7
def gcd(a, b):
    while b:
        a, b = b, a % b
    return abs(a)


def _cli():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("a", type=int)
    parser.add_argument("b", type=int)
    args = parser.parse_args()
    print(gcd(args.a, args.b))
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli())
