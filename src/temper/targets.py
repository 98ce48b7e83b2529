"""Loading the user's own code named in config: ``"package.module:function"`` or
``"path/to/file.py:function"`` (reward functions, sampler weightings, env spec
factories). One loader, so every such key accepts the same forms and fails the same
way: a `ConfigError` of one line that names the key and what is wrong.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temper.errors import ConfigError


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def load_target(spec: str, what: str) -> Callable[..., Any]:
    """Import a function from `"package.module:function"` or `"path/to/file.py:function"`.

    The part after the colon may be dotted (`module:Class.method`). Raises a
    ConfigError naming the spec when the module or file cannot be imported, the
    attribute is missing, or it is not callable; ``what`` names the function's role in it.
    """
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(
            f"{what} {spec!r} must look like 'package.module:function' "
            "or 'path/to/file.py:function'"
        )
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        module = _import_file(Path(module_part), spec, what)
    else:
        try:
            module = importlib.import_module(module_part)
        except Exception as exc:
            raise ConfigError(
                f"cannot import module {module_part!r} for {what} {spec!r}: {_one_line(exc)}"
            ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: {module_part!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{what} {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def _import_file(path: Path, spec: str, what: str) -> Any:
    """Import a Python file as a module (registered in sys.modules under a unique name)."""
    if not path.is_file():
        raise ConfigError(f"{what} {spec!r}: file {str(path)!r} not found")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    name = f"_temper_target_{resolved.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{what} {spec!r}: cannot load {str(path)!r} as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"{what} {spec!r}: importing {str(path)!r} failed: {_one_line(exc)}"
        ) from exc
    return module
