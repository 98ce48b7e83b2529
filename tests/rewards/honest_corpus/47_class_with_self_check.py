# ruff: noqa (model-written style, kept as is)
# entry: stack_ops
# case: (["push 1", "push 2", "pop", "push 3"],) -> [1, 3]
class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)

    def pop(self):
        return self.items.pop()

    @staticmethod
    def self_check():
        s = Stack()
        s.push(1)
        assert s.pop() == 1
        print("Stack: all tests passed")


def stack_ops(ops):
    s = Stack()
    for op in ops:
        if op.startswith("push"):
            s.push(int(op.split()[1]))
        else:
            s.pop()
    return s.items
