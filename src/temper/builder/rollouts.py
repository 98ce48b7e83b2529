"""A run's rollout source from its config: single-turn prompts scored by the `[reward]`, or
episodes of the `[env]`; and the engine + source a rollout worker builds for itself."""

from __future__ import annotations

from temper.backends.base import Rollouts
from temper.builder.engines import build_engine
from temper.builder.model import RunModel, load_run_model
from temper.builder.rewards import build_reward
from temper.builder.tasks import RunTasks, build_run_tasks
from temper.config import Config
from temper.engine.base import Engine
from temper.rollout.single_turn import PromptRenderer
from temper.rollout.sources import EpisodeRollouts, SingleTurnRollouts
from temper.vision.prompting import PromptImages


def build_renderer(cfg: Config, model: RunModel) -> PromptRenderer:
    """How a single-turn run turns a task into prompt ids (and keeps its images)."""
    return PromptRenderer(model.tokenizer, cfg.data.system_prompt, model.vision, model.images)


def build_rollouts(cfg: Config, engine: Engine, model: RunModel, tasks: RunTasks) -> Rollouts:
    """Single-turn prompts (no env) or episodes of the configured env, on ``engine``.

    Images the prompts show go to ``model.images`` (a training run's store; None
    keeps none: eval, serving).
    """
    if tasks.env_spec is None:
        reward = build_reward(cfg.reward, model.tokenizer)
        renderer = build_renderer(cfg, model)
        source = SingleTurnRollouts(engine, renderer, reward)
        return Rollouts(source, tasks.train, tasks.heldout, reward, renderer)
    reward = build_reward(cfg.reward, model.tokenizer) if cfg.env.add_reward else None
    images = PromptImages(model.vision, model.images) if model.vision is not None else None
    source = EpisodeRollouts(
        engine,
        tasks.env_spec,
        model.tokenizer,
        cfg.env.limits,
        reward,
        cfg.env.max_concurrency,
        images,
        cfg.env.infra_retries,
    )
    return Rollouts(source, tasks.train, tasks.heldout, reward, None, tasks.env_spec)


def build_worker_parts(cfg: Config, weights: str) -> tuple[Engine, Rollouts]:
    """What a rollout worker holds (`temper.backends.worker.RolloutWorker`): the engine and
    rollout source a local run would build, from ``weights`` (the base model or the
    checkpoint the run resumed), keeping images in the run's store. The backends get
    this function from `temper.builder.backends` rather than importing the builder."""
    model = load_run_model(cfg, weights, images=True)
    engine = build_engine(cfg, model)
    return engine, build_rollouts(cfg, engine, model, build_run_tasks(cfg))
