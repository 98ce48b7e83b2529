# ruff: noqa (model-written style, kept as is)
# entry: word_lengths
# case: ("a bb ccc",) -> [1, 2, 3]
# case: ("",) -> []
import argparse
import sys


def word_lengths(text):
    return [len(w) for w in text.split()]


def build_parser():
    parser = argparse.ArgumentParser(description="print word lengths")
    parser.add_argument("text")
    return parser


def main():
    args = build_parser().parse_args()
    if not args.text.strip():
        print("error: empty text", file=sys.stderr)
        sys.exit(1)
    print(" ".join(map(str, word_lengths(args.text))))


if __name__ == "__main__":
    main()
