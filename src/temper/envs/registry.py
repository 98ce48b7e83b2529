"""Environment specs: how a run gets its env, and (optionally) its tasks; the built-in envs.

A run names its environment with ``env.type`` in the config: a built-in name
(`BUILTIN_ENVS`) or ``"module:function"`` / ``"path/to/file.py:function"``.
Either way the target is a *spec factory*, ``factory(options, seed) ->
EnvSpec``, called once per run with ``env.options`` (a dict from the config)
and the run seed. The spec says how to make a fresh env for one episode and,
for envs that generate their own problems, which tasks to train and evaluate
on; a spec without tasks uses the run's ``data`` section.

The builder calls the factory (`temper.builder.tasks.build_env_spec`); this
module does not run episodes either (see `temper.rollout.multi_turn`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temper.data.sampler import TaskSampler
from temper.envs.base import Env
from temper.records import Task

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
    "openenv": "temper.envs.openenv_client:openenv_spec",
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
