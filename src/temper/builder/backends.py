"""A run's rollout backend from ``orchestrator.backend``: the engine here (``local``), or
rollout workers in processes (``process``) or Ray actors (``ray``) that build the same
engine and rollout source themselves, with `build_worker_parts`."""

from __future__ import annotations

from pathlib import Path

from temper.backends.base import RolloutBackend, Rollouts
from temper.backends.local import LocalBackend
from temper.builder.engines import build_engine, check_response_fits, run_response_limits
from temper.builder.model import RunModel
from temper.builder.rollouts import build_renderer, build_rollouts, build_worker_parts
from temper.builder.tasks import RunTasks
from temper.config import Config


def build_backend(
    cfg: Config, model: RunModel, tasks: RunTasks, run_dir: Path | None = None
) -> RolloutBackend:
    """The run's rollout backend, started and ready. Its engines start from
    ``model.weights`` (the base model or the checkpoint being resumed); worker pid
    files go to ``run_dir/workers``. A response limit longer than the engine's context
    is refused here (`check_response_fits`)."""
    if cfg.orchestrator.backend == "local":
        engine = build_engine(cfg, model)
        check_response_fits(run_response_limits(cfg), engine.max_context)
        return LocalBackend(engine, build_rollouts(cfg, engine, model, tasks))
    # The reward and the engines live in the workers only; the pool's source is put in
    # when the backend starts. A single-turn run keeps a renderer to check prompt lengths.
    renderer = build_renderer(cfg, model.with_images(None)) if tasks.env_spec is None else None
    rollouts = Rollouts(None, tasks.train, tasks.heldout, None, renderer, tasks.env_spec)  # type: ignore[arg-type]
    if cfg.orchestrator.backend == "ray":
        from temper.backends.ray_backend import start_ray_backend

        backend = start_ray_backend(cfg, model.weights, rollouts, build_worker_parts)
    else:
        from temper.backends.remote import RemoteBackend

        backend = RemoteBackend.start(cfg, model.weights, rollouts, build_worker_parts, run_dir)
    # The workers report their engines' context once started; they stop at exit.
    check_response_fits(run_response_limits(cfg), backend.max_context)
    return backend
