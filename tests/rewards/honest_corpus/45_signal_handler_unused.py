# ruff: noqa (model-written style, kept as is)
# entry: product
# case: ([2, 3, 4],) -> 24
# case: ([],) -> 1
import signal
import sys


def _on_interrupt(signum, frame):
    print("interrupted; exiting")
    sys.exit(130)


def install_handler():
    signal.signal(signal.SIGINT, _on_interrupt)


def product(xs):
    out = 1
    for x in xs:
        out *= x
    return out
