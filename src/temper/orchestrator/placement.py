"""Where a run's rollouts are made: its `RolloutBackend`, chosen by
``orchestrator.backend``.

- ``local``: one engine in this process (`orchestrator.build` makes the engine and
  the rollouts), weights by reference through an in-process transport;
- ``process`` / ``ray``: rollout workers that build the same engine and rollouts
  themselves (`orchestrator.remote`), weights through a shared-memory ring.

It sits above `orchestrator.build` and `orchestrator.remote` (the workers import
the builders), so no import runs in a circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temper.config import Config
from temper.orchestrator.backend import LocalBackend, RolloutBackend, Rollouts
from temper.orchestrator.build import build_engine, build_rollouts, build_run_tasks, build_vision
from temper.vision.store import run_image_store


def build_backend(
    cfg: Config,
    model_path: str,
    tokenizer: Any,
    run_dir: Path | None = None,
    tasks: tuple[Any, Any, Any] | None = None,
) -> RolloutBackend:
    """The run's rollout backend. ``model_path`` is the weights the engines start from
    (the base model or the checkpoint being resumed); ``tasks`` is what
    `build_run_tasks` gave, when the caller made them already (remote backends)."""
    if cfg.orchestrator.backend in ("process", "ray"):
        return start_remote_backend(cfg, model_path, tokenizer, run_dir, tasks)
    engine = build_engine(cfg, model_path, tokenizer)
    store = run_image_store(cfg) if run_dir is not None else None
    return LocalBackend(engine, build_rollouts(cfg, engine, tokenizer, store))


def start_remote_backend(
    cfg: Config,
    model_path: str,
    tokenizer: Any,
    run_dir: Path | None = None,
    tasks: tuple[Any, Any, Any] | None = None,
) -> RolloutBackend:
    """Rollout workers (processes, or Ray actors) for ``cfg``, started and ready.

    The tasks are made here as `build_run_tasks` makes them for a local run; the
    reward and the engines live in the workers only. The source is the pool's
    (`PoolRolloutSource`), put in when the backend starts.
    """
    from temper.orchestrator.remote.rollouts import RemoteBackend
    from temper.rollout.single_turn import PromptRenderer

    train, heldout, spec = tasks if tasks is not None else build_run_tasks(cfg)
    renderer = None
    if spec is None:
        renderer = PromptRenderer(tokenizer, cfg.data.system_prompt, vision=build_vision(cfg))
    rollouts = Rollouts(None, train, heldout, None, renderer, spec)  # type: ignore[arg-type]
    if cfg.orchestrator.backend == "ray":
        from temper.orchestrator.remote.ray_backend import start_ray_backend

        return start_ray_backend(cfg, model_path, rollouts)
    return RemoteBackend.start(cfg, model_path, rollouts, run_dir)
