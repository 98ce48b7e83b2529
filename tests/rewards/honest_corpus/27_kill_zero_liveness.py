# ruff: noqa (model-written style, kept as is)
# entry: process_alive
# case: () -> True
import os


def process_alive():
    try:
        os.kill(os.getpid(), 0)  # signal 0: only checks that the process exists
    except OSError:
        return False
    return True
