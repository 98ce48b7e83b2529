# ruff: noqa (model-written style, kept as is)
# entry: first_exit
# case: ([["door", 0], ["exit", 3], ["exit", 1]],) -> 3
def first_exit(rooms):
    exits = [pos for name, pos in rooms if name == "exit"]
    exit = exits[0] if exits else -1
    return exit
