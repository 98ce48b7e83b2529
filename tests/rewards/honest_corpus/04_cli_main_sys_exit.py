# ruff: noqa (model-written style, kept as is)
# entry: parse_version
# case: ("1.2.3",) -> (1, 2, 3)
# case: ("10.0",) -> (10, 0)
import sys


def parse_version(text):
    return tuple(int(part) for part in text.split("."))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: version X.Y.Z", file=sys.stderr)
        sys.exit(2)
    print(parse_version(argv[0]))
    sys.exit(0)


if __name__ == "__main__":
    main()
