"""Environment specs: how a run gets its env, and (optionally) its tasks.

A run names its environment with ``env.type`` in the config: a built-in name
(`BUILTIN_ENVS`) or ``"module:function"`` / ``"path/to/file.py:function"``.
Either way the target is a *spec factory*, ``factory(options, seed) ->
EnvSpec``, called once per run with ``env.options`` (a dict from the config)
and the run seed. The spec says how to make a fresh env for one episode and,
for envs that generate their own problems, which tasks to train and evaluate
on; a spec without tasks uses the run's ``data`` section.

This module does not run episodes (see `temper.rollout.multi_turn`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.data.base import Task
from temper.data.sampler import TaskSampler
from temper.envs.base import Env
from temper.errors import ConfigError

#: Built-in env names and their spec factories.
BUILTIN_ENVS: dict[str, str] = {
    "tool_use": "temper.envs.tool_use:spec",
    "code": "temper.envs.code:spec",
    "guess_number": "temper.envs.games:guess_number_spec",
    "wordle": "temper.envs.games:wordle_spec",
    "gym": "temper.envs.gym_adapter:spec",
    "miniwob": "temper.envs.browser_env:spec",
    "visual_grid": "temper.envs.visual_grid:visual_grid_spec",
    "arithmetic_chain": "temper.envs.chain:chain_spec",
}


@dataclass
class EnvSpec:
    """What a run needs from an environment.

    ``make_env(task)`` returns a fresh env for one episode (the rollout loop
    closes it). ``train`` / ``heldout`` are the env's own tasks, or None to
    use the run's ``data`` section. ``close`` (optional) frees what the spec
    shares across episodes (e.g. a sandbox pool) at the end of the run.
    """

    make_env: Callable[[Task], Env]
    train: TaskSampler | None = None
    heldout: list[Task] | None = None
    name: str = ""
    close: Callable[[], None] | None = None


SpecFactory = Callable[[dict[str, Any], int], EnvSpec]


def _load_target(target: str) -> Any:
    """The object named by ``"module:attr"`` or ``"path/file.py:attr"``."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"env.type must be one of {', '.join(sorted(BUILTIN_ENVS))} or "
            f'"module:function" / "file.py:function", got {target!r}'
        )
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ConfigError(f"env.type: file {module_name} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"_temper_env_{path.stem}", path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"env.type: cannot import {module_name}: {exc}") from exc
    if not hasattr(module, attr):
        raise ConfigError(f"env.type: {module_name} has no attribute {attr!r}")
    return getattr(module, attr)


def build_env_spec(kind: str, options: dict[str, Any], seed: int) -> EnvSpec:
    """The `EnvSpec` of env ``kind`` (a built-in name or a target) with ``options``."""
    factory: SpecFactory = _load_target(BUILTIN_ENVS.get(kind, kind))
    try:
        spec = factory(dict(options), seed)
    except TypeError as exc:
        raise ConfigError(f"env.options do not fit env {kind!r}: {exc}") from exc
    if not isinstance(spec, EnvSpec):
        raise ConfigError(f"env {kind!r}: the factory returned {type(spec).__name__}, not EnvSpec")
    spec.name = spec.name or kind
    return spec
