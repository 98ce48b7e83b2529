"""A run's rollout source from its config: single-turn prompts scored by the `[reward]`, or
episodes of the `[env]`; and the engine + source a rollout worker builds for itself."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

from temper.agents.programs import AgentProgram, CommandAgent, FunctionAgent
from temper.agents.rollouts import AgentRollouts
from temper.backends.base import Rollouts
from temper.builder.engines import build_engine
from temper.builder.model import RunModel, load_run_model
from temper.builder.rewards import build_reward
from temper.builder.tasks import RunTasks, build_run_tasks
from temper.config import Config
from temper.config.agent import AgentConfig
from temper.engine.base import Engine
from temper.errors import ConfigError
from temper.rollout.single_turn import PromptRenderer
from temper.rollout.sources import EpisodeRollouts, SingleTurnRollouts
from temper.targets import load_target
from temper.vision.prompting import PromptImages


def build_renderer(cfg: Config, model: RunModel) -> PromptRenderer:
    """How a single-turn run turns a task into prompt ids (and keeps its images)."""
    return PromptRenderer(model.tokenizer, cfg.data.system_prompt, model.vision, model.images)


def build_rollouts(cfg: Config, engine: Engine, model: RunModel, tasks: RunTasks) -> Rollouts:
    """Single-turn prompts (no env) or episodes of the configured env, on ``engine``.

    Images the prompts show go to ``model.images`` (a training run's store; None
    keeps none: eval, serving).
    """
    if cfg.agent.enabled:
        return build_agent_rollouts(cfg, engine, model, tasks)
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


def build_agent_program(cfg: AgentConfig) -> AgentProgram:
    """The `[agent]`: a function (imported here, so a bad name fails at start) or a command."""
    if cfg.function is not None:
        fn = load_target(cfg.function, "agent.function")
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(
                f"agent.function {cfg.function!r} must be an async function "
                "agent(client, task) -> reward | None"
            )
        return FunctionAgent(fn, cfg.function, cfg.api_key)
    if shutil.which(cfg.command[0]) is None and not Path(cfg.command[0]).is_file():
        raise ConfigError(f"agent.command: {cfg.command[0]!r} is not a program on PATH or a file")
    return CommandAgent(cfg.command, cfg.api_key)


def build_agent_rollouts(cfg: Config, engine: Engine, model: RunModel, tasks: RunTasks) -> Rollouts:
    """Episodes played by the user's agent through the rollout gateway; tasks from the
    env (not played) or the data; scored by the agent, or by `[reward]`."""
    a = cfg.agent
    reward = build_reward(cfg.reward, model.tokenizer)
    source = AgentRollouts(
        engine,
        model.tokenizer,
        build_agent_program(a),
        cfg.env.limits,
        reward,
        max_concurrency=a.max_concurrency,
        splice=a.splice,
        on_error=a.on_error,
        model_name=a.model_name,
    )
    return Rollouts(
        source, tasks.train, tasks.heldout, reward, None, tasks.env_spec, source.close_now
    )


def build_worker_parts(cfg: Config, weights: str) -> tuple[Engine, Rollouts]:
    """What a rollout worker holds (`temper.backends.worker.RolloutWorker`): the engine and
    rollout source a local run would build, from ``weights`` (the base model or the
    checkpoint the run resumed), keeping images in the run's store. The backends get
    this function from `temper.builder.backends` rather than importing the builder."""
    model = load_run_model(cfg, weights, images=True)
    engine = build_engine(cfg, model)
    return engine, build_rollouts(cfg, engine, model, build_run_tasks(cfg))
