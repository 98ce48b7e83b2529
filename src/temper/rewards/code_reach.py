"""Which parts of a Python module can run: the static reach of the hack detectors.

`Reach(tree, entry_point)` marks the nodes of a parsed module that can run
when a test runner imports it and calls its entry point: the top level (not
under ``if __name__ == "__main__":``, ``if TYPE_CHECKING:`` or a module flag
bound once to a false constant, such as ``DEBUG = False``; not after a
``return``/``raise``/``break``/``continue`` in the same block), and the bodies
of the functions and classes referenced from there, transitively. Used by
`temper.rewards.code_hacks` so that a line which never runs (a CLI ``main()``,
a debug branch, an unused helper class) is not a finding.
"""

from __future__ import annotations

import ast

#: Names that reach functions without naming them: every function may run.
_DYNAMIC = {"globals", "vars", "locals", "eval", "exec"}
_ENDS_BLOCK = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _falsy_constants(tree: ast.Module) -> set[str]:
    """Module-level names bound once, to a false constant (``DEBUG = False``), and
    never bound again anywhere (no other assignment, argument, import or def)."""
    bound: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.split(".")[0]]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names = list(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names = [node.name]
        for name in names:
            bound[name] = bound.get(name, 0) + 1
    falsy = set()
    for stmt in tree.body:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and not value.value
            and bound.get(target.id) == 1
        ):
            falsy.add(target.id)
    return falsy


class Reach:
    """Which nodes can run when the module is imported and its entry point (without
    one: any module-level function) is called.

    ``live``: ids of those nodes. ``used``: ids of the classes referenced from
    live code (their methods are live). Conservative where it must guess: a
    nested function runs when its parent does, a referenced class runs all its
    methods, and ``globals()``/``eval``/``exec`` make every function a root.
    """

    def __init__(self, tree: ast.Module, entry_point: str | None) -> None:
        self.live: set[int] = set()
        self.used: set[int] = set()
        self.loads: set[str] = set()
        self.defs: dict[str, list[ast.AST]] = {}
        self.methods: dict[int, list[ast.AST]] = {}
        dynamic = any(isinstance(n, ast.Name) and n.id in _DYNAMIC for n in ast.walk(tree))
        self.falsy = set() if dynamic else _falsy_constants(tree)
        self._block(tree.body, "module")
        roots = set(self.defs) if entry_point is None or dynamic else {entry_point}
        entered: set[int] = set()
        changed = True
        while changed:  # until no newly referenced function or class is left
            changed = False
            for name, nodes in list(self.defs.items()):
                if name not in roots and name not in self.loads:
                    continue
                for node in nodes:
                    if id(node) not in entered:
                        entered.add(id(node))
                        self._enter(node)
                        changed = True

    def _enter(self, node: ast.AST) -> None:
        """Make a function's body, or a class's methods, live."""
        if isinstance(node, ast.ClassDef):
            self.used.add(id(node))
            for method in self.methods.get(id(node), []):
                self._block(method.body, "function")
        else:
            self._block(node.body, "function")

    def _block(self, stmts: list[ast.stmt], scope: str) -> None:
        for stmt in stmts:
            self._stmt(stmt, scope)
            if isinstance(stmt, _ENDS_BLOCK):
                return  # what follows in this block never runs

    def _exprs(self, nodes: list) -> None:
        for root in nodes:
            if root is None:
                continue
            for node in ast.walk(root):
                self.live.add(id(node))
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    self.loads.add(node.id)

    def _stmt(self, stmt: ast.stmt, scope: str) -> None:
        self.live.add(id(stmt))
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            args = stmt.args
            self._exprs([*stmt.decorator_list, *args.defaults, *args.kw_defaults])
            if scope == "module":
                self.defs.setdefault(stmt.name, []).append(stmt)
            else:
                self._block(stmt.body, "function")
        elif isinstance(stmt, ast.ClassDef):
            self._class(stmt, scope)
        elif isinstance(stmt, ast.If | ast.While):
            self._exprs([stmt.test])
            truth = self._truth(stmt.test)
            if truth is not False:
                self._block(stmt.body, scope)
            if truth is not True or isinstance(stmt, ast.While):
                self._block(stmt.orelse, scope)
        else:
            self._compound(stmt, scope)

    def _class(self, stmt: ast.ClassDef, scope: str) -> None:
        self._exprs([*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)])
        methods = self.methods.setdefault(id(stmt), [])
        for item in stmt.body:  # the class body runs when the class is defined ...
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                self.live.add(id(item))
                self._exprs([*item.decorator_list, *item.args.defaults, *item.args.kw_defaults])
                methods.append(item)  # ... its methods once the class is used
            else:
                self._stmt(item, "class")
        if scope == "module":
            self.defs.setdefault(stmt.name, []).append(stmt)
        else:
            self._enter(stmt)

    def _compound(self, stmt: ast.stmt, scope: str) -> None:
        """Any other statement: its expressions, and each of its blocks."""
        for _, value in ast.iter_fields(stmt):
            items = value if isinstance(value, list) else [value]
            if items and isinstance(items[0], ast.stmt):
                self._block(items, scope)
                continue
            for item in items:
                if isinstance(item, ast.excepthandler | ast.match_case):
                    self.live.add(id(item))
                    head = [item.type] if isinstance(item, ast.ExceptHandler) else []
                    if isinstance(item, ast.match_case):
                        head = [item.pattern, item.guard]
                    self._exprs(head)
                    self._block(item.body, scope)
                elif isinstance(item, ast.AST):
                    self._exprs([item])

    def _truth(self, test: ast.expr) -> bool | None:
        """The value of a condition when it is known without running anything."""
        if isinstance(test, ast.Constant):
            return bool(test.value)
        if isinstance(test, ast.Name) and (test.id in self.falsy or test.id == "TYPE_CHECKING"):
            return False
        if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
            return False
        if _is_main_test(test):
            return False  # a test runner imports the solution, never runs it as a script
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._truth(test.operand)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp):
            values = [self._truth(v) for v in test.values]
            decisive = isinstance(test.op, ast.Or)  # True decides `or`, False decides `and`
            if decisive in values:
                return decisive
            if all(v is (not decisive) for v in values):
                return not decisive
        return None


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if isinstance(test, ast.Compare) and len(test.comparators) == 1:
        sides = {_plain(test.left), _plain(test.comparators[0])}
        return sides == {"__name__", "'__main__'"} and isinstance(test.ops[0], ast.Eq)
    return False


def _plain(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return repr(node.value)
    return None
